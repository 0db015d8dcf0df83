// Graph segments: how a Program's per-device instruction lists are cut into
// pieces that can each be captured as one CUDA graph and launched from one
// host thread in an order that respects every send -> recv edge. Pure (reads
// only the ir::Program); the CUDA graph replay (cuda_graph_replay.cpp) captures
// one graph per segment, and the tests check the cut on CPU.
//
// Why not always one graph per logical device: a graph that waits on an
// event recorded by another graph must be launched after it (Note [Graph
// replay ordering] in cuda_graph_replay.cpp). A forward + backward pipeline
// has edges both ways between two devices (activations 0 -> 1, gradients
// 1 -> 0), so device 0's whole list cannot be one graph launched either
// before or after device 1's. Cutting before every recv makes the segment
// graph acyclic (a cycle would be a deadlock the verifier rejects); then
// consecutive segments of a device are merged back whenever no path through
// another device connects them. A forward-only pipeline gets exactly one
// segment per device; 0 -> 1 -> 0 gets three.
//
// Example (devices=2, 0 sends %h to 1, 1 sends %g back):
//   device 0: run %h; send %h -> 1; recv %g <- 1; run %u     -> [0:0..2) [0:2..4)
//   device 1: recv %h <- 0; run %g; send %g -> 0             -> [1:0..3)
//   launch order: [0:0..2), [1:0..3), [0:2..4)
#pragma once

#include <cstddef>
#include <string>
#include <vector>

#include "ir/program.h"

namespace modelpar::runtime {

/// Instructions [begin, end) of `device`'s list.
struct GraphSegment {
  int device = 0;
  size_t begin = 0;
  size_t end = 0;
  bool operator==(const GraphSegment&) const = default;
};

/// The segments of every non-empty device list, in a launch order: a
/// topological order of the segment graph (each segment after the previous
/// one of its device and after the segment of every send its recvs match),
/// ties broken by device then position. Each device's segments cover its
/// list exactly, in order. Throws InvalidIrError when the segments form a
/// cycle (a program that would deadlock; ir::verify rejects those).
std::vector<GraphSegment> graphSegments(const ir::Program& p);

/// `[0:0..2) [1:0..3) [0:2..4)`, for messages and tests.
std::string toString(const std::vector<GraphSegment>& segments);

}  // namespace modelpar::runtime
