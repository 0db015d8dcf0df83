// Pass `schedule`: a micro-batched training step graph whose nodes are split
// into pipeline stages -> a Placement (device and order per node) that
// `lower` turns into a Program with explicit sends and receives per
// micro-batch, for GPipe (seed 002 §3.2, Algorithm 1), 1F1B (algorithms.md
// §5.2), MadPipe's 1F1B* (seed 004 §4.1), Megatron-LM's interleaved 1F1B
// (Narayanan et al. 2021, §2.2.2) and zero bubble's ZB-H1 and ZB-V (Qi et
// al. 2024, §3.1 and §6). The pipeline is an explicit
// per-device program (seed 003), so the simulator and executors need nothing
// new.
//
// Terms. m micro-batches (1 + the largest `mb`), n stages (the size of
// device_of_stage, else 1 + the largest stage). A task is (stage, micro-batch,
// F or B): the nodes with that `mb` on that stage, phase fwd (or none) for F,
// bwd or recompute for B; under zb-h1 and zb-v the backward is split into B, what the
// gradient sent to the previous stage needs, and W, the rest (weight
// gradients and their sums; Note [Backward split], backward_split.h). In a
// B task, recompute nodes come first (in graph
// order, as long as they read no backward node of the task), then the rest in
// graph order: recomputation overlaps the incoming gradient's transfer
// (torchgpipe's separate Recompute, seed 002 §3.2.4). Nodes without `mb`:
//   * shared: read no micro-batch node (`t(w)` of a weight). They run right
//     before their first reader in the schedule, on that reader's stage;
//     stage_of_node is ignored for them (may be -1), except for a shared node
//     nobody reads, which runs first on its stage (0 if -1);
//   * final: phase update, or reading a micro-batch or final node (gradient
//     combination, loss sum, optimizer). They run after every task, in graph
//     order, on stage_of_node's stage.
//
// Per-stage task order, w = in-flight micro-batches (warm-up forwards):
//   gpipe   F0 F1 .. F(m-1) B(m-1) .. B0       (torchgpipe's fork/join order)
//   1f1b    w = min(n - s, m): F0 .. F(w-1), then B(j) F(j+w) alternating,
//           then the remaining B's          (PipeDream-flush / Megatron 1F1B)
//   1f1b*   the same with w = min(in_flight[s], m) (MadPipe's group numbers);
//           with a `pattern` (MadPipe's phase 2), every stage's and every
//           device's tasks in the order of the pattern's start times
//           (Note [Lowering the periodic pattern])
// e.g. n=3, m=4, 1f1b:  stage 0: F0 F1 F2 B0 F3 B1 B2 B3
//                       stage 1: F0 F1 B0 F2 B1 F3 B2 B3
//                       stage 2: F0 B0 F1 B1 F2 B2 F3 B3
// Per-device task order of interleaved 1F1B: p devices (1 + the largest of
// device_of_stage), n = p·v stages, stage s on device s % p (device d holds
// chunks c = 0..v-1, stage c·p + d); micro-batches in max(1, floor(m/p))
// rounds of consecutive ones, r in the first (Note [Interleaved 1F1B] in
// schedule_interleaved.cpp):
//   forwards  per round: chunk 0..v-1, per chunk the round's micro-batches
//   backwards per round: chunk v-1..0, per chunk the round's micro-batches
//   order     w = min((v-1)·r + 2(p-1-d), m·v) forwards, then one forward and
//             one backward alternating, then the remaining backwards; w is
//             raised on every device, one at a time, while the order cannot
//             run
// e.g. p=2, v=2, m=4 ("F2.1": stage 2, micro-batch 1):
//   device 0: F0.0 F0.1 F2.0 F2.1 F0.2 B2.0 F0.3 B2.1 F2.2 B0.0 F2.3 B0.1 B2.2 B2.3 B0.2 B0.3
//   device 1: F1.0 F1.1 F3.0 B3.0 F3.1 B3.1 F1.2 B1.0 F1.3 B1.1 F3.2 B3.2 F3.3 B3.3 B1.2 B1.3
// Bubble with uniform stages and free transfers: (p-1)/(v·m + p-1) for m >= p
// (1F1B's is (p-1)/(m + p-1)).
// Per-stage task order of zb-h1 (one stage per device; Note [ZB-H1] in
// schedule_zero_bubble.cpp), w = min(n - s, m) as 1F1B, d = s:
//   zb-h1   F0 .. F(w-1); then for j = 0..m-1: B(j), W(j-d) if j >= d,
//           F(j+w) if j+w < m; then the W's left, in micro-batch order
// e.g. n=3, m=4:        stage 0: F0 F1 F2 B0 W0 F3 B1 W1 B2 W2 B3 W3
//                       stage 1: F0 F1 B0 F2 B1 W0 F3 B2 W1 B3 W2 W3
//                       stage 2: F0 B0 F1 B1 F2 B2 W0 F3 B3 W1 W2 W3
// With F = B = W = 1 and free transfers the step is 3m + (p-1) for m >= p
// (1F1B's 3(m + p-1)): the paper's bubble (p-1)(T_F + T_B - T_W).
// Per-device task order of zb-v: p devices, n = 2p stages placed in a V,
// stage s on device s for s < p and on device 2p-1-s after (device d holds
// chunk 0 = stage d and chunk 1 = stage 2p-1-d); B/W split as zb-h1; per
// (chunk, kind) micro-batch counters from 0, m' = max(m, 2p-1), then the
// tasks of micro-batches >= m dropped (Note [ZB-V] in schedule_zbv.cpp):
//   warm-up   2(p-d)-1 x F0; d x (F1 F0); p-d x (F1 B1 W1)
//   steady    while chunk 1 has fewer forwards than chunk 0 or chunk 0 has
//             forwards left: F0 (if left), B0 W0, F1 B1 W1
//   cool-down d x (B0 B1); p-d x (B0 W0); the W1's left; the W0's left
// e.g. p=2, m=4 ("B3.1": stage 3's B of micro-batch 1):
//   device 0: F0.0 F0.1 F0.2 F3.0 B3.0 W3.0 F3.1 B3.1 W3.1 F0.3 B0.0 W0.0
//             F3.2 B3.2 W3.2 B0.1 W0.1 F3.3 B3.3 W3.3 B0.2 W0.2 B0.3 W0.3
//   device 1: F1.0 F2.0 F1.1 F2.1 B2.0 W2.0 F1.2 B1.0 W1.0 F2.2 B2.1 W2.1
//             F1.3 B1.1 W1.1 F2.3 B2.2 W2.2 B1.2 B2.3 B1.3 W1.2 W2.3 W1.3
// With F = B = W = 1 per chunk and free transfers the step is
// max(6m + p-1, 4(m + p) - 2), 6m + p-1 for m >= 2p-1 (1F1B on p stages of
// two chunks: 6(m + p-1); zb-h1: 6m + 2(p-1)).
//
// Note [Global clock]
// ~~~~~~~~~~~~~~~~~~~
// Every task gets a clock tick: tick by tick, each stage starts its next task
// if every task it reads from started at an earlier tick (data dependencies
// between tasks come from the graph's edges); under interleaved 1F1B and
// ZB-V each device does, in its own order (a lane per device instead of
// per stage); a task that waits forever is answered by a longer warm-up
// under interleaved 1F1B (Note [Interleaved 1F1B]), by a ConfigError under
// ZB-V, whose order is fixed (Note [ZB-V]). For GPipe's forwards this is
// torchgpipe's deterministic clock cycle: F(stage j, micro-batch i) at tick
// i + j. Each device runs its stages' tasks sorted by (tick, stage), so a
// device hosting several stages (MadPipe's special processor) interleaves
// them in global clock order. All device orders are projections of one global
// order consistent with the graph, hence the lowered Program verifies and
// cannot deadlock.
//
// Preconditions (ConfigError naming the node, stage or option otherwise):
// stage_of_node has one entry per node; every stage has a device; a forward
// edge never goes to an earlier stage and a backward edge never to a later
// one; no forward node reads a backward node; no micro-batch node reads a
// final node; zb-h1: each stage on a device of its own; zb-v: n = 2p stages
// with device_of_stage[s] == s for s < p and 2p-1-s after (the V); 1f1b*:
// in_flight has one entry >= 1 per stage, not increasing along forward
// edges (after clamping to m); interleaved: device_of_stage[s]
// == s % p for each of the n = p·v stages; the task order is not circular
// (e.g. chained cross-micro-batch dependencies under GPipe's reversed
// backward order). Guarantees: checkPlacement holds; the lowered Program
// verifies. Does not: estimate times (start_us is empty; simulate the lowered
// Program), change the graph, or relay values (portals, see lowerPipeline).
//
// Example:
//   PipelineScheduleOptions o;
//   o.kind = "1f1b";
//   o.stage_of_node = stages;          // per NodeId
//   o.device_of_stage = {0, 1, 2, 0};  // stages 0 and 3 share device 0
//   ir::Program p = lower(g, schedulePipeline(g, o));
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "ir/graph.h"
#include "ir/program.h"
#include "passes/lower/lower.h"
#include "passes/place/placement.h"

