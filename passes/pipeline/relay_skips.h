// Pass `relay-skips`: torchgpipe's pipeline without portals (seed 002 §3.3.1,
// Figure 6a). A value that skips stages is forwarded stage by stage: one
// identity copy (`aten::alias`) per intermediate stage, each reading the
// previous one, so every transfer goes between neighbouring stages.
//
// Portals are the default and need no pass: `lower` sends a value once from
// its producer's device straight to each reader's device, so a skip tensor
// from stage 0 to stage 3 never touches stages 1-2, and its gradient (a value
// of stage 3's backward read on stage 0) goes straight back. This pass is the
// opposite, for comparison (simulate the relay transfers and memory).
//
// Which values. The tensor output v of a micro-batch node (one with `mb`) on
// stage p, read on a stage r:
//   * v forward (phase fwd or none) and r > p + 1: copies on p+1 .. R-1
//     (R = the farthest such reader); a reader on r reads the copy on r-1;
//   * v backward or recompute and r < p - 1: copies on p-1 .. R+1 downwards;
//     a reader on r reads the copy on r+1.
// Other crossings (a forward value read by a backward node on a much earlier
// stage) stay direct, and so do scalars (a micro-batch's size, `int`): the
// relay forwards activations, and `alias` of an int is a 0-dim tensor. A copy
// is `%<v>.relay<stage> = aten::alias(...)` with v's layer, phase and mb and
// cost {time_us=0, out=0, temp=0, persist=0}:
// `alias` is a view, so an intermediate stage holds the received copy only
// (as torchgpipe's pass-through layer does), and the interpreter runs it as
// ATen's alias. Copies follow their value in graph order.
//
// Preconditions: stage_of_node has one entry per node (ConfigError
// otherwise). Guarantees: a new graph computing the same values (the
// caller's is unchanged), node ids remapped, stages of the copies appended
// per node. Example: stages {0, 1, 2, 3} with %skip (stage 0) read by %cat
// (stage 3) -> %skip.relay1 (stage 1), %skip.relay2 (stage 2), %cat reads
// %skip.relay2.
#pragma once

#include <cstdint>
#include <string_view>
#include <vector>

#include "ir/graph.h"

namespace modelpar::passes {

inline constexpr std::string_view kRelaySkipsPassId = "relay-skips";

struct RelayedGraph {
  ir::Graph graph;
  std::vector<int32_t> stage_of_node;  ///< per NodeId of `graph`
  int64_t num_copies = 0;
};

RelayedGraph relaySkips(const ir::Graph& g, const std::vector<int32_t>& stage_of_node);

}  // namespace modelpar::passes
