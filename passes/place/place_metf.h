// Pass `place-metf`: Baechi's memory-constrained Earliest Task First
// (algorithms.md §1.6; Hwang, Chow, Anger & Lee's ETF with memory limits).
//
// An event-driven list scheduler that simulates the step while it places:
// at each instant, among ready tasks (all predecessors finished) and free
// devices, it takes the (task, device) pair with the earliest start time,
// data transfers included (list_scheduler.h: one channel per device, each
// tensor sent once per destination), skipping devices where the task does
// not fit in memory (Note [Memory model], each device's own capacity). Ties
// go to the task first in topological (BFS) order, then the lower device.
// Colocation: a group is placed whole, on the device its first task takes.
//
// Preconditions: a cost on every node (pass `cost`); the machine has 1 to 64
// devices. Guarantees: a valid placement (checkPlacement) whose per-device
// orders follow simulated start times; the simulated peak memory of the
// lowered program stays within each device's capacity. Throws
// PlanDoesNotFitError naming the layer, device, bytes needed and available
// when no ready task fits anywhere. Does not: look ahead, backtrack, or
// reserve memory for groups' future tasks (Baechi's *_reserve variants).
#pragma once

#include <string_view>

#include "ir/graph.h"
#include "passes/cost/device_model.h"
#include "passes/place/coarsen.h"
#include "passes/place/placement.h"
#include "passes/place/task_graph.h"

namespace modelpar::passes {

inline constexpr std::string_view kMEtfPassId = "place-metf";

struct MEtfOptions {
  /// Placement units and groups; null: one unit per node, groups by layer.
  const Coarsening* units = nullptr;
};

Placement placeMEtf(const ir::Graph& g, const DeviceModel& machine, const MEtfOptions& options = {});
/// The same on a prebuilt problem (tg built from g).
Placement placeMEtf(const ir::Graph& g, const TaskGraph& tg, const DeviceModel& machine);

}  // namespace modelpar::passes
