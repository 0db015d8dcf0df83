// Interpreter: the reference executor of an ir::Graph. It runs the nodes in
// graph order on the caller's thread, calling each ATen operator through the
// c10 dispatcher, and drops every intermediate value after its last use.
#pragma once

#include <vector>

#include <ATen/core/ivalue.h>

#include "ir/graph.h"
#include "runtime/op_call.h"

namespace modelpar::runtime {

/// Example:
///   ir::Graph g = ir::parseGraph(R"(
///     graph @lin(%x: f32[B, 16] input, %w: f32[32, 16] param) {
///       %wt: f32[16, 32] = aten::t(%w)
///       %y: f32[B, 32] = aten::mm(%x, %wt)
///       return %y
///     })");
///   Interpreter interp(g);                         // resolves aten::t, aten::mm
///   std::vector<c10::IValue> out = interp.run({x, w});
///
/// Values alias as they do in eager mode: in-place ops and views return the
/// tensor they were given, so `%b = aten::relu_(%a)` leaves %a and %b the
/// same tensor.
class Interpreter {
 public:
  /// Verifies `g` (ir::verify), copies it and resolves every node once.
  /// Throws InvalidIrError for a graph that breaks an invariant or a node
  /// whose arguments do not fit its schema; UnsupportedOpError for an
  /// unknown operator.
  explicit Interpreter(const ir::Graph& g);

  /// Runs the graph on `inputs` (one per graph input, in order: tensors for
  /// tensor inputs, IValue ints/doubles/bools for scalar ones) and returns one
  /// value per graph output. Thread-safe: `run` keeps no state between calls.
  /// Throws ExecutionError when an input does not have its declared type
  /// (naming the input and both types) or an operator fails (naming the node
  /// and operator, with the operator's message).
  std::vector<c10::IValue> run(std::vector<c10::IValue> inputs) const;

  const ir::Graph& graph() const { return graph_; }
  /// For each node, the values dropped right after it ran: those whose last
  /// reader it is, and its outputs nobody reads; graph outputs are never
  /// dropped.
  const std::vector<std::vector<ir::ValueId>>& dropsAfter() const { return drops_after_; }

 private:
  ir::Graph graph_;
  std::vector<ResolvedOp> ops_;
  std::vector<std::vector<ir::ValueId>> drops_after_;
};

}  // namespace modelpar::runtime
