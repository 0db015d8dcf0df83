// Properties every placer's Placement must have: checkPlacement, no better
// than the brute-force optimum on small random DAGs (the gap is printed),
// and, under memory limits, a simulated peak within each device's capacity.
#include "passes/place/placement.h"

#include <gtest/gtest.h>

#include <cstdio>
#include <functional>
#include <map>
#include <random>
#include <set>

#include "ir/error.h"
#include "ir/verifier.h"
#include "passes/lower/lower.h"
#include "passes/lower/simulate.h"
#include "passes/place/place_metf.h"
#include "passes/place/place_msct.h"
#include "passes/place/place_mtopo.h"
#include "tests/passes/test_graphs.h"

namespace modelpar::passes {
namespace {

using testing::machine;

struct Placer {
  const char* name;
  std::function<Placement(const ir::Graph&, const TaskGraph&, const DeviceModel&)> place;
};

std::vector<Placer> placers() {
  return {
      {"m-topo", [](const ir::Graph& g, const TaskGraph& tg, const DeviceModel& m) { return placeMTopo(g, tg, m); }},
      {"m-etf", [](const ir::Graph& g, const TaskGraph& tg, const DeviceModel& m) { return placeMEtf(g, tg, m); }},
      {"m-sct", [](const ir::Graph& g, const TaskGraph& tg, const DeviceModel& m) { return placeMSct(g, tg, m); }},
  };
}

double simulatedStep(const ir::Graph& g, const Placement& p, const DeviceModel& m) {
  LowerOptions o;
  o.emit_frees = false;  // frees take no time
  return simulate(lower(g, p, o), m).step_time_us;
}

// Every topological order of the graph's nodes (capped).
void linearExtensions(const ir::Graph& g, std::vector<std::vector<ir::NodeId>>& out, size_t cap) {
  size_t n = g.numNodes();
  std::vector<int> indeg(n, 0);
  std::vector<std::vector<ir::NodeId>> succ(n);
  for (size_t v = 0; v < n; ++v) {
    std::set<ir::NodeId> preds;
    for (ir::ValueId in : g.nodes()[v].inputs()) {
      if (g.value(in).producer != ir::kNoId) preds.insert(g.value(in).producer);
    }
    for (ir::NodeId u : preds) {
      succ[static_cast<size_t>(u)].push_back(static_cast<ir::NodeId>(v));
      ++indeg[v];
    }
  }
  std::vector<ir::NodeId> cur;
  std::function<void()> rec = [&] {
    if (out.size() >= cap) return;
    if (cur.size() == n) {
      out.push_back(cur);
      return;
    }
    for (size_t v = 0; v < n; ++v) {
      if (indeg[v] != 0) continue;
      indeg[v] = -1;
      for (ir::NodeId s : succ[v]) --indeg[static_cast<size_t>(s)];
      cur.push_back(static_cast<ir::NodeId>(v));
      rec();
      cur.pop_back();
      for (ir::NodeId s : succ[v]) ++indeg[static_cast<size_t>(s)];
      indeg[v] = 0;
    }
  };
  rec();
}

// The best simulated step over every device assignment (devices are
// interchangeable: canonical labelling) and every per-device order that
// comes from a topological order.
double bruteForceOptimum(const ir::Graph& g, int devices, const DeviceModel& m,
                         const std::vector<std::vector<ir::NodeId>>& orders) {
  size_t n = g.numNodes();
  double best = std::numeric_limits<double>::infinity();
  std::vector<int32_t> assign(n, 0);
  std::function<void(size_t, int)> rec = [&](size_t i, int used) {
    if (i == n) {
      std::set<std::vector<ir::NodeId>> seen;
      for (const auto& order : orders) {
        Placement p;
        p.num_devices = devices;
        p.node_device = assign;
        p.order.assign(static_cast<size_t>(devices), {});
        std::vector<ir::NodeId> key;
        for (int d = 0; d < devices; ++d) {
          for (ir::NodeId v : order) {
            if (assign[static_cast<size_t>(v)] == d) p.order[static_cast<size_t>(d)].push_back(v);
          }
          key.insert(key.end(), p.order[static_cast<size_t>(d)].begin(), p.order[static_cast<size_t>(d)].end());
          key.push_back(-1);
        }
        if (!seen.insert(key).second) continue;
        best = std::min(best, simulatedStep(g, p, m));
      }
      return;
    }
    for (int d = 0; d <= std::min(used, devices - 1); ++d) {
      assign[i] = d;
      rec(i + 1, std::max(used, d + 1));
    }
  };
  rec(0, 0);
  return best;
}

TEST(Placement, PlacersAreNeverBetterThanTheBruteForceOptimum) {
  std::mt19937 rng(2024);
  // Transfers of up to 1 KiB at 64 B/us: 2..18 us, comparable to the 1..20 us tasks.
  std::map<std::string, std::vector<double>> gaps;
  int graphs = 0;
  for (int trial = 0; graphs < 24 && trial < 200; ++trial) {
    int devices = 2 + trial % 2;
    int n = devices == 2 ? 9 : 7;
    ir::Graph g = testing::randomDag(rng, n, 0.45, 1024);
    std::vector<std::vector<ir::NodeId>> orders;
    linearExtensions(g, orders, 400);
    if (orders.size() >= 400) continue;  // too many orders for a unit test
    ++graphs;
    DeviceModel m = machine(devices, int64_t{1} << 40, 2.0, 64.0);
    double opt = bruteForceOptimum(g, devices, m, orders);
    TaskGraph tg = buildTaskGraph(g);
    for (const Placer& pl : placers()) {
      double t = simulatedStep(g, pl.place(g, tg, m), m);
      EXPECT_GE(t, opt - 1e-9) << pl.name << " beat the optimum: simulator or search bug";
      gaps[pl.name].push_back(t / opt - 1.0);
    }
  }
  EXPECT_GE(graphs, 20);
  for (const auto& [name, g] : gaps) {
    double mean = 0, worst = 0;
    for (double x : g) {
      mean += x;
      worst = std::max(worst, x);
    }
    std::printf("[ gap      ] %-6s over %zu graphs: mean %.1f%%, worst %.1f%% above optimum\n",
                name.c_str(), g.size(), 100 * mean / static_cast<double>(g.size()), 100 * worst);
  }
}

TEST(Placement, SimulatedPeakStaysWithinCapacity) {
  std::mt19937 rng(99);
  int placed = 0, refused = 0;
  for (int trial = 0; trial < 60; ++trial) {
    int devices = 2 + trial % 3;
    ir::Graph g = testing::randomDag(rng, 40, 0.1, 64 * 1024);
    // Layers with parameters: nodes of a layer must share a device.
    std::uniform_int_distribution<int> layer(0, 9);
    std::uniform_int_distribution<int64_t> persist(0, 32 * 1024);
    for (size_t i = 0; i < g.numNodes(); ++i) {
      int l = layer(rng);
      auto& node = g.node(static_cast<ir::NodeId>(i));
      if (l > 0) node.layer = "layer" + std::to_string(l);
      node.cost->persistent_bytes = persist(rng);
      node.cost->temp_bytes = persist(rng) / 4;
    }
    int64_t total = 0;
    for (const ir::Node& n : g.nodes()) total += n.cost->output_bytes + n.cost->persistent_bytes;
    std::uniform_real_distribution<double> frac(0.4, 2.0);
    int64_t capacity = static_cast<int64_t>(frac(rng) * static_cast<double>(total) / devices) + 64 * 1024;
    DeviceModel m = machine(devices, capacity, 2.0, 1024.0);
    Coarsening units = coarsen(g);
    for (const Coarsening* u : std::vector<const Coarsening*>{nullptr, &units}) {
      TaskGraph tg = buildTaskGraph(g, u);
      for (const Placer& pl : placers()) {
        Placement p;
        try {
          p = pl.place(g, tg, m);
        } catch (const PlanDoesNotFitError& e) {
          ++refused;
          EXPECT_NE(std::string(e.what()).find("use more devices or enable checkpointing"),
                    std::string::npos);
          continue;
        }
        ++placed;
        ASSERT_NO_THROW(checkPlacement(g, p));
        ir::Program prog = lower(g, p);
        ASSERT_NO_THROW(ir::verify(prog)) << pl.name;
        SimulationReport r = simulate(prog, m);
        for (int d = 0; d < devices; ++d) {
          EXPECT_LE(r.devices[static_cast<size_t>(d)].peak_bytes, capacity) << pl.name << " device " << d;
          EXPECT_LE(r.devices[static_cast<size_t>(d)].peak_bytes, p.peak_bytes[static_cast<size_t>(d)])
              << pl.name << " device " << d;
        }
        // Colocation: every node of a layer on one device.
        std::map<std::string, int> layer_device;
        for (size_t i = 0; i < g.numNodes(); ++i) {
          const std::string& l = g.nodes()[i].layer;
          if (l.empty()) continue;
          auto [it, inserted] = layer_device.emplace(l, p.node_device[i]);
          EXPECT_EQ(it->second, p.node_device[i]) << pl.name << " split layer " << l;
        }
      }
    }
  }
  std::printf("[ memory   ] %d plans within capacity, %d refused as not fitting\n", placed, refused);
  EXPECT_GT(placed, 100);
  EXPECT_GT(refused, 0);
}

TEST(CheckPlacement, NamesWhatIsWrong) {
  std::mt19937 rng(1);
  ir::Graph g = testing::randomDag(rng, 4, 1.0, 64);  // a chain-like DAG t0 -> t1 -> ...
  Placement p = placeMEtf(g, machine(2));
  Placement bad = p;
  bad.node_device[0] = 1 - bad.node_device[0];
  EXPECT_THROW(checkPlacement(g, bad), ConfigError);
  bad = p;
  bad.order.push_back({});
  EXPECT_THROW(checkPlacement(g, bad), ConfigError);
  bad = p;
  bad.order[static_cast<size_t>(bad.node_device[1])].push_back(1);
  try {
    checkPlacement(g, bad);
    FAIL();
  } catch (const ConfigError& e) {
    EXPECT_NE(std::string(e.what()).find("%t1 is ordered twice"), std::string::npos) << e.what();
  }
  bad = p;
  bad.order[0].push_back(42);
  try {
    checkPlacement(g, bad);
    FAIL();
  } catch (const ConfigError& e) {
    EXPECT_NE(std::string(e.what()).find("node id 42 which does not exist"), std::string::npos);
  }
  bad = p;
  bad.input_device = {5};
  try {
    checkPlacement(g, bad);
    FAIL();
  } catch (const ConfigError& e) {
    EXPECT_NE(std::string(e.what()).find("input %x is on device 5 of 2"), std::string::npos) << e.what();
  }
}

}  // namespace
}  // namespace modelpar::passes
