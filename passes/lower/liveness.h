// Where each device's copies of values are allocated and released in a
// Program, by Note [Memory model] (task_graph.h). The simulator counts memory
// with it; lowering places its `free` instructions with it, so the two agree.
#pragma once

#include <cstdint>
#include <vector>

#include "ir/program.h"
#include "passes/place/flat_graph.h"

namespace modelpar::passes {

/// A storage (or, in alias_ends, an alias value) that ends after instruction
/// `after` of its device; after == -1: before the first instruction.
struct ValueRelease {
  int32_t after = -1;
  ir::ValueId value = ir::kNoId;
  int64_t bytes = 0;
};

/// Memory events of one device.
struct DeviceLiveness {
  /// Graph inputs of role `input` living here from the start (and used or
  /// returned), plus the persistent bytes of the nodes this device runs.
  int64_t start_bytes = 0;
  int64_t persistent_bytes = 0;
  /// Per instruction: bytes a run's outputs or a recv's copy allocate, and a
  /// run's temporary bytes (allocated during the run only).
  std::vector<int64_t> alloc_bytes;
  std::vector<int64_t> temp_bytes;
  /// Storages released, sorted by `after`. A storage ends at its `free` or
  /// after the last use (run reading it, or send) of any value aliasing it
  /// here, whichever is later; never when it holds a graph output produced
  /// here or a parameter / buffer living here.
  std::vector<ValueRelease> releases;
  /// Last use of each alias value (view / in-place output) here, sorted;
  /// bytes 0. Lowering frees them for tidiness.
  std::vector<ValueRelease> alias_ends;
};

/// One entry per device. Reads node devices from the schedules, input
/// devices from the graph (device 0 when unset), costs from nodes (absent:
/// 0). Assumes the program verifies. O(instructions + values).
std::vector<DeviceLiveness> analyzeLiveness(const ir::Program& p);
/// The same with a prebuilt flatten(p.graph()).
std::vector<DeviceLiveness> analyzeLiveness(const ir::Program& p, const FlatGraph& f);

}  // namespace modelpar::passes