namespace modelpar::passes {

inline constexpr std::string_view kSchedulePassId = "schedule";

/// MadPipe's periodic pattern (seed 004 §3; partition.h PeriodicPattern,
/// computed by phase 2 when stages share a device): micro-batch k's forward
/// on stage s starts at (k + fwd_shift[s]) * period + fwd_start[s], its
/// backward alike.
struct PatternTimes {
  double period_us = 0;
  std::vector<double> fwd_start_us, bwd_start_us;  ///< per stage, in [0, period]
  std::vector<int> fwd_shift, bwd_shift;           ///< per stage
};

struct PipelineScheduleOptions {
  /// "gpipe" | "1f1b" | "1f1b*" | "interleaved" (v = n / p stages per
  /// device, placed looping: see device_of_stage) | "zb-h1" (one stage per
  /// device, backwards split into B and W) | "zb-v" (2 stages per device
  /// placed in a V, backwards split into B and W).
  std::string kind = "gpipe";
  /// Per NodeId, the stage that runs it (-1 allowed for shared nodes).
  std::vector<int32_t> stage_of_node;
  /// Per stage, its logical device; empty: stage i on device i.
  /// "interleaved": stage s on device s % p, p = 1 + the largest device.
  /// "zb-v": n = 2p, stage s on device s for s < p, 2p-1-s after (no
  /// default: give it).
  std::vector<int32_t> device_of_stage;
  /// 1f1b* only: per stage, the micro-batches it keeps in flight.
  std::vector<int> in_flight;
  /// 1f1b* only, optional: the periodic pattern to run (one entry per stage).
  std::optional<PatternTimes> pattern;
  /// lowerPipeline only: forward values crossing several stages stage by
  /// stage (torchgpipe without portals, relay_skips.h) instead of sending
  /// them straight to their readers (portals, the default).
  bool relay_skips = false;
};

/// The Placement of a pipelined step (see above). Throws ConfigError when
/// options.relay_skips is set (relaying rewrites the graph: use
/// lowerPipeline).
Placement schedulePipeline(const ir::Graph& g, const PipelineScheduleOptions& options);

/// Relaying (if asked), scheduling and lowering in one call.
struct PipelineProgram {
  ir::Graph graph;                     ///< the scheduled graph (with relay copies)
  std::vector<int32_t> stage_of_node;  ///< per NodeId of `graph`
  Placement placement;
  ir::Program program;
};
PipelineProgram lowerPipeline(const ir::Graph& g, const PipelineScheduleOptions& options,
                              const LowerOptions& lower_options = {});

}  // namespace modelpar::passes
