// The backward split of zero-bubble pipelining (Qi et al., Zero Bubble
// Pipeline Parallelism, ICLR 2024, §2): each backward task of a micro-batched,
// staged step cut into B, what the gradient sent back to the previous stage
// needs, and W, what only the weight gradients (and their sums over
// micro-batches) need. A pure function of the graph and the stages; the
// `schedule` pass runs it for "zb-h1" (Note [Backward split]).
//
// Terms (as in schedule.h). The backward task (s, k): the nodes with mb=k,
// phase bwd or recompute, on stage s. A node of it is in B when a value read
// by a node of another stage's task (one with an mb, on another stage) is
// reachable from it through nodes of the task (itself included); else in W.
//
// Preconditions: stage_of_node has one entry per node (ConfigError
// otherwise); the graph's nodes are in SSA order (producers first).
// Guarantees: B is closed under "read by": a node of the task that a B node
// reads is in B, so W never feeds B within a task; every node of a task is in
// exactly one part; nodes outside backward tasks are in neither. Does not:
// change the graph, or look at the order of micro-batches (an edge from a
// task's W to a later micro-batch's B on the same stage is the clock's to
// refuse).
//
// Example (a linear layer y = x·wᵀ + b on stage 1, x from stage 0):
//   %gx.mb0 = aten::mm(%gy.mb0, %w)              B: read by stage 0's task
//   %gw.mb0 = aten::mm(%gyt.mb0, %x.mb0)         W
//   %gb.mb0 = aten::sum(%gy.mb0, [0])            W
#pragma once

#include <cstdint>
#include <span>
#include <string_view>
#include <vector>

#include "ir/graph.h"

namespace modelpar::passes {

inline constexpr std::string_view kBackwardSplitId = "backward-split";

/// The part of a node: not in a backward task (None), or B or W of its task.
enum class BackwardPart : uint8_t { None, B, W };

struct BackwardSplit {
  std::vector<BackwardPart> part;  ///< per NodeId
  int64_t num_b = 0, num_w = 0;    ///< nodes in B and in W, over all tasks
};

/// Note [Backward split]. stage_of_node: per NodeId (shared nodes may have -1).
BackwardSplit splitBackward(const ir::Graph& g, std::span<const int32_t> stage_of_node);

}  // namespace modelpar::passes
