// splitPhases (split_phases.h): mark the second part, copy each part, restrict
// the placement, lower.
#include "passes/pipeline/split_phases.h"

#include <algorithm>
#include <optional>

#include "ir/check.h"
#include "ir/node_copy.h"
#include "ir/verifier.h"

namespace modelpar::passes {
namespace {

bool isSecondPhase(const ir::Node& n) {
  return n.phase && (*n.phase == ir::Phase::Backward || *n.phase == ir::Phase::Recompute);
}

// One part of g: the nodes `in_part` marks, with the given inputs.
struct Part {
  ir::Graph graph;
  Placement placement;
};

Part buildPart(const ir::Graph& g, const Placement& p, const std::vector<bool>& in_part,
               const std::vector<ir::ValueId>& inputs, const std::vector<int32_t>& input_device,
               const std::vector<ir::ValueId>& outputs, const std::string& name) {
  Part part{ir::Graph(name), {}};
  ir::Graph& out = part.graph;
  std::vector<ir::ValueId> map(g.numValues(), ir::kNoId);
  for (ir::ValueId v : inputs) {
    auto idx = g.inputIndex(v);
    ir::InputRole role = idx ? g.inputs()[*idx].role : ir::InputRole::Input;
    map[static_cast<size_t>(v)] = out.addInput(g.value(v).name, g.value(v).type, role);
  }
  std::vector<ir::NodeId> sub_of(g.numNodes(), ir::kNoId);
  Placement& sp = part.placement;
  sp.placer = p.placer;
  sp.num_devices = p.num_devices;
  sp.makespan_us = p.makespan_us;
  for (size_t i = 0; i < g.numNodes(); ++i) {
    if (!in_part[i]) continue;
    ir::NodeCopyRules rules;
    rules.value = [&](ir::ValueId v) {
      ir::ValueId m = map[static_cast<size_t>(v)];
      MP_INTERNAL_ASSERT(m != ir::kNoId, "split-phases: %{} has no copy in @{}",
                         g.value(v).name, name);
      return m;
    };
    ir::NodeId id = ir::copyNode(g, static_cast<ir::NodeId>(i), out, rules, &map);
    sub_of[i] = id;
    sp.node_device.push_back(p.node_device[i]);
    sp.start_us.push_back(i < p.start_us.size() ? p.start_us[i] : 0.0);
  }
  std::vector<ir::ValueId> outs;
  for (ir::ValueId v : outputs) outs.push_back(map[static_cast<size_t>(v)]);
  out.setOutputs(std::move(outs));
  sp.order.resize(p.order.size());
  for (size_t d = 0; d < p.order.size(); ++d) {
    for (ir::NodeId n : p.order[d]) {
      if (sub_of[static_cast<size_t>(n)] != ir::kNoId) sp.order[d].push_back(sub_of[static_cast<size_t>(n)]);
    }
  }
  sp.input_device = input_device;
  ir::verify(out);
  return part;
}

}  // namespace

PhaseSplit splitPhases(const ir::Graph& g, const Placement& p, const LowerOptions& lo) {
  checkPlacement(g, p);
  const size_t nn = g.numNodes();
  std::vector<bool> second(nn, false);
  std::vector<bool> second_value(g.numValues(), false);
  for (size_t i = 0; i < nn; ++i) {
    const ir::Node& n = g.nodes()[i];
    bool s = isSecondPhase(n);
    for (ir::ValueId v : n.inputs()) s = s || second_value[static_cast<size_t>(v)];
    second[i] = s;
    for (ir::ValueId v : n.outputs) second_value[static_cast<size_t>(v)] = s;
  }
  std::vector<bool> first(nn);
  for (size_t i = 0; i < nn; ++i) first[i] = !second[i];

  // A graph input is bound where lower() binds it in the whole step
  // (boundInputDevices), in both parts: each part lowered apart would bind
  // an input the placement leaves free on its own first reader, and a
  // parameter read on two stages (GPT's tied embedding and head) was bound on
  // one device in the forward part and another in the backward part: over
  // ranks, the second program read a copy the first program's rank did not
  // update.
  const std::vector<int32_t> bound = boundInputDevices(g, p);
  auto input_device = [&](ir::ValueId v) -> int32_t {
    if (auto idx = g.inputIndex(v)) return bound[*idx];
    return p.node_device[static_cast<size_t>(g.value(v).producer)];
  };
  auto isOutput = [&](ir::ValueId v) {
    return std::find(g.outputs().begin(), g.outputs().end(), v) != g.outputs().end();
  };
  // Inputs each part reads (in g's input order), carried values (value order).
  std::vector<bool> read_first(g.numValues(), false), read_second(g.numValues(), false);
  for (size_t i = 0; i < nn; ++i) {
    for (ir::ValueId v : g.nodes()[i].inputs()) {
      (second[i] ? read_second : read_first)[static_cast<size_t>(v)] = true;
    }
  }
  PhaseSplit out;
  std::vector<ir::ValueId> first_inputs, second_inputs, first_outputs, second_outputs;
  std::vector<int32_t> first_dev, second_dev;
  for (const ir::Input& in : g.inputs()) {
    auto v = static_cast<size_t>(in.value);
    if (read_first[v] || isOutput(in.value)) {
      first_inputs.push_back(in.value);
      first_dev.push_back(input_device(in.value));
    }
    if (read_second[v]) {
      second_inputs.push_back(in.value);
      second_dev.push_back(input_device(in.value));
    }
  }
  for (ir::ValueId v : g.outputs()) {
    ir::NodeId prod = g.value(v).producer;
    bool in_second = prod != ir::kNoId && second[static_cast<size_t>(prod)];
    auto& list = in_second ? second_outputs : first_outputs;
    if (std::find(list.begin(), list.end(), v) == list.end()) list.push_back(v);
  }
  for (size_t v = 0; v < g.numValues(); ++v) {
    ir::NodeId prod = g.values()[v].producer;
    if (prod == ir::kNoId || second[static_cast<size_t>(prod)] || !read_second[v]) continue;
    auto value = static_cast<ir::ValueId>(v);
    out.carried.push_back(g.values()[v].name);
    second_inputs.push_back(value);
    second_dev.push_back(input_device(value));
    if (std::find(first_outputs.begin(), first_outputs.end(), value) == first_outputs.end()) {
      first_outputs.push_back(value);
    }
  }
  Part a = buildPart(g, p, first, first_inputs, first_dev, first_outputs, g.name() + "_first");
  Part b = buildPart(g, p, second, second_inputs, second_dev, second_outputs, g.name() + "_second");
  out.first = lower(a.graph, a.placement, lo);
  out.second = lower(b.graph, b.placement, lo);
  ir::verify(out.first);
  ir::verify(out.second);
  return out;
}

}  // namespace modelpar::passes
