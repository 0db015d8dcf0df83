// Making a captured step's batch dimension symbolic, so that passes'
// planPipeline can micro-batch it (microbatch.h needs `f32[B, ...]`). The
// device records concrete sizes; this finds the batch size B from the data
// inputs, writes `B` for it in the types of every value computed from them,
// and turns the size arguments equal to B (a `view(h, [B, 216])`) into reads
// of an `int` input `%B`. Uses no PyTorch: ir/ only.
//
// It is a heuristic on sizes, so it refuses what it cannot decide (a
// ConfigError naming the clash): B must differ from every parameter, buffer
// and unbatched input dimension, from every other dimension of a batched
// value, and be larger than the rank of every batched value (so that a dim
// argument `1` or `3` is never taken for the batch). What it cannot see, a
// number computed from B (a mean's backward dividing by the element count),
// the device catches by running the first pipelined step beside the
// unpipelined one (step_runner.cpp).
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "ir/graph.h"

namespace modelpar::backend {

inline constexpr char kBatchSymbol[] = "B";

struct SymbolicBatch {
  /// The step with `B` for the batch size; its inputs are the step's, then
  /// `%B: int input` when a size argument reads it (has_size_input).
  ir::Graph graph{"step"};
  int64_t batch_size = 0;
  /// Names of the batched inputs (batch dimension 0).
  std::vector<std::string> batched_inputs;
  bool has_size_input = false;
  /// Nodes turned into the backward seed (`ones_like(loss)`, recorded
  /// before the backward started, gets phase bwd).
  int seed_nodes = 0;
};

/// Makes `g`'s batch dimension symbolic. `batched_inputs`: the names of the
/// inputs whose dimension 0 is the batch; empty: every data input (role
/// input, a tensor of rank >= 1 read by a forward node: not optimizer state)
/// whose leading dimension is the one they all share. Throws ConfigError for no data input, data inputs with
/// different leading sizes (asking for batched_inputs), an unknown or
/// unbatchable name, or a batch size that clashes (see the file comment).
SymbolicBatch makeBatchSymbolic(const ir::Graph& g, const std::vector<std::string>& batched_inputs);

}  // namespace modelpar::backend
