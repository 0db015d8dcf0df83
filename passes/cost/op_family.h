// What passes/ knows about an ATen operator without running it: its family
// (which cost formula applies) and whether its outputs alias its first input
// (views and in-place ops), which decides what a value allocates.
#pragma once

#include <cstdint>
#include <string_view>
#include <vector>

#include "ir/graph.h"

namespace modelpar::passes {

/// Cost-formula family of an operator (cost_model.h gives each its formula).
enum class OpFamily : uint8_t {
  MatMul,       ///< mm, addmm, bmm, baddbmm, matmul, linear, mv, dot
  Convolution,  ///< convolution, conv{1,2,3}d, convolution_backward, ...
  Attention,    ///< scaled_dot_product_attention and its fused kernels
  Elementwise,  ///< pointwise math, activations, comparisons, dropout, _foreach_*
  Reduction,    ///< sums, means, norms, softmax, losses
  Copy,         ///< clone, _to_copy, cat, index/gather, embedding, factories
  View,         ///< view, reshape, transpose, slice, split, ...: no data moved
  Other,        ///< not modelled: the cost pass uses its default
};
std::string_view name(OpFamily f);

/// Family of a qualified op name without overload ("aten::addmm").
OpFamily classifyOp(std::string_view op);

/// True for in-place ops: the name after "::" ends in '_' (aten::add_,
/// aten::_foreach_mul_). Their outputs are their first input.
bool isInPlaceOp(std::string_view op);

/// The graph input node `n` writes in place: the storage root (`roots`, from
/// storageRoots) of its first argument when `n` is an in-place op and that
/// root is a graph input; else kNoId (Note [In-place writes to graph inputs]
/// in plan_placement.cpp).
ir::ValueId writtenInput(const ir::Graph& g, const ir::Node& n,
                         const std::vector<ir::ValueId>& roots);

/// True when the node's outputs share the storage of its first tensor input
/// (View family or in-place).
bool aliasesInput(const ir::Node& n);

/// Bytes a value allocates where it is produced: 0 for an output of an
/// aliasing node, else storageBytes. Graph inputs count their size. Note
/// [Memory model] in task_graph.h uses this.
int64_t allocBytes(const ir::Graph& g, ir::ValueId v);

/// Bytes of the storage a fresh (non-aliasing) value holds: its dense size
/// (0 for a symbolic shape), except the reduced output of a loss whose ATen
/// kernel returns it on the element-wise buffer, which holds its first
/// input's dense size (Note [Reduced losses keep their element-wise buffer]).
int64_t storageBytes(const ir::Graph& g, ir::ValueId v);

/// Bytes a copy of v takes on a device that receives it: its dense size
/// (a received view is materialised), 0 when symbolic.
int64_t denseBytes(const ir::Graph& g, ir::ValueId v);

/// For each value, the value whose storage it aliases directly (the first
/// tensor input of its aliasing producer), or kNoId.
std::vector<ir::ValueId> aliasBases(const ir::Graph& g);

/// For each value, the root of its storage class: follows aliasBases to a
/// value that allocates (or a graph input).
std::vector<ir::ValueId> storageRoots(const ir::Graph& g);

/// Write-after-read order an in-place node needs beyond data edges: an edge
/// (m, n) for every earlier node m that reads the storage n mutates (n's first
/// tensor argument, or every tensor of a first list argument for _foreach_
/// ops), back to the previous in-place writer. Edges point forward in graph
/// order.
std::vector<std::pair<ir::NodeId, ir::NodeId>> inPlaceOrderEdges(const ir::Graph& g);

}  // namespace modelpar::passes
