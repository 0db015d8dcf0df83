// Speed of the placers, the simulator and the whole pipeline on layered
// random DAGs (issue 7's benchmark; results in bench/RESULTS.md). Speed goals
// live here, not in unit tests.
//
//   cmake --build BUILD --target modelpar_bench_placement
//   BUILD/bench/modelpar_bench_placement [--full] [--sizes 10,100,316]
//       [--msct-max UNITS] [--lp-time-limit S] [--lp-window TASKS]
//       [--lp-whole-max TASKS] [--lp-overlap TASKS] [--lp-start-weight W] [--reps N] [--no-simulator]
//
// Graphs: testing::layeredDag(seed 7): L layers x W units, each reading 1-3
// units of the previous layer; 10-100 us per unit, outputs 4 KiB-1 MiB.
// Machine: 4 devices, links 10 us + 10 GB/s, memory ample. Times are the
// best of `reps` runs (the machine may be shared).
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <string_view>
#include <vector>

#include <fmt/format.h>

#include "passes/lower/lower.h"
#include "passes/lower/simulate.h"
#include "passes/place/place_metf.h"
#include "passes/place/place_msct.h"
#include "passes/place/place_mtopo.h"
#include "passes/plan_placement.h"
#include "tests/passes/test_graphs.h"

namespace mp = modelpar::passes;

