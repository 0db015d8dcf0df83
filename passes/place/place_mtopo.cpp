// Pass `place-mtopo` (place_mtopo.h).
#include "passes/place/place_mtopo.h"

#include <algorithm>

#include "ir/check.h"
#include "passes/place/list_scheduler.h"

namespace modelpar::passes {
namespace {

class MTopo {
 public:
  MTopo(const TaskGraph& tg, const DeviceModel& m, bool uniform)
      : tg_(tg), m_(m), n_(m.numDevices()), used_(static_cast<size_t>(n_), 0),
        device_(static_cast<size_t>(tg.numTasks()), -1),
        group_device_(static_cast<size_t>(tg.numGroups()), -1),
        input_home_(tg.storages.size(), -1),
        received_(tg.tensors.size(), 0) {
    // Static memory of each group: what its tasks allocate and keep.
    std::vector<int64_t> group_mem(static_cast<size_t>(tg.numGroups()), 0);
    int64_t total = 0;
    for (int32_t t = 0; t < tg.numTasks(); ++t) {
      auto ti = static_cast<size_t>(t);
      int64_t mem = tg.out_bytes[ti] + tg.temp_bytes[ti] + tg.persistent_bytes[ti];
      group_mem[static_cast<size_t>(tg.group[ti])] += mem;
      total += mem;
    }
    group_mem_ = group_mem;
    int64_t largest = group_mem.empty() ? 0 : *std::max_element(group_mem.begin(), group_mem.end());
    for (int d = 0; d < n_; ++d) {
      int64_t capacity = m.device(d).memory_bytes;
      // The last device takes the remainder: received copies are not in the
      // uniform share, so it may need more than the share.
      bool last = d == n_ - 1;
      cap_.push_back(uniform && !last ? std::min(capacity, total / n_ + largest) : capacity);
    }
  }

  // Step 1 of algorithms.md §1.5: fill devices in order along the topological order.
  std::vector<int32_t> run() {
    int d = 0;
    for (int32_t t : tg_.topo) {
      auto grp = static_cast<size_t>(tg_.group[static_cast<size_t>(t)]);
      if (group_device_[grp] >= 0) {
        int gd = group_device_[grp];
        int64_t extra = extraBytes(t, gd);
        if (used_[static_cast<size_t>(gd)] + extra > m_.device(gd).memory_bytes) fail(t, gd, extra);
        place(t, gd, extra);
        continue;
      }
      while (d < n_ && used_[static_cast<size_t>(d)] + group_mem_[grp] + extraBytes(t, d) >
                           cap_[static_cast<size_t>(d)]) {
        ++d;
      }
      if (d == n_) fail(t, n_ - 1, group_mem_[grp] + extraBytes(t, n_ - 1));
      group_device_[grp] = d;
      used_[static_cast<size_t>(d)] += group_mem_[grp];
      place(t, d, extraBytes(t, d));
    }
    return device_;
  }

 private:
  // What a task adds beyond its group's static memory on device d: received
  // copies and the graph inputs it would home there.
  int64_t extraBytes(int32_t t, int d) const {
    int64_t extra = 0;
    for (int32_t xi : tg_.inputsOf(t)) {
      const TaskGraph::Tensor& x = tg_.tensors[static_cast<size_t>(xi)];
      int home = x.producer >= 0 ? device_[static_cast<size_t>(x.producer)]
                                 : input_home_[static_cast<size_t>(x.storage)];
      if (home < 0) {
        const auto& st = tg_.storages[static_cast<size_t>(x.storage)];
        if (st.persistent_input) extra += st.bytes;
      } else if (home != d && !(received_[static_cast<size_t>(xi)] & (uint64_t{1} << d))) {
        extra += x.bytes;
      }
    }
    return extra;
  }

  void place(int32_t t, int d, int64_t extra) {
    used_[static_cast<size_t>(d)] += extra;
    device_[static_cast<size_t>(t)] = d;
    for (int32_t xi : tg_.inputsOf(t)) {
      const TaskGraph::Tensor& x = tg_.tensors[static_cast<size_t>(xi)];
      if (x.producer < 0 && input_home_[static_cast<size_t>(x.storage)] < 0) {
        input_home_[static_cast<size_t>(x.storage)] = d;
      }
      received_[static_cast<size_t>(xi)] |= uint64_t{1} << d;
    }
  }

  [[noreturn]] void fail(int32_t t, int d, int64_t needed) const {
    auto grp = static_cast<size_t>(tg_.group[static_cast<size_t>(t)]);
    int64_t available = std::max<int64_t>(0, cap_[static_cast<size_t>(d)] - used_[static_cast<size_t>(d)]);
    MP_THROW(PlanDoesNotFitError,
             "modelpar {}: layer '{}' needs {} on device {}, which has {} available of {} (every "
             "earlier device is full); use more devices or enable checkpointing",
             kMTopoPassId, tg_.group_name[grp], formatBytes(needed), d, formatBytes(available),
             formatBytes(m_.device(d).memory_bytes));
  }

  const TaskGraph& tg_;
  const DeviceModel& m_;
  int n_;
  std::vector<int64_t> cap_, used_, group_mem_;
  std::vector<int32_t> device_, group_device_, input_home_;  // input_home_ by storage
  std::vector<uint64_t> received_;
};

}  // namespace

Placement placeMTopo(const ir::Graph& g, const TaskGraph& tg, const DeviceModel& machine,
                     bool uniform) {
  MP_CHECK(machine.numDevices() <= 64, ConfigError, "modelpar {}: places on 1 to 64 devices, got {}",
           kMTopoPassId, machine.numDevices());
  std::vector<int32_t> device = MTopo(tg, machine, uniform).run();
  // Timing: replay the placement in topological order (Baechi's virtual scheduler).
  ListScheduler replay(tg, machine, kMTopoPassId);
  for (int32_t t : tg.topo) replay.commit(t, device[static_cast<size_t>(t)]);
  return replay.toPlacement(g, std::string(kMTopoPassId));
}

Placement placeMTopo(const ir::Graph& g, const DeviceModel& machine, const MTopoOptions& options) {
  TaskGraph tg = buildTaskGraph(g, options.units);
  return placeMTopo(g, tg, machine, options.uniform);
}

}  // namespace modelpar::passes
