// Pass `split-phases`: a placed training step -> two Programs, the part
// before the backward and the rest, for fill-drain pipelines run across
// AOTAutograd's two calls under torch.compile.
//
// Why. AOTAutograd calls the forward, hands its outputs to the user's code
// (which computes the loss and calls backward), then calls the backward with
// the outputs' gradients. A GPipe step (seed 002 §3.2: every micro-batch's
// forward, then every backward) fits that split exactly: on every device the
// forward tasks come before the backward tasks, so the per-device orders of
// the pipelined step, restricted to either part, are still projections of
// one global order (the lowered Programs verify and cannot deadlock).
//
// Parts. The second part is every backward or recompute node and every node
// reading (transitively) one of its outputs (gradient sums, updates); the
// first is the rest (nodes without a phase count as forward). Then:
//   * first: the inputs its nodes read, its nodes, and as outputs the step's
//     outputs it makes (or passes through), then the *carried* values: its
//     node outputs the second part reads (saved activations per micro-batch,
//     the tangents' partners), each once;
//   * both: a step input the placement leaves unbound (-1) is bound where
//     lower() binds it in the whole step, on its first reader in graph order,
//     so a weight read on two stages has one home in both programs;
//   * second: the step's inputs its nodes read (same names and roles), then
//     one `input` per carried value (same name and type) bound on the device
//     of the node that made it, so nothing moves between the two programs;
//     its outputs are the step's outputs it makes.
// Every node keeps its device and its place in its device's order; lowering
// adds the transfers inside each part. Carried values stay alive between the
// two calls (the memory a fill-drain step keeps anyway).
//
// Preconditions: checkPlacement(g, p). Guarantees: both Programs verify;
// running first, then second with the carried values, returns g's outputs
// (first's and second's together, by name); g is not modified.
//
// Example:
//   PhaseSplit s = splitPhases(plan.graph, plan.placement);
//   forward call: run s.first;  backward call: run s.second with
//   (its step inputs, the tangents, s.carried by name from first's outputs).
#pragma once

#include <string>
#include <string_view>
#include <vector>

#include "ir/graph.h"
#include "ir/program.h"
#include "passes/lower/lower.h"
#include "passes/place/placement.h"

namespace modelpar::passes {

inline constexpr std::string_view kSplitPhasesPassId = "split-phases";

struct PhaseSplit {
  ir::Program first{ir::Graph("first"), 1};
  ir::Program second{ir::Graph("second"), 1};
  /// The values first returns for second, by name (after the step's outputs).
  std::vector<std::string> carried;
};

/// Splits g, placed by p, into its two parts (see the file comment).
/// Throws ConfigError when p does not place g.
PhaseSplit splitPhases(const ir::Graph& g, const Placement& p, const LowerOptions& lo = {});

}  // namespace modelpar::passes
