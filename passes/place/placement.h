// Placement: what every placer returns (a device for every node, the order
// each device runs its nodes in, and the placer's own estimates), and the
// check that a placement covers a graph.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "ir/graph.h"

namespace modelpar::passes {

/// A placement of a graph's nodes on logical devices 0..num_devices-1.
/// Invariants (checkPlacement): every node appears in exactly one device's
/// order, on the device node_device names; each order respects the graph's
/// dependencies among its own nodes.
///
/// Example (two devices, %a ; %b -> %c):
///   p.node_device = {0, 1, 1};
///   p.order = {{a}, {b, c}};
///   p.input_device = {0, 1};   // %x lives on 0, %w on 1
struct Placement {
  std::string placer;                          ///< pass id that made it
  int num_devices = 0;
  std::vector<int32_t> node_device;            ///< per NodeId
  std::vector<std::vector<ir::NodeId>> order;  ///< per device, execution order
  /// Per index into Graph::inputs(): the device the input lives on; -1 lets
  /// lowering choose (the device of its first user).
  std::vector<int32_t> input_device;
  std::vector<double> start_us;                ///< per node, the placer's estimate
  double makespan_us = 0;                      ///< the placer's estimate
  /// Per device, the placer's bound on peak memory (Note [Memory model]).
  std::vector<int64_t> peak_bytes;
};

/// Throws ConfigError naming the node when p does not place g: sizes differ,
/// a device is out of range, a node is missing, repeated or in the wrong
/// device's order, or a device's order runs a node before one it depends on.
void checkPlacement(const ir::Graph& g, const Placement& p);

/// Per index into g.inputs(): the device the input is bound on when p is
/// lowered (lower.h): p.input_device where set (>= 0), else the device of
/// its first reader in graph order, else 0. The one rule for it: lowering,
/// the phases split from a pipeline (split_phases.h) and the in-place writes
/// to inputs (plan_placement.cpp) all follow it.
std::vector<int32_t> boundInputDevices(const ir::Graph& g, const Placement& p);

}  // namespace modelpar::passes
