// Graph builders and machines shared by the tests of passes/ (not a test).
#pragma once

#include <fmt/format.h>

#include <cstdint>
#include <map>
#include <random>
#include <string>
#include <vector>

#include "ir/graph.h"
#include "ir/parser.h"
#include "passes/cost/device_model.h"
#include "passes/place/placement.h"

namespace modelpar::passes::testing {

/// n identical devices with `memory` bytes each; links of latency_us and
/// bandwidth in bytes per microsecond.
inline DeviceModel machine(int n, int64_t memory = int64_t{1} << 40, double latency_us = 2.0,
                           double bytes_per_us = 1024.0) {
  DeviceSpec d;
  d.memory_bytes = memory;
  return DeviceModel::uniform(n, d, LinkSpec{latency_us, bytes_per_us * 1e6});
}

// The diamond the placement, lowering and simulation tests share. Every value
// is f32[256] = 1 KiB; on machine() a transfer takes 2 us + 1024 B / (1024
// B/us) = 3 us. Costs are given (profiled), so the cost pass keeps them.
//
//        %x
//        |
//        a  10 us
//       / \
//  20 b     c 20 us
//       \ /
//        d  5 us
//
// kDiamond has one layer per node; kDiamondNoLayers none (co-placement may
// merge across nodes).
inline constexpr const char* kDiamond = R"(
graph @diamond(%x: f32[256] input) {
  %a: f32[256] = aten::relu(%x) {layer="a", cost={time_us=10.0, out=1024, temp=0, persist=0}}
  %b: f32[256] = aten::relu(%a) {layer="b", cost={time_us=20.0, out=1024, temp=0, persist=0}}
  %c: f32[256] = aten::sigmoid(%a) {layer="c", cost={time_us=20.0, out=1024, temp=0, persist=0}}
  %d: f32[256] = aten::add.Tensor(%b, %c) {layer="d", cost={time_us=5.0, out=1024, temp=0, persist=0}}
  return %d
}
)";
inline constexpr const char* kDiamondNoLayers = R"(
graph @diamond(%x: f32[256] input) {
  %a: f32[256] = aten::relu(%x) {cost={time_us=10.0, out=1024, temp=0, persist=0}}
  %b: f32[256] = aten::relu(%a) {cost={time_us=20.0, out=1024, temp=0, persist=0}}
  %c: f32[256] = aten::sigmoid(%a) {cost={time_us=20.0, out=1024, temp=0, persist=0}}
  %d: f32[256] = aten::add.Tensor(%b, %c) {cost={time_us=5.0, out=1024, temp=0, persist=0}}
  return %d
}
)";

inline ir::Type f32(int64_t elems) { return ir::Type::tensor(ir::ScalarType::Float32, std::vector<int64_t>{elems}); }

/// Adds a node reading `ins` (a relu for one input, a cat for more) with one
/// output of `bytes` (a multiple of 4) and the given cost.
inline ir::NodeId addTask(ir::Graph& g, const std::string& name, const std::vector<ir::ValueId>& ins,
                          int64_t bytes, double time_us, const std::string& layer = "",
                          int64_t persistent = 0, int64_t temp = 0) {
  std::vector<ir::Arg> args;
  std::string op;
  if (ins.size() == 1) {
    op = "aten::relu";
    args.push_back(ir::Arg::value(ins[0]));
  } else {
    op = "aten::cat";
    std::vector<ir::Arg> items;
    for (ir::ValueId v : ins) items.push_back(ir::Arg::value(v));
    args.push_back(ir::Arg::list(items));
  }
  ir::NodeId n = g.addNode(op, args, {{name, f32(bytes / 4)}});
  g.node(n).cost = ir::Cost{time_us, bytes, temp, persistent};
  g.node(n).layer = layer;
  return n;
}

/// A micro-batched step and the stage of each of its nodes (per NodeId), as
/// the `schedule` pass takes them.
struct StagedGraph {
  ir::Graph g{"staged"};
  std::vector<int32_t> stage_of_node;
};

