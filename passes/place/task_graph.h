// The placement problem the placers share: units of a Coarsening as tasks
// with time and memory, the tensors that cross task boundaries, storage
// (alias) classes with their release conditions, and colocation groups.
#pragma once

#include <cstdint>
#include <span>
#include <string>
#include <vector>

#include "ir/graph.h"
#include "passes/place/coarsen.h"

namespace modelpar::passes {

// Note [Memory model]
// ~~~~~~~~~~~~~~~~~~~
// One model serves the placers, lowering and the simulator, so that a plan a
// placer accepts never exceeds a device's capacity in simulation:
//
//   * Memory on a device evolves in that device's program order (DistIR's
//     live-memory count, algorithms.md §3.3): a run allocates its outputs and
//     its temporary bytes, then releases the temporary bytes; a recv
//     allocates the received copy; a value's copy is released at its `free`,
//     or after its last use on the device.
//   * Outputs of views and in-place ops allocate nothing: they share the
//     storage of their first input (op_family.h). A storage stays alive
//     while any value aliasing it is still used on that device.
//   * Persistent bytes (Cost::persistent_bytes: weights, gradients,
//     optimizer state) and the graph inputs of role `input` count on their
//     device for the whole step. Parameters and buffers themselves count
//     through the persistent bytes of their first user; a received copy of
//     one counts like any received value; and one bound on a device none of
//     whose nodes reads it (held there only to be sent: a training rank's
//     parameter that an inference graph planned apart reads on another rank,
//     Note [One home per parameter]) counts its own bytes there for the
//     whole step.
//   * A received copy takes the value's dense size (a view is materialised).
//   * Graph outputs are never released on the device that produced them.
//
// The placers (ListScheduler) count conservatively in the same order: a
// storage and every received copy of its values stay charged until all
// tasks that read any of its values are scheduled, on any device; a task's
// internal values count as temporary bytes for its whole run; and adding
// persistent bytes to a device checks the device's past peak too. So the
// placer's peak bounds the simulated peak from above.

/// Tasks = units. All per-task arrays are indexed by task id (= unit id).
/// Adjacency is CSR: `x_begin[t] .. x_begin[t+1]` indexes `x`.
struct TaskGraph {
  struct Tensor {
    ir::ValueId value = ir::kNoId;
    int32_t producer = -1;     ///< task, or -1 for a graph input
    int32_t input_index = -1;  ///< index into Graph::inputs() for a graph input
    int32_t storage = -1;      ///< its storage class
    int64_t bytes = 0;         ///< dense size: what a transfer moves / a copy takes
  };
  struct Storage {
    int32_t producer = -1;     ///< task that allocates it, -1 for a graph input
    int32_t input_index = -1;
    int64_t bytes = 0;         ///< charged on the producer's device
    bool kept = false;         ///< graph output / parameter / input: never released
    bool persistent_input = false;  ///< a graph input of role `input`: charged for the whole step
    bool output = false;       ///< a value of the class is a graph output
  };

  int32_t numTasks() const { return static_cast<int32_t>(time_us.size()); }
  int32_t numGroups() const { return static_cast<int32_t>(group_name.size()); }

  // Per task.
  std::vector<double> time_us;
  std::vector<int64_t> out_bytes;         ///< escaping storages it allocates
  std::vector<int64_t> temp_bytes;        ///< max member workspace + internal values
  std::vector<int64_t> persistent_bytes;  ///< sum over members
  std::vector<int32_t> group;
  std::vector<int32_t> rank;              ///< position in `topo`
  std::vector<int32_t> topo;              ///< Kahn (BFS) order, ties by first node
  std::vector<int32_t> member_begin, members;  ///< nodes, in graph order
  std::vector<int32_t> pred_begin, preds;      ///< distinct predecessor tasks
  std::vector<int32_t> succ_begin, succs;      ///< distinct successor tasks
  std::vector<int64_t> succ_bytes;             ///< tensor bytes on each succ edge
  std::vector<int32_t> input_begin, inputs;    ///< tensors read (produced elsewhere)
  std::vector<int32_t> release_begin, releases;  ///< storages this task's run may release
  std::vector<int32_t> alloc_begin, allocs;    ///< storages this task allocates

  std::vector<Tensor> tensors;
  std::vector<Storage> storages;
  std::vector<int32_t> storage_readers;        ///< distinct reader tasks per storage
  std::vector<int32_t> storage_tensor_begin, storage_tensors;  ///< tensors per storage

  // Per group.
  std::vector<std::string> group_name;  ///< its layer, or the first node's name
  std::vector<int64_t> group_persistent;
  std::vector<int32_t> group_task_begin, group_tasks;

  std::span<const int32_t> range(const std::vector<int32_t>& begin,
                                 const std::vector<int32_t>& items, int32_t t) const {
    auto b = static_cast<size_t>(begin[static_cast<size_t>(t)]);
    auto e = static_cast<size_t>(begin[static_cast<size_t>(t) + 1]);
    return {items.data() + b, e - b};
  }
  std::span<const int32_t> predsOf(int32_t t) const { return range(pred_begin, preds, t); }
  std::span<const int32_t> succsOf(int32_t t) const { return range(succ_begin, succs, t); }
  std::span<const int32_t> inputsOf(int32_t t) const { return range(input_begin, inputs, t); }
  std::span<const int32_t> membersOf(int32_t t) const { return range(member_begin, members, t); }
  std::span<const int32_t> releasesOf(int32_t t) const { return range(release_begin, releases, t); }
  std::span<const int32_t> allocsOf(int32_t t) const { return range(alloc_begin, allocs, t); }
  std::span<const int32_t> tasksOf(int32_t g) const { return range(group_task_begin, group_tasks, g); }
  std::span<const int32_t> tensorsOf(int32_t s) const {
    return range(storage_tensor_begin, storage_tensors, s);
  }
};

/// Builds the problem for g grouped by `c` (nodeUnits(g) when null).
/// Throws ConfigError naming the node when a node has no cost ("run the cost
/// pass first"), and when the grouping's unit graph has a cycle.
TaskGraph buildTaskGraph(const ir::Graph& g, const Coarsening* c = nullptr);

}  // namespace modelpar::passes
