// copyNode (node_copy.h).
#include "ir/node_copy.h"

#include <utility>

namespace modelpar::ir {
namespace {

template <typename F>
void replaceValues(Arg& a, F&& replacement) {
  if (a.isValue()) {
    std::string keyword = a.keyword();
    a = replacement(a.toValue());
    if (!keyword.empty()) a.withKeyword(std::move(keyword));
  }
  for (Arg& item : a.items()) replaceValues(item, replacement);
}

}  // namespace

NodeId copyNode(const Graph& src, NodeId n, Graph& dst, const NodeCopyRules& rules,
                std::vector<ValueId>* output_map) {
  const Node& node = src.node(n);
  std::vector<Arg> args = node.args;
  for (Arg& a : args) {
    if (rules.arg) {
      replaceValues(a, rules.arg);
    } else {
      a.remapValues(rules.value);
    }
  }
  auto rename = [&](const std::string& s) { return rules.name ? rules.name(s) : s; };
  std::vector<std::pair<std::string, Type>> outs;
  outs.reserve(node.outputs.size());
  for (ValueId v : node.outputs) {
    const Value& val = src.value(v);
    outs.emplace_back(rename(val.name), rules.type ? rules.type(val.type) : val.type);
  }
  NodeId id = dst.addNode(node.qualifiedName(), std::move(args), std::move(outs));
  Node& copy = dst.node(id);
  copy.layer = node.layer;
  copy.phase = node.phase;
  copy.device = node.device;
  copy.microbatch = node.microbatch;
  copy.random = node.random;
  if (rules.keep_cost) copy.cost = node.cost;
  if (node.outputs.empty() && !node.label.empty()) dst.setLabel(id, rename(node.label));
  if (output_map) {
    for (size_t k = 0; k < node.outputs.size(); ++k) {
      (*output_map)[static_cast<size_t>(node.outputs[k])] = copy.outputs[k];
    }
  }
  return id;
}

}  // namespace modelpar::ir