/// The uniform chain of the zero-bubble schedule tests: `layers` layers over
/// m micro-batches, every node 1 us and 4 bytes, layer l on stage
/// l / layers_per_stage. Per (layer l, micro-batch k) a forward f<l>_<k>, and
/// two backward nodes: b<l>_<k>, the input gradient (reads f<l>_<k> and
/// b<l+1>_<k>), and w<l>_<k>, the weight gradient summed over micro-batches
/// (reads f<l>_<k>, the incoming gradient b<l+1>_<k> (on the last layer its
/// own b, or nothing when w comes first) and w<l>_<k-1>):
///
///   %x -> f0_k -> f1_k -> .. -> f(L-1)_k
///          |       |              |
///         b0_k <- b1_k <- .. <- b(L-1)_k
///          w0_k <-'  w1_k <-' ..   w(L-1)_k      w_l_k also reads w_l_(k-1)
///
/// Note [Backward split]: b<l>_<k> is B when a node of an earlier stage reads
/// it or a B node of its own task does (the first layer of every stage but
/// stage 0, and the layers after it in the stage), w<l>_<k> is W; stage 0
/// sends nothing back, so its b's are W too. Unsplit, the backward task of a
/// stage is its b's and w's, in graph order: b first (the default), so the
/// gradient is sent before the weight gradient is computed, or, with
/// w_first, w first, so it is sent at the end of the task (the paper's 1F1B,
/// whose backward is one piece). `extra` (reader -> read, by name) adds
/// edges; every forward is built before every backward, and backwards in
/// micro-batch order, so a backward may read any forward.
inline StagedGraph zeroBubbleChain(int layers, int m, bool w_first = false, int layers_per_stage = 1,
                                   const std::multimap<std::string, std::string>& extra = {}) {
  StagedGraph c;
  c.g = ir::Graph("zb_chain");
  ir::Graph& g = c.g;
  std::map<std::string, ir::ValueId> value;
  auto add = [&](const std::string& name, std::vector<ir::ValueId> ins, int l, int k,
                 ir::Phase phase) {
    for (auto [e, end] = extra.equal_range(name); e != end; ++e) ins.push_back(value.at(e->second));
    const ir::NodeId id = addTask(g, name, ins, 4, 1.0);
    g.node(id).microbatch = k;
    g.node(id).phase = phase;
    c.stage_of_node.push_back(l / layers_per_stage);
    value[name] = g.node(id).outputs[0];
  };
  auto at = [&](const std::string& prefix, int l, int k) { return value.at(fmt::format("{}{}_{}", prefix, l, k)); };
  const ir::ValueId x = g.addInput("x", f32(1), ir::InputRole::Input);
  for (int k = 0; k < m; ++k) {
    for (int l = 0; l < layers; ++l) add(fmt::format("f{}_{}", l, k), {l == 0 ? x : at("f", l - 1, k)}, l, k, ir::Phase::Forward);
  }
  for (int k = 0; k < m; ++k) {
    for (int l = layers - 1; l >= 0; --l) {
      std::vector<ir::ValueId> ins{at("f", l, k)};
      if (l + 1 < layers) ins.push_back(at("b", l + 1, k));
      std::vector<ir::ValueId> w_ins{at("f", l, k)};
      if (l + 1 < layers || !w_first) w_ins.push_back(l + 1 < layers ? at("b", l + 1, k) : ir::kNoId);
      if (k > 0) w_ins.push_back(at("w", l, k - 1));
      auto addW = [&] {
        if (l + 1 == layers && !w_first) w_ins[1] = at("b", l, k);
        add(fmt::format("w{}_{}", l, k), w_ins, l, k, ir::Phase::Backward);
      };
      if (w_first) addW();
      add(fmt::format("b{}_{}", l, k), ins, l, k, ir::Phase::Backward);
      if (!w_first) addW();
    }
  }
  return c;
}

/// A random DAG of `n` tasks: node i reads 1..3 earlier nodes (or the
/// input), each edge kept with probability `density`; times in [1, 20] us,
/// outputs 4..max_bytes bytes. With single_source every node descends from
/// node 0. The last node's output is returned.
inline ir::Graph randomDag(std::mt19937& rng, int n, double density, int64_t max_bytes,
                           bool single_source = false) {
  ir::Graph g("random");
  ir::ValueId x = g.addInput("x", f32(16), ir::InputRole::Input);
  std::uniform_real_distribution<double> time(1.0, 20.0), coin(0.0, 1.0);
  std::uniform_int_distribution<int64_t> words(1, std::max<int64_t>(1, max_bytes / 4));
  std::vector<ir::ValueId> outs;
  for (int i = 0; i < n; ++i) {
    std::vector<ir::ValueId> ins;
    for (int j = 0; j < i; ++j) {
      if (coin(rng) < density) ins.push_back(outs[static_cast<size_t>(j)]);
    }
    if (ins.size() > 3) {
      std::shuffle(ins.begin(), ins.end(), rng);
      ins.resize(3);
      std::sort(ins.begin(), ins.end());
    }
    if (ins.empty()) {
      if (single_source && i > 0) ins.push_back(outs[std::uniform_int_distribution<size_t>(0, outs.size() - 1)(rng)]);
      else ins.push_back(x);
    }
    ir::NodeId id = addTask(g, "t" + std::to_string(i), ins, 4 * words(rng), std::round(time(rng)));
    outs.push_back(g.node(id).outputs[0]);
  }
  g.setOutputs({outs.back()});
  return g;
}

/// A layered random DAG: `layers` x `width` tasks, each reading 1..3 tasks of
/// the previous layer; times 10..100 us, outputs 4 KiB..1 MiB.
inline ir::Graph layeredDag(uint32_t seed, int layers, int width) {
  std::mt19937 rng(seed);
  ir::Graph g("layered");
  ir::ValueId x = g.addInput("x", f32(1024), ir::InputRole::Input);
  std::uniform_real_distribution<double> time(10.0, 100.0);
  std::uniform_int_distribution<int64_t> words(1024, 256 * 1024);
  std::uniform_int_distribution<int> fan(1, 3), pick(0, width - 1);
  std::vector<ir::ValueId> prev(static_cast<size_t>(width), x), cur;
  for (int l = 0; l < layers; ++l) {
    cur.clear();
    for (int w = 0; w < width; ++w) {
      std::vector<ir::ValueId> ins;
      int k = l == 0 ? 1 : fan(rng);
      for (int j = 0; j < k; ++j) {
        ir::ValueId v = prev[static_cast<size_t>(pick(rng))];
        if (std::find(ins.begin(), ins.end(), v) == ins.end()) ins.push_back(v);
      }
      std::string name = "n" + std::to_string(l) + "_" + std::to_string(w);
      ir::NodeId id = addTask(g, name, ins, 4 * words(rng), std::round(time(rng)));
      cur.push_back(g.node(id).outputs[0]);
    }
    prev = cur;
  }
  g.setOutputs(prev);
  return g;
}

/// Device d's order in `p` as the node names without their '%', spaced
/// ("f0_0 f0_1 b0_0 ..."), for asserting a schedule's order.
inline std::string orderText(const ir::Graph& g, const Placement& p, int d) {
  std::string s;
  for (ir::NodeId n : p.order[static_cast<size_t>(d)]) s += (s.empty() ? "" : " ") + g.nodeRef(n).substr(1);
  return s;
}

}  // namespace modelpar::passes::testing
