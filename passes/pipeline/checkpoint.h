// Pass `checkpoint`: activation checkpointing of a micro-batched graph by
// stage (GPipe's re-materialisation as torchgpipe implements it, seed 002
// §2.1 and §3.2.4: the forward F_{i,j} of micro-batch i on stage j is
// recomputed as F'_{i,j} right before B_{i,j}; the recomputation is its own
// step, separate from the backward, so that a schedule can overlap it with
// the transfer of the incoming gradient).
//
// For each checkpointed (stage s, micro-batch k): the forward nodes of s and
// k whose results the backward reads are copied with phase=recompute (same
// mb, layer, device, cost), together with the forward nodes of s and k they
// need; the copies read the stage's inputs (values from other stages, shared
// values, graph inputs: these stay stored) and each other, and every
// backward node of stage s reads the copies instead (a backward node on
// another stage keeps reading its stored stage input: reading s's copy would
// make it wait for s's recompute, which waits for its gradient). The
// forward's own activations then
// die right after the forward (lowering frees values after their last use).
// In graph order a group's copies sit right before its first backward reader.
//
// Note [Recompute and randomness]. torchgpipe restores the RNG state before
// recomputing so that dropout draws the same mask twice. Here a random op
// (native_dropout, bernoulli, rand*, ...) is never recomputed: its outputs
// (the mask) stay stored and the recomputed nodes read them, which gives the
// same values without touching generator state. Likewise in-place ops and
// nodes touching storage that a non-update in-place op mutates are not
// recomputed (their inputs would have changed in between).
//
// Modes: `always` (every micro-batch), `except_last` (all but the last: its
// forward is the last thing the stage ran, so recomputing it frees nothing
// — torchgpipe's default, seed 002 §2.1), `never` (graph unchanged).
//
// Per layer (CheckpointOptions::layers): only the forward nodes of the
// named layers are recomputed; a recomputed node reads the stored values of
// layers left out, as it reads the stage's inputs (a layer's input is what
// it keeps, torch.utils.checkpoint's rule). planPipeline's
// checkpoint='per_layer' chooses the set under a memory limit (Note
// [Recompute per layer], plan_pipeline.cpp).
//
// Preconditions: nodes carry phase and mb (a `microbatch` result), one stage
// per node (checked: ConfigError); a micro-batch's forward nodes come before
// its backward nodes in graph order (InvalidIrError otherwise).
// Guarantees: the caller's graph is not modified; the result verifies and
// computes the same values.
//
// Example (stage 0 runs fc1; micro-batches 0 and 1; except_last):
//   %h.mb0 = aten::mm(%x.mb0, %w1)   {phase=fwd, mb=0}   read by the backward
//   %a.mb0 = aten::relu(%h.mb0)      {phase=fwd, mb=0}   read by the backward
//   ... micro-batch 1, the loss, the backward of micro-batch 1 ...
//   %h.mb0.rc = aten::mm(%x.mb0, %w1) {phase=recompute, mb=0}   <- inserted here
//   %a.mb0.rc = aten::relu(%h.mb0.rc) {phase=recompute, mb=0}
//   %dh.mb0 = aten::threshold_backward(%da.mb0, %a.mb0.rc, 0) {phase=bwd, mb=0}
#pragma once

#include <cstdint>
#include <optional>
#include <set>
#include <string>
#include <string_view>
#include <vector>

#include "ir/graph.h"

namespace modelpar::passes {

inline constexpr std::string_view kCheckpointPassId = "checkpoint";

enum class CheckpointMode : uint8_t { Always, ExceptLast, Never };

/// "always" | "except_last" | "never"; ConfigError otherwise.
CheckpointMode parseCheckpointMode(std::string_view s);
std::string_view name(CheckpointMode m);

struct CheckpointOptions {
  CheckpointMode mode = CheckpointMode::ExceptLast;
  /// Only these layers are recomputed (by `layer` attribute), in the
  /// micro-batches `mode` checkpoints; unset: every layer.
  std::optional<std::set<std::string, std::less<>>> layers;
};

/// The recompute nodes of one (stage, micro-batch), in graph order: what a
/// schedule puts right before that micro-batch's backward on that stage.
struct RecomputeGroup {
  int32_t stage = 0;
  int microbatch = 0;
  std::vector<ir::NodeId> nodes;  ///< in the result graph
};

struct CheckpointResult {
  ir::Graph graph;
  /// Per node of `graph`: originals keep their stage, copies their group's.
  std::vector<int32_t> stage_of_node;
  /// Ordered by first node; empty groups (nothing to recompute) omitted.
  std::vector<RecomputeGroup> groups;
};

/// Checkpoints g (see the file comment). stage_of_node: one stage >= 0 per
/// node of g. Throws ConfigError for a stage list that does not fit g or a
/// graph that already has recompute nodes.
CheckpointResult checkpoint(const ir::Graph& g, const std::vector<int32_t>& stage_of_node,
                            const CheckpointOptions& options = {});

}  // namespace modelpar::passes
