// Copying a node of one graph into another with its arguments remapped and
// every annotation kept: what a rewrite that builds a new graph does for the
// nodes it keeps (plan_joint, split_phases, relay_skips, checkpoint,
// microbatch). One place decides what "a copy with its annotations" means.
//
// Example (copy every node of g into out, same names):
//   std::vector<ValueId> map(g.numValues(), kNoId);   // inputs mapped first
//   for (NodeId n = 0; n < g.numNodes(); ++n) {
//     copyNode(g, n, out, {.value = [&](ValueId v) { return map[v]; }}, map);
//   }
#pragma once

#include <functional>
#include <string>
#include <vector>

#include "ir/graph.h"

namespace modelpar::ir {

/// How copyNode maps what it copies: `value` or `arg` is required.
struct NodeCopyRules {
  /// The value in the destination graph that an argument value of the source
  /// node stands for.
  std::function<ValueId(ValueId)> value;
  /// Instead of `value`: the argument (a value, or a constant) that replaces
  /// an argument value of the source node; its keyword is kept.
  std::function<Arg(ValueId)> arg;
  /// The destination name of a source output or label (default: unchanged).
  std::function<std::string(const std::string&)> name;
  /// The destination type of a source output (default: unchanged).
  std::function<Type(const Type&)> type;
  /// Keep the node's cost (off where the copy does other work, e.g. a
  /// micro-batch's share of a node, whose cost must be estimated again).
  bool keep_cost = true;
};

/// Appends a copy of `src.node(n)` to `dst`: the same op, value arguments
/// mapped through rules.value, outputs (and, for a node without outputs, its
/// label) named by rules.name and typed by rules.type, and the annotations
/// layer, phase, device, micro-batch, the random mark and (with keep_cost)
/// cost. When
/// `output_map` is given, it records output k of the source node (indexed by
/// source ValueId) as the copy's output k. Returns the copy's id. Throws
/// InvalidIrError from Graph::addNode for a taken name.
NodeId copyNode(const Graph& src, NodeId n, Graph& dst, const NodeCopyRules& rules,
                std::vector<ValueId>* output_map = nullptr);

}  // namespace modelpar::ir
