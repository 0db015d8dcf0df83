// Recording a step and turning it into an ir::Graph (trace.h).
#include "capture/trace.h"

#include <string_view>
#include <unordered_set>

#include "capture/layers.h"
#include "ir/error.h"
#include "ir/printer.h"

namespace modelpar::capture {
namespace {

// Value names follow VALUE := '%' [A-Za-z0-9_.]+ (ir/README.md).
std::string legalName(std::string_view want, std::string_view fallback) {
  std::string s;
  for (char c : want) {
    const bool ok = (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') ||
                    c == '_' || c == '.';
    s += ok ? c : '_';
  }
  return s.empty() ? std::string(fallback) : s;
}

}  // namespace

ir::ValueId Trace::addInput(ir::Type type, TracedInput in) {
  auto id = static_cast<ir::ValueId>(types_.size());
  types_.push_back(std::move(type));
  producer_.push_back(-1);
  in.value = id;
  inputs_.push_back(std::move(in));
  return id;
}

std::vector<ir::ValueId> Trace::addNode(std::string op, std::vector<ir::Arg> args,
                                        std::vector<ir::Type> output_types, std::string layer,
                                        std::optional<ir::Phase> phase, int64_t seq, bool random) {
  const auto node = static_cast<int64_t>(nodes_.size());
  std::vector<ir::ValueId> outs;
  outs.reserve(output_types.size());
  for (ir::Type& t : output_types) {
    outs.push_back(static_cast<ir::ValueId>(types_.size()));
    types_.push_back(std::move(t));
    producer_.push_back(node);
  }
  nodes_.push_back(TracedNode{std::move(op), std::move(args), outs, std::move(layer), phase, seq, random});
  return outs;
}

BuiltGraph Trace::build(const std::vector<ir::ValueId>& outputs, const std::string& name) const {
  // 1. Liveness: walk the nodes backwards from the outputs.
  std::vector<bool> live(types_.size(), false);
  for (ir::ValueId v : outputs) {
    if (v < 0 || static_cast<size_t>(v) >= types_.size()) {
      throw InvalidIrError("modelpar capture: trace output id " + std::to_string(v) +
                           " does not exist (" + std::to_string(types_.size()) + " values)");
    }
    live[static_cast<size_t>(v)] = true;
  }
  std::vector<bool> node_live(nodes_.size(), false);
  for (size_t n = nodes_.size(); n-- > 0;) {
    bool any = false;
    for (ir::ValueId o : nodes_[n].outputs) any = any || live[static_cast<size_t>(o)];
    if (!any) continue;
    node_live[n] = true;
    for (const ir::Arg& a : nodes_[n].args) {
      a.forEachValue([&](ir::ValueId v) { live[static_cast<size_t>(v)] = true; });
    }
  }

  // 2. Inputs in first-read order, then the live nodes, renumbered.
  BuiltGraph out{ir::Graph(name), {}, {}};
  std::vector<ir::ValueId> remap(types_.size(), ir::kNoId);
  std::unordered_set<std::string> taken;
  std::vector<std::string> owners;
  for (size_t i = 0; i < inputs_.size(); ++i) {
    const TracedInput& in = inputs_[i];
    if (!live[static_cast<size_t>(in.value)]) continue;
    std::string base = legalName(in.name, in.role == ir::InputRole::Input ? "x" : "p");
    std::string n = base;
    for (int k = 1; taken.count(n) || (n.size() > 1 && n[0] == 'v' &&
                                       n.find_first_not_of("0123456789", 1) == std::string::npos);
         ++k) {
      n = base + "_" + std::to_string(k);  // never clash with the %vN node outputs
    }
    taken.insert(n);
    remap[static_cast<size_t>(in.value)] = out.graph.addInput(n, types_[static_cast<size_t>(in.value)], in.role);
    out.input_slots.push_back(i);
    owners.push_back(in.owner);
    out.key += in.key_note;
    out.key += '\n';
  }
  int counter = 0;
  std::vector<int64_t> seqs;
  for (size_t n = 0; n < nodes_.size(); ++n) {
    if (!node_live[n]) continue;
    const TracedNode& tn = nodes_[n];
    std::vector<ir::Arg> args = tn.args;
    for (ir::Arg& a : args) a.remapValues([&](ir::ValueId v) { return remap[static_cast<size_t>(v)]; });
    std::vector<std::pair<std::string, ir::Type>> outs;
    for (ir::ValueId o : tn.outputs) {
      outs.emplace_back("v" + std::to_string(counter++), types_[static_cast<size_t>(o)]);
    }
    ir::NodeId id = out.graph.addNode(tn.op, std::move(args), std::move(outs));
    ir::Node& node = out.graph.node(id);
    node.layer = tn.layer;
    node.phase = tn.phase;
    node.random = tn.random;
    seqs.push_back(tn.seq);
    for (size_t k = 0; k < tn.outputs.size(); ++k) {
      remap[static_cast<size_t>(tn.outputs[k])] = node.outputs[k];
    }
  }
  std::vector<ir::ValueId> results;
  results.reserve(outputs.size());
  for (ir::ValueId v : outputs) results.push_back(remap[static_cast<size_t>(v)]);
  out.graph.setOutputs(std::move(results));

  // 3. Layers, then the key (layers are part of the structure).
  attributeLayers(out.graph, owners, seqs);
  out.key += ir::print(out.graph);
  return out;
}

void Trace::clear() {
  types_.clear();
  producer_.clear();
  inputs_.clear();
  nodes_.clear();
}

}  // namespace modelpar::capture
