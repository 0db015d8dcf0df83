// The machinery the list-scheduling placers share (m-TOPO's timing replay,
// m-ETF, m-SCT): simulated time per device, Baechi's transfer model, memory
// per Note [Memory model], colocation groups, and the event loop.
//
// Transfer model (Baechi, algorithms.md §1.3): each device has a single
// channel used by its sends and its receives; a transfer of tensor x from h
// to d starts at max(x available on h, channel(h) free, channel(d) free),
// takes the link time, and occupies both channels. A tensor is sent at most
// once per destination device (later readers there reuse the copy).
#pragma once

#include <cstdint>
#include <limits>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "ir/graph.h"
#include "passes/cost/device_model.h"
#include "passes/place/placement.h"
#include "passes/place/task_graph.h"

namespace modelpar::passes {

class ListScheduler;

/// A placer's decision at one instant: run `task` on `device` at `start`.
struct Choice {
  int32_t task = -1;
  int device = -1;
  double start = std::numeric_limits<double>::infinity();
  bool valid() const { return task >= 0; }
};

/// What distinguishes one list scheduler from another: which ready task a
/// free device takes. `ready` holds tasks whose predecessors have all
/// finished by `now`, in topological rank order; `free` devices (ascending)
/// have nothing running at `now`.
class SchedulingPolicy {
 public:
  virtual ~SchedulingPolicy() = default;
  virtual Choice choose(const ListScheduler& s, double now, std::span<const int32_t> ready,
                        std::span<const int> free) = 0;
  /// Called after each commit (m-SCT tracks the last task per device).
  virtual void committed(int32_t /*task*/, int /*device*/) {}
};

class ListScheduler {
 public:
  /// Throws ConfigError for more than 64 devices.
  ListScheduler(const TaskGraph& tg, const DeviceModel& machine, std::string_view pass_id);

  const TaskGraph& tasks() const { return tg_; }
  int numDevices() const { return num_devices_; }

  /// Whether `task` fits on `device` now: its group is unplaced or placed
  /// there, and the memory it would add (group persistent bytes, inputs it
  /// would home there, received copies, outputs, temporaries) fits.
  bool fits(int32_t task, int device) const;
  /// When all of task's inputs could be on `device`, transfers simulated on
  /// the current channel state (nothing is changed).
  double dataReady(int32_t task, int device) const;
  /// Earliest start of task on device at or after `now`.
  double earliestStart(int32_t task, int device, double now) const;
  /// fits() and, when it fits, earliestStart() into *start, in one pass.
  bool evaluate(int32_t task, int device, double now, double* start) const;
  double deviceFree(int device) const { return device_free_[static_cast<size_t>(device)]; }
  int groupDevice(int32_t group) const { return group_device_[static_cast<size_t>(group)]; }
  bool scheduled(int32_t task) const { return task_device_[static_cast<size_t>(task)] >= 0; }
  int taskDevice(int32_t task) const { return task_device_[static_cast<size_t>(task)]; }
  bool isReady(int32_t task) const { return in_ready_[static_cast<size_t>(task)] != 0; }
  /// Last task committed on a device, or -1.
  int32_t lastTask(int device) const { return last_[static_cast<size_t>(device)]; }

  /// Places task on device and runs it at max(not_before, device free, data
  /// ready); performs its transfers, memory accounting and releases. The
  /// task's predecessors must be committed.
  void commit(int32_t task, int device, double not_before = 0.0);

  /// The event loop: until every task is committed, hands the ready tasks
  /// and free devices to `policy`; commits its choice when it starts before
  /// the next event (a task finishing or becoming ready), else advances time.
  /// Throws PlanDoesNotFitError when ready tasks fit nowhere and nothing is
  /// left to wait for.
  void run(SchedulingPolicy& policy);

  /// Throws PlanDoesNotFitError for `task`, naming its layer (group), the
  /// device that comes closest, the bytes needed and available.
  [[noreturn]] void throwDoesNotFit(int32_t task) const;

  /// The placement of g's nodes (tasks expanded to members in graph order).
  Placement toPlacement(const ir::Graph& g, std::string placer) const;

 private:
  struct Need {
    int64_t extra_persistent = 0;  // group persistent + inputs homed here
    int64_t run = 0;               // received copies + outputs + temporaries
  };
  Need need(int32_t task, int device) const;
  int tensorHome(const TaskGraph::Tensor& x) const {
    if (x.producer >= 0) return task_device_[static_cast<size_t>(x.producer)];
    return input_home_[static_cast<size_t>(x.input_index)];
  }
  double tensorAvailable(const TaskGraph::Tensor& x) const {
    return x.producer >= 0 ? task_end_[static_cast<size_t>(x.producer)] : 0.0;
  }
  double linkUs(int src, int dst, int64_t bytes) const {
    size_t k = static_cast<size_t>(src * num_devices_ + dst);
    return latency_us_[k] + static_cast<double>(bytes) * us_per_byte_[k];
  }
  void release(int32_t storage);

  const TaskGraph& tg_;
  std::string pass_id_;
  int num_devices_;
  std::vector<int64_t> capacity_;
  std::vector<double> latency_us_, us_per_byte_;

  std::vector<double> device_free_, channel_free_;
  std::vector<int64_t> persistent_, live_, peak_;  // per device
  std::vector<int32_t> last_;
  std::vector<std::vector<int32_t>> order_;

  std::vector<int32_t> task_device_;
  std::vector<double> task_start_, task_end_, ready_time_;
  std::vector<int32_t> pending_preds_;
  std::vector<char> in_ready_;
  std::vector<int32_t> group_device_;
  std::vector<int32_t> input_home_;
  std::vector<double> recv_time_;   // tensor * devices + device, -1 if not received
  std::vector<uint64_t> recv_mask_; // per tensor
  std::vector<int32_t> pending_readers_;
  std::vector<int32_t> newly_ready_;  // filled by commit, drained by run
  int32_t num_scheduled_ = 0;
};

}  // namespace modelpar::passes
