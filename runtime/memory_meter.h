// What a device's value slots hold, in bytes of distinct tensor storages:
// the executor's measurement of per-device peak memory
// (ExecutorOptions::measure_memory), to check the simulator's memory model
// (Note [Memory model], passes/place/task_graph.h) against a real run.
#pragma once

#include <cstdint>
#include <unordered_map>
#include <vector>

#include <ATen/core/ivalue.h>

namespace c10 {
struct StorageImpl;
}  // namespace c10

namespace modelpar::runtime {

// Note [Measured memory]
// ~~~~~~~~~~~~~~~~~~~~~~
// With ExecutorOptions::measure_memory each worker keeps a StorageMeter over
// its device's Env: every tensor a slot takes (an input bound on the device,
// a run's outputs, a received copy) adds its storage, every tensor a slot
// drops (a `free`, an output slot overwritten) removes it, and a storage
// counts its nbytes once however many values view it (keyed by its
// StorageImpl). After binding the inputs and after each instruction the
// worker compares the total with the step's peak so far. That is the
// simulator's model measured, not re-derived: inputs and parameters from the
// start, a run's outputs from its instruction, views and in-place outputs
// sharing their base's bytes, received copies at their own size, everything
// until its `free`.
//
// What it does not see:
//  * a run's temporaries (Cost::temp_bytes, the simulator's workspace inside
//    a run): they live inside the operator call, between two measurements;
//  * references held outside the Env: a CPU copy closure keeps a sent tensor
//    until its copy ran (Note [Lifetime of sent tensors], executor.cpp), the
//    mailbox holds a received copy until its `recv`, the caller holds the
//    inputs it passed. These are the allocator's business, not the
//    program's; an allocator statistic would count them and the caching
//    allocator's rounding too;
//  * steps replayed as CUDA graphs (the report stays that of the last step
//    run on the stream path).
// Cost: off, a branch per instruction and per slot written; on, a hash-map
// update per tensor taken or dropped (a 1F1B step of the skip step, 8
// micro-batches on 2 CPU workers: 1250 us median on against 1174 us off,
// inside the 880-1510 us spread of the rounds on a 2-core VM).

/// Per device, the last measured step (Executor::memoryReport()).
struct DeviceMemory {
  /// Bytes of distinct storages held after the inputs were bound.
  int64_t start_bytes = 0;
  /// The most held after any instruction (or the inputs alone).
  int64_t peak_bytes = 0;
  /// The instruction after which peak_bytes was first reached; -1: the inputs.
  int64_t peak_instruction = -1;
  /// Held after the last instruction (graph outputs and what was never freed).
  int64_t end_bytes = 0;
};

struct MemoryReport {
  /// Steps measured so far (steps run on the stream path with measure_memory).
  int steps = 0;
  /// One per logical device, from the last measured step; empty before one.
  std::vector<DeviceMemory> devices;
};

namespace detail {

/// Counts the distinct storages of the tensors added and not yet removed.
/// One thread at a time (a device's worker).
class StorageMeter {
 public:
  void reset();
  /// Every tensor in `v` (a tensor, a list or tuple of them; others ignored).
  void add(const c10::IValue& v);
  void remove(const c10::IValue& v);
  /// After instruction `i` (-1: after binding inputs): updates the peak.
  void mark(int64_t i);
  int64_t bytes() const { return current_; }
  const DeviceMemory& result() const { return m_; }

 private:
  void addTensor(const at::Tensor& t);
  void removeTensor(const at::Tensor& t);
  struct Held {
    int64_t refs = 0;
    int64_t bytes = 0;
  };
  std::unordered_map<const c10::StorageImpl*, Held> held_;
  int64_t current_ = 0;
  DeviceMemory m_;
};

}  // namespace detail
}  // namespace modelpar::runtime
