// Forward and backward placed as one (plan_joint.h): join, plan once, split.
#include "passes/plan_joint.h"

#include <algorithm>
#include <optional>
#include <unordered_map>
#include <unordered_set>

#include "ir/check.h"
#include "ir/node_copy.h"
#include "ir/verifier.h"

namespace modelpar::passes {
namespace {

// A name not yet taken in g: `name`, else `bw.name`, `bw.name.1`, ...
std::string freshName(const ir::Graph& g, const std::string& name) {
  auto taken = [&](const std::string& s) { return g.findValue(s) || g.findLabel(s); };
  if (!taken(name)) return name;
  std::string base = "bw." + name, out = base;
  for (int i = 1; taken(out); ++i) out = fmt::format("{}.{}", base, i);
  return out;
}

// Copies node n of src into dst with its arguments mapped through value_map;
// its outputs (renamed when taken) are recorded in value_map.
ir::NodeId copyNode(const ir::Graph& src, ir::NodeId n, ir::Graph& dst,
                    std::vector<ir::ValueId>& value_map) {
  ir::NodeCopyRules rules;
  rules.value = [&](ir::ValueId v) { return value_map[static_cast<size_t>(v)]; };
  rules.name = [&](const std::string& name) { return freshName(dst, name); };
  return ir::copyNode(src, n, dst, rules, &value_map);
}

// The placement of `sub` (a graph copied into the joint one through
// node_map) that the joint placement implies: node devices and per-device
// orders restricted to sub's nodes; input devices given.
Placement restrict(const ir::Graph& sub, const std::vector<ir::NodeId>& node_map,
                   const Placement& joint, std::vector<int32_t> input_device) {
  Placement p;
  p.placer = joint.placer;
  p.num_devices = joint.num_devices;
  p.makespan_us = joint.makespan_us;
  std::vector<ir::NodeId> sub_of_joint(joint.node_device.size(), ir::kNoId);
  p.node_device.resize(sub.numNodes());
  p.start_us.resize(sub.numNodes());
  for (size_t n = 0; n < sub.numNodes(); ++n) {
    size_t j = static_cast<size_t>(node_map[n]);
    sub_of_joint[j] = static_cast<ir::NodeId>(n);
    p.node_device[n] = joint.node_device[j];
    p.start_us[n] = j < joint.start_us.size() ? joint.start_us[j] : 0.0;
  }
  p.order.resize(static_cast<size_t>(joint.num_devices));
  for (size_t d = 0; d < joint.order.size(); ++d) {
    for (ir::NodeId j : joint.order[d]) {
      ir::NodeId n = sub_of_joint[static_cast<size_t>(j)];
      if (n != ir::kNoId) p.order[d].push_back(n);
    }
  }
  p.input_device = std::move(input_device);
  return p;
}

}  // namespace

JointGraph joinForwardBackward(const ir::Graph& fw, const ir::Graph& bw,
                               const std::vector<SavedLink>& saved,
                               const std::vector<SavedLink>& tangents,
                               const std::vector<SavedLink>& zero_tangents) {
  ir::verify(fw);
  ir::verify(bw);
  JointGraph out;
  ir::Graph& g = out.graph;
  g.setName(fw.name() + "_joint");
  out.forward_value.assign(fw.numValues(), ir::kNoId);
  out.backward_value.assign(bw.numValues(), ir::kNoId);

  // Links: each names a bw input and a fw value of the same type.
  std::unordered_set<ir::ValueId> linked_fw;
  std::vector<std::optional<ir::ValueId>> link_of(bw.numValues());
  std::vector<bool> is_tangent(bw.numValues(), false);
  std::vector<bool> is_zero(bw.numValues(), false);
  std::vector<SavedLink> links = saved;
  links.insert(links.end(), tangents.begin(), tangents.end());
  links.insert(links.end(), zero_tangents.begin(), zero_tangents.end());
  for (size_t i = 0; i < links.size(); ++i) {
    const SavedLink& l = links[i];
    std::optional<ir::ValueId> b = bw.findValue(l.backward_input);
    MP_CHECK(b && bw.inputIndex(*b), InvalidIrError,
             "modelpar {}: linked value %{} is not an input of the backward graph @{}", kJointPassId,
             l.backward_input, bw.name());
    std::optional<ir::ValueId> f = fw.findValue(l.forward_value);
    MP_CHECK(f, InvalidIrError, "modelpar {}: backward input %{} is linked to %{}, which the "
             "forward graph @{} does not define", kJointPassId, l.backward_input, l.forward_value,
             fw.name());
    MP_CHECK(!link_of[static_cast<size_t>(*b)], InvalidIrError,
             "modelpar {}: backward input %{} is linked to two forward values", kJointPassId,
             l.backward_input);
    MP_CHECK(bw.value(*b).type == fw.value(*f).type, InvalidIrError,
             "modelpar {}: backward input %{}: {} is linked to forward value %{}: {}; the types "
             "must match", kJointPassId, l.backward_input, ir::toString(bw.value(*b).type),
             l.forward_value, ir::toString(fw.value(*f).type));
    link_of[static_cast<size_t>(*b)] = *f;
    if (i < saved.size()) {
      linked_fw.insert(*f);
    } else {
      is_tangent[static_cast<size_t>(*b)] = true;
      is_zero[static_cast<size_t>(*b)] = i >= saved.size() + tangents.size();
    }
  }

  // Inputs: the forward's, then the backward's tangents.
  for (const ir::Input& in : fw.inputs()) {
    const ir::Value& v = fw.value(in.value);
    out.forward_value[static_cast<size_t>(in.value)] = g.addInput(v.name, v.type, in.role);
  }
  for (const ir::Input& in : bw.inputs()) {
    if (link_of[static_cast<size_t>(in.value)]) continue;
    const ir::Value& v = bw.value(in.value);
    out.backward_value[static_cast<size_t>(in.value)] =
        g.addInput(freshName(g, v.name), v.type, in.role);
  }
  // Nodes: the forward's, then the backward's reading the saved values.
  for (size_t n = 0; n < fw.numNodes(); ++n) {
    out.forward_node.push_back(copyNode(fw, static_cast<ir::NodeId>(n), g, out.forward_value));
  }
  for (size_t v = 0; v < bw.numValues(); ++v) {
    if (!link_of[v]) continue;
    ir::ValueId f = out.forward_value[static_cast<size_t>(*link_of[v])];
    if (!is_tangent[v]) {
      out.backward_value[v] = f;
      continue;
    }
    // The output's gradient arrives after the output exists.
    const ir::Value& t = bw.value(static_cast<ir::ValueId>(v));
    ir::NodeId n = g.addNode(is_zero[v] ? "aten::zeros_like" : "aten::ones_like",
                             {ir::Arg::value(f)}, {{freshName(g, t.name), t.type}});
    g.node(n).phase = ir::Phase::Backward;
    // Made outside both graphs (the loss's backward runs eagerly): no time.
    g.node(n).cost = ir::Cost{0.0, t.type.bytes().value_or(0), 0, 0};
    out.backward_value[v] = g.node(n).outputs[0];
  }
  for (size_t n = 0; n < bw.numNodes(); ++n) {
    out.backward_node.push_back(copyNode(bw, static_cast<ir::NodeId>(n), g, out.backward_value));
  }
  // Outputs: what the user gets from the forward, then the gradients.
  std::vector<ir::ValueId> outputs;
  auto add = [&](ir::ValueId v) {
    if (std::find(outputs.begin(), outputs.end(), v) == outputs.end()) outputs.push_back(v);
  };
  for (ir::ValueId v : fw.outputs()) {
    if (!linked_fw.count(v)) add(out.forward_value[static_cast<size_t>(v)]);
  }
  for (ir::ValueId v : bw.outputs()) add(out.backward_value[static_cast<size_t>(v)]);
  g.setOutputs(std::move(outputs));
  ir::verify(g);
  return out;
}

JointPlan planJoint(const ir::Graph& fw, const ir::Graph& bw, const JointPlanOptions& jo,
                    const PlacementOptions& o) {
  MP_CHECK(!o.placement, ConfigError, "modelpar {}: plans the joint graph itself; leave "
           "PlacementOptions::placement unset", kJointPassId);
  for (auto [out, in] : jo.gradients) {
    MP_CHECK(out >= 0 && static_cast<size_t>(out) < bw.outputs().size() && in >= 0 &&
                 static_cast<size_t>(in) < fw.inputs().size(),
             InvalidIrError, "modelpar {}: gradient (backward output {}, forward input {}) is out "
             "of range; the backward has {} outputs, the forward {} inputs", kJointPassId, out, in,
             bw.outputs().size(), fw.inputs().size());
  }
  JointGraph jg = joinForwardBackward(fw, bw, jo.saved, jo.tangents);
  const ir::Graph& g = jg.graph;
  PlacementPlan joint = planPlacement(g, o);
  int64_t moved_layer = 0, moved_param = 0;

  // 1. A layer's backward on its forward's device; gradients on their
  //    parameter's device. Moving a node keeps any placement valid (lowering
  //    adds the transfers) once the orders are rebuilt in graph order.
  {
    const Placement& placed = joint.placement;
    std::vector<int32_t> device = placed.node_device;
    std::unordered_map<std::string, int32_t> layer_device;
    for (ir::NodeId j : jg.forward_node) {
      const std::string& layer = g.node(j).layer;
      if (!layer.empty()) layer_device.emplace(layer, device[static_cast<size_t>(j)]);
    }
    for (ir::NodeId j : jg.backward_node) {
      auto it = layer_device.find(g.node(j).layer);
      if (it == layer_device.end() || device[static_cast<size_t>(j)] == it->second) continue;
      device[static_cast<size_t>(j)] = it->second;
      ++moved_layer;
    }
    const std::vector<ir::Input>& joint_inputs = joint.program.graph().inputs();
    for (auto [out, in] : jo.gradients) {
      ir::ValueId grad = jg.backward_value[static_cast<size_t>(bw.outputs()[static_cast<size_t>(out)])];
      ir::NodeId producer = g.value(grad).producer;
      if (producer == ir::kNoId) continue;  // the gradient is an input passed through
      int32_t home = joint_inputs[static_cast<size_t>(in)].device.value_or(0);
      if (device[static_cast<size_t>(producer)] == home) continue;
      device[static_cast<size_t>(producer)] = home;
      ++moved_param;
    }
    if (moved_layer + moved_param > 0) {
      Placement fixed = placed;
      fixed.node_device = device;
      for (auto& ord : fixed.order) ord.clear();
      for (size_t n = 0; n < g.numNodes(); ++n) {
        fixed.order[static_cast<size_t>(device[n])].push_back(static_cast<ir::NodeId>(n));
      }
      fixed.input_device.clear();
      for (const ir::Input& in : joint_inputs) fixed.input_device.push_back(in.device.value_or(-1));
      PlacementOptions again = o;
      again.placement = std::move(fixed);
      // The fixed placement honours the pins already; applying pinned_layers
      // again would move a gradient's producer back from its parameter's
      // device (pinned_inputs) to its layer's.
      again.pinned_layers.clear();
      PlacementPlan replanned = planPlacement(g, again);
      replanned.units = std::move(joint.units);  // the placer's units, for the report
      joint = std::move(replanned);
    }
  }

  // 2. Split.
  const Placement& jp = joint.placement;
  const ir::Graph& lowered = joint.program.graph();
  auto input_device = [&](ir::ValueId joint_value) -> int32_t {
    const ir::Value& v = g.value(joint_value);
    if (v.producer != ir::kNoId) return jp.node_device[static_cast<size_t>(v.producer)];
    return lowered.inputs()[*g.inputIndex(joint_value)].device.value_or(0);
  };
  std::vector<int32_t> fw_inputs, bw_inputs;
  for (const ir::Input& in : fw.inputs()) {
    fw_inputs.push_back(input_device(jg.forward_value[static_cast<size_t>(in.value)]));
  }
  for (const ir::Input& in : bw.inputs()) {
    bw_inputs.push_back(input_device(jg.backward_value[static_cast<size_t>(in.value)]));
  }
  PlacementOptions half = o;
  half.pinned_layers.clear();  // already applied to the joint placement
  half.placement = restrict(fw, jg.forward_node, jp, std::move(fw_inputs));
  PlacementPlan forward = planPlacement(fw, half);
  half.placement = restrict(bw, jg.backward_node, jp, std::move(bw_inputs));
  PlacementPlan backward = planPlacement(bw, half);
  return JointPlan{std::move(joint), std::move(forward), std::move(backward), moved_layer,
                   moved_param};
}

}  // namespace modelpar::passes
