// Pass `place-mtopo`: Baechi's memory-constrained topological placement
// (algorithms.md §1.5).
//
// Walks the tasks in topological (BFS) order and fills device 0, then 1, ...
// while the next task fits: a contiguous split of the order that ignores
// compute and communication times. A task's memory is static (Baechi): its
// outputs + temporaries + persistent bytes + the copies it receives + the
// graph inputs it homes, summed without frees, so the simulated peak never
// exceeds it. Caps per device:
//   uniform (default): min(capacity, total / N + largest group), which
//                      balances memory over the devices (the last device
//                      takes the remainder, up to its capacity, since the
//                      share leaves out received copies);
//   non-uniform:       each device's own capacity (fill to the brim).
// Colocation: a group's whole memory is charged when its first task is met;
// later tasks of the group follow it (and must still fit the real capacity).
//
// Preconditions: a cost on every node. Guarantees: a valid placement; per
// device order = topological order; makespan estimated by replaying the
// placement through the list scheduler's timing model. Throws
// PlanDoesNotFitError naming the layer, device, bytes needed and available
// when tasks remain after the last device.
#pragma once

#include <string_view>

#include "ir/graph.h"
#include "passes/cost/device_model.h"
#include "passes/place/coarsen.h"
#include "passes/place/placement.h"
#include "passes/place/task_graph.h"

namespace modelpar::passes {

inline constexpr std::string_view kMTopoPassId = "place-mtopo";

struct MTopoOptions {
  /// Placement units and groups; null: one unit per node, groups by layer.
  const Coarsening* units = nullptr;
  /// Balance memory (Baechi's m_topo) or fill each device to its capacity
  /// (m_topo_nonuniform).
  bool uniform = true;
};

Placement placeMTopo(const ir::Graph& g, const DeviceModel& machine,
                     const MTopoOptions& options = {});
Placement placeMTopo(const ir::Graph& g, const TaskGraph& tg, const DeviceModel& machine,
                     bool uniform = true);

}  // namespace modelpar::passes
