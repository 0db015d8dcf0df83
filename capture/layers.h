// Layer attribution: naming the module every node of a captured graph belongs
// to, from what the capture knew (scopes) and what the graph shows (which
// parameters a node reads, where its inputs come from).
#pragma once

#include <string>
#include <string_view>
#include <vector>

#include "ir/graph.h"

namespace modelpar::capture {

/// The module path owning a parameter or buffer path: "layer1.0.conv1.weight"
/// -> "layer1.0.conv1"; "weight" -> "".
std::string ownerOf(std::string_view tensor_path);

/// Completes `layer` on every node of `g` that has none. `input_owner[i]` is
/// the module owning graph input i (empty if unknown); `node_seq[n]`, when
/// given, is node n's autograd sequence number (-1 if none). In order:
///   1. a node that already has a layer (a modelpar::Scope or a Python
///      forward hook named it) keeps it;
///   2. a backward node takes the layer of the forward node with its
///      sequence number: the op whose gradient it computes;
///   3. a node reading a parameter or buffer with an owner gets that owner
///      (the first such input in argument order);
///   4. otherwise it inherits from its inputs: a backward node prefers inputs
///      made by forward nodes (saved activations belong to the layer whose
///      gradient it computes, the incoming gradient to the next layer), any
///      other node takes the first input that has a layer.
/// Nodes with no evidence keep an empty layer. Never changes anything but
/// `Node::layer`.
void attributeLayers(ir::Graph& g, const std::vector<std::string>& input_owner,
                     const std::vector<int64_t>& node_seq = {});

}  // namespace modelpar::capture