namespace {

using Clock = std::chrono::steady_clock;

double secondsSince(Clock::time_point t0) {
  return std::chrono::duration<double>(Clock::now() - t0).count();
}

// 4 devices, 10 us + 10 GB/s links, memory ample.
mp::DeviceModel fourDevices() { return mp::testing::machine(4, int64_t{1} << 40, 10.0, 1e4); }

double singleDevice(const mp::TaskGraph& tg) {
  double w = 0;
  for (double t : tg.time_us) w += t;
  return w;
}

struct Args {
  std::vector<int> widths = {10, 100, 316};
  int msct_max = 1000;          // largest graph m-SCT runs on
  double lp_time_limit_s = 20;  // m-SCT's LP limit
  int reps = 5;
  bool simulator = true;
  int lp_window = mp::MSctOptions{}.lp_window_tasks;  // m-SCT's LP windows (place_msct.h)
  int lp_whole_max = mp::MSctOptions{}.lp_whole_max_tasks;
  int lp_overlap = 0;
  double lp_start_weight = 0;
};

Args parseArgs(int argc, char** argv) {
  Args a;
  for (int i = 1; i < argc; ++i) {
    std::string_view s = argv[i];
    auto next = [&]() -> std::string {
      if (i + 1 >= argc) {
        std::fprintf(stderr, "modelpar_bench_placement: %s needs a value\n", argv[i]);
        std::exit(2);
      }
      return argv[++i];
    };
    if (s == "--full") {
      a.widths = {10, 30, 100, 316};
      a.msct_max = 10000;
    } else if (s == "--sizes") {
      a.widths.clear();
      std::string v = next();
      for (size_t p = 0; p < v.size();) {
        size_t q = v.find(',', p);
        a.widths.push_back(std::stoi(v.substr(p, q - p)));
        p = q == std::string::npos ? v.size() : q + 1;
      }
    } else if (s == "--msct-max") {
      a.msct_max = std::stoi(next());
    } else if (s == "--lp-time-limit") {
      a.lp_time_limit_s = std::stod(next());
    } else if (s == "--reps") {
      a.reps = std::max(1, std::stoi(next()));
    } else if (s == "--lp-window") {
      a.lp_window = std::stoi(next());
    } else if (s == "--lp-whole-max") {
      a.lp_whole_max = std::stoi(next());
    } else if (s == "--lp-overlap") {
      a.lp_overlap = std::stoi(next());
    } else if (s == "--lp-start-weight") {
      a.lp_start_weight = std::stod(next());
    } else if (s == "--no-simulator") {
      a.simulator = false;
    } else {
      std::fprintf(stderr,
                   "usage: modelpar_bench_placement [--full] [--sizes W1,W2,...] [--msct-max UNITS] "
                   "[--lp-time-limit S] [--lp-window TASKS] [--lp-whole-max TASKS] [--lp-overlap TASKS] [--lp-start-weight W] "
                   "[--reps N] [--no-simulator]\n");
      std::exit(2);
    }
  }
  return a;
}

void placers(const Args& a) {
  mp::DeviceModel m = fourDevices();
  std::printf("| units | build | m-TOPO | m-ETF | m-SCT (LP) | makespan m-TOPO / m-ETF / m-SCT (one device) |\n");
  std::printf("|---|---|---|---|---|---|\n");
  for (int width : a.widths) {
    int layers = width >= 316 ? width : 100;
    modelpar::ir::Graph g = mp::testing::layeredDag(7, layers, width);
    int reps = width >= 316 ? std::min(a.reps, 2) : a.reps;
    double build = 1e9, etf_s = 1e9, topo_s = 1e9;
    mp::TaskGraph tg;
    mp::Placement etf, topo;
    for (int r = 0; r < reps; ++r) {
      auto t0 = Clock::now();
      tg = mp::buildTaskGraph(g);
      build = std::min(build, secondsSince(t0));
      t0 = Clock::now();
      etf = mp::placeMEtf(g, tg, m);
      etf_s = std::min(etf_s, secondsSince(t0));
      t0 = Clock::now();
      topo = mp::placeMTopo(g, tg, m);
      topo_s = std::min(topo_s, secondsSince(t0));
    }
    std::string sct_cell = "—", sct_makespan = "—";
    if (tg.numTasks() <= a.msct_max) {
      mp::MSctStats stats;
      mp::MSctOptions o;
      o.stats = &stats;
      o.lp_time_limit_s = a.lp_time_limit_s;
      o.lp_window_tasks = a.lp_window;
      o.lp_window_overlap = a.lp_overlap;
      o.lp_whole_max_tasks = a.lp_whole_max;
      o.lp_start_weight = a.lp_start_weight;
      auto t0 = Clock::now();
      mp::Placement sct = mp::placeMSct(g, tg, m, o);
      double sct_s = secondsSince(t0);
      sct_cell = fmt::format("{} (LP {}, {} LP{} {}x{}, {}; w {}, {} favourites)",
                             mp::formatMicros(sct_s * 1e6), mp::formatMicros(stats.lp_seconds * 1e6),
                             stats.lp_windows, stats.lp_windows == 1 ? "" : "s", stats.lp_rows,
                             stats.lp_columns,
                             stats.lp_optimal ? "optimal" : "NOT optimal",
                             mp::formatMicros(stats.lp_makespan_us), stats.favourite_edges);
      sct_makespan = mp::formatMicros(sct.makespan_us);
    }
    std::printf("| %d (%dx%d) | %s | %s | %s | %s | %s / %s / %s (%s) |\n", tg.numTasks(), layers,
                width, mp::formatMicros(build * 1e6).c_str(), mp::formatMicros(topo_s * 1e6).c_str(),
                mp::formatMicros(etf_s * 1e6).c_str(), sct_cell.c_str(),
                mp::formatMicros(topo.makespan_us).c_str(), mp::formatMicros(etf.makespan_us).c_str(),
                sct_makespan.c_str(), mp::formatMicros(singleDevice(tg)).c_str());
    std::fflush(stdout);
  }
}

void simulator(const Args& a) {
  mp::DeviceModel m = fourDevices();
  modelpar::ir::Graph g = mp::testing::layeredDag(9, 316, 316);  // ~100k nodes
  mp::Placement p = mp::placeMEtf(g, m);
  modelpar::ir::Program prog = mp::lower(g, p);
  mp::SimulationReport r = mp::simulate(prog, m);  // warm-up
  double s = 1e9;
  for (int i = 0; i < std::max(a.reps, 3); ++i) {
    auto t0 = Clock::now();
    r = mp::simulate(prog, m);
    s = std::min(s, secondsSince(t0));
  }
  std::printf("\nsimulate: %lld instructions (%lld transfers) in %s: %.2f M instructions/s; step %s "
              "vs m-ETF's estimate %s\n",
              static_cast<long long>(r.num_instructions), static_cast<long long>(r.num_transfers),
              mp::formatMicros(s * 1e6).c_str(), static_cast<double>(r.num_instructions) / s / 1e6,
              mp::formatMicros(r.step_time_us).c_str(), mp::formatMicros(p.makespan_us).c_str());

  // The whole pipeline (cost keeps the given costs; coarsen; m-ETF; lower;
  // simulate; verification after every pass) on the 10k-unit graph.
  modelpar::ir::Graph g10k = mp::testing::layeredDag(7, 100, 100);
  mp::PlacementOptions o;
  o.machine = m;
  o.dump_dir = "";
  mp::PlacementPlan plan = mp::planPlacement(g10k, o);
  std::printf("\nplan() on %zu nodes, m-ETF, 4 devices: step %s\n%s", g10k.numNodes(),
              mp::formatMicros(plan.stepTimeUs()).c_str(), plan.statsTable().c_str());
}

}  // namespace

int main(int argc, char** argv) {
  Args a = parseArgs(argc, argv);
  placers(a);
  if (a.simulator) simulator(a);
  return 0;
}
