// Pass `lower`: Graph + Placement -> Program with explicit communication, in
// the placer's per-device order (DistIR's explicit distributed program, seed
// 003 §2; Baechi-PyTorch's send-once-per-child-device protocol, seed 000
// §1.3.3).
//
// For each device, in the placement's order:
//   * a graph input lives on placement.input_device, else on the device of
//     its first reader in graph order, else device 0; it is sent to every
//     other device that reads it at the very start of its device's list;
//   * before a node, `recv` each value it reads that is not yet on the
//     device (from the value's home: its producer's device or the input's);
//   * the node runs (`run`); its `device` attribute is set;
//   * right after it, `send` each output once to every other device that
//     reads it, destinations in increasing order;
//   * with emit_frees, `free` each storage right after its last use on the
//     device (liveness.h: views keep their base alive; graph outputs stay on
//     the device that produced them, parameters and buffers where they
//     live), and each view after its own last use.
// Preconditions: checkPlacement(g, placement) holds (checked). Guarantees:
// the result passes ir::verify when the per-device orders come from one
// global order consistent with the graph (every placer's do); the caller's
// graph is not modified. Does not: forward values through intermediate
// devices, batch transfers, or order sends by their consumers' times.
#pragma once

#include <string_view>

#include "ir/graph.h"
#include "ir/program.h"
#include "passes/place/placement.h"

namespace modelpar::passes {

inline constexpr std::string_view kLowerPassId = "lower";

struct LowerOptions {
  bool emit_frees = true;
};

ir::Program lower(const ir::Graph& g, const Placement& placement, const LowerOptions& options = {});

}  // namespace modelpar::passes
