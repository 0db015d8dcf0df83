// ListScheduler: simulated time, transfers and memory of a placement being
// built (list_scheduler.h), and the event loop of m-ETF / m-SCT.
#include "passes/place/list_scheduler.h"

#include <algorithm>
#include <array>
#include <queue>

#include "ir/check.h"

namespace modelpar::passes {
namespace {

constexpr int kMaxDevices = 64;
constexpr double kInf = std::numeric_limits<double>::infinity();

}  // namespace

ListScheduler::ListScheduler(const TaskGraph& tg, const DeviceModel& machine,
                             std::string_view pass_id)
    : tg_(tg), pass_id_(pass_id), num_devices_(machine.numDevices()) {
  MP_CHECK(num_devices_ >= 1 && num_devices_ <= kMaxDevices, ConfigError,
           "modelpar {}: places on 1 to {} devices, got {}", pass_id_, kMaxDevices, num_devices_);
  auto nd = static_cast<size_t>(num_devices_);
  for (int d = 0; d < num_devices_; ++d) capacity_.push_back(machine.device(d).memory_bytes);
  latency_us_.assign(nd * nd, 0.0);
  us_per_byte_.assign(nd * nd, 0.0);
  for (int s = 0; s < num_devices_; ++s) {
    for (int d = 0; d < num_devices_; ++d) {
      if (s == d) continue;
      const LinkSpec& l = machine.link(s, d);
      latency_us_[static_cast<size_t>(s * num_devices_ + d)] = l.latency_us;
      us_per_byte_[static_cast<size_t>(s * num_devices_ + d)] = 1e6 / l.bandwidth;
    }
  }
  device_free_.assign(nd, 0.0);
  channel_free_.assign(nd, 0.0);
  persistent_.assign(nd, 0);
  live_.assign(nd, 0);
  peak_.assign(nd, 0);
  last_.assign(nd, -1);
  order_.resize(nd);
  auto nt = static_cast<size_t>(tg.numTasks());
  task_device_.assign(nt, -1);
  task_start_.assign(nt, 0.0);
  task_end_.assign(nt, 0.0);
  ready_time_.assign(nt, 0.0);
  pending_preds_.resize(nt);
  for (size_t t = 0; t < nt; ++t) {
    pending_preds_[t] = static_cast<int32_t>(tg.predsOf(static_cast<int32_t>(t)).size());
  }
  in_ready_.assign(nt, 0);
  group_device_.assign(static_cast<size_t>(tg.numGroups()), -1);
  int32_t num_inputs = 0;
  for (const auto& s : tg.storages) num_inputs = std::max(num_inputs, s.input_index + 1);
  input_home_.assign(static_cast<size_t>(num_inputs), -1);
  recv_time_.assign(tg.tensors.size() * nd, -1.0);
  recv_mask_.assign(tg.tensors.size(), 0);
  pending_readers_ = tg.storage_readers;
  // An input no task reads but the graph returns stays on device 0 all step.
  for (size_t s = 0; s < tg.storages.size(); ++s) {
    const auto& st = tg.storages[s];
    if (st.input_index >= 0 && st.output && tg.tensorsOf(static_cast<int32_t>(s)).empty()) {
      input_home_[static_cast<size_t>(st.input_index)] = 0;
      persistent_[0] += st.bytes;
    }
  }
}

ListScheduler::Need ListScheduler::need(int32_t task, int device) const {
  Need n;
  auto t = static_cast<size_t>(task);
  int32_t grp = tg_.group[t];
  if (group_device_[static_cast<size_t>(grp)] < 0) {
    n.extra_persistent += tg_.group_persistent[static_cast<size_t>(grp)];
  }
  auto nd = static_cast<size_t>(num_devices_);
  for (int32_t xi : tg_.inputsOf(task)) {
    const TaskGraph::Tensor& x = tg_.tensors[static_cast<size_t>(xi)];
    int home = tensorHome(x);
    if (home < 0) {
      const auto& st = tg_.storages[static_cast<size_t>(x.storage)];
      if (st.persistent_input) n.extra_persistent += st.bytes;
      continue;
    }
    if (home == device || recv_time_[static_cast<size_t>(xi) * nd + static_cast<size_t>(device)] >= 0) {
      continue;
    }
    n.run += x.bytes;
  }
  n.run += tg_.out_bytes[t] + tg_.temp_bytes[t];
  return n;
}

bool ListScheduler::fits(int32_t task, int device) const {
  int gd = group_device_[static_cast<size_t>(tg_.group[static_cast<size_t>(task)])];
  if (gd >= 0 && gd != device) return false;
  Need n = need(task, device);
  auto d = static_cast<size_t>(device);
  // Persistent bytes count from the start of the step: the past peak must
  // still fit with them (Note [Memory model]).
  if (n.extra_persistent > 0 && peak_[d] + persistent_[d] + n.extra_persistent > capacity_[d]) {
    return false;
  }
  return persistent_[d] + n.extra_persistent + live_[d] + n.run <= capacity_[d];
}

double ListScheduler::dataReady(int32_t task, int device) const {
  double ready = ready_time_[static_cast<size_t>(task)];
  std::array<double, kMaxDevices> chan;  // tentative channel state, copied on first need
  bool copied = false;
  auto nd = static_cast<size_t>(num_devices_);
  for (int32_t xi : tg_.inputsOf(task)) {
    const TaskGraph::Tensor& x = tg_.tensors[static_cast<size_t>(xi)];
    int home = tensorHome(x);
    if (home < 0) continue;  // an input homed here on commit: there from the start
    if (home == device) {
      ready = std::max(ready, tensorAvailable(x));
      continue;
    }
    double r = recv_time_[static_cast<size_t>(xi) * nd + static_cast<size_t>(device)];
    if (r >= 0) {
      ready = std::max(ready, r);
      continue;
    }
    if (!copied) {
      std::copy(channel_free_.begin(), channel_free_.end(), chan.begin());
      copied = true;
    }
    auto h = static_cast<size_t>(home), d = static_cast<size_t>(device);
    double start = std::max({tensorAvailable(x), chan[h], chan[d]});
    double end = start + linkUs(home, device, x.bytes);
    chan[h] = chan[d] = end;
    ready = std::max(ready, end);
  }
  return ready;
}

bool ListScheduler::evaluate(int32_t task, int device, double now, double* start) const {
  auto t = static_cast<size_t>(task);
  auto grp = static_cast<size_t>(tg_.group[t]);
  int gd = group_device_[grp];
  if (gd >= 0 && gd != device) return false;
  auto d = static_cast<size_t>(device);
  auto nd = static_cast<size_t>(num_devices_);
  int64_t extra = gd < 0 ? tg_.group_persistent[grp] : 0;
  int64_t run = tg_.out_bytes[t] + tg_.temp_bytes[t];
  double ready = std::max(now, std::max(device_free_[d], ready_time_[t]));
  std::array<double, kMaxDevices> chan;
  bool copied = false;
  for (int32_t xi : tg_.inputsOf(task)) {
    const TaskGraph::Tensor& x = tg_.tensors[static_cast<size_t>(xi)];
    int home = tensorHome(x);
    if (home < 0) {
      const auto& st = tg_.storages[static_cast<size_t>(x.storage)];
      if (st.persistent_input) extra += st.bytes;
      continue;
    }
    if (home == device) {
      ready = std::max(ready, tensorAvailable(x));
      continue;
    }
    double r = recv_time_[static_cast<size_t>(xi) * nd + d];
    if (r >= 0) {
      ready = std::max(ready, r);
      continue;
    }
    run += x.bytes;
    if (!copied) {
      std::copy(channel_free_.begin(), channel_free_.end(), chan.begin());
      copied = true;
    }
    auto h = static_cast<size_t>(home);
    double begin = std::max({tensorAvailable(x), chan[h], chan[d]});
    double end = begin + linkUs(home, device, x.bytes);
    chan[h] = chan[d] = end;
    ready = std::max(ready, end);
  }
  if (extra > 0 && peak_[d] + persistent_[d] + extra > capacity_[d]) return false;
  if (persistent_[d] + extra + live_[d] + run > capacity_[d]) return false;
  *start = ready;
  return true;
}

double ListScheduler::earliestStart(int32_t task, int device, double now) const {
  return std::max({now, device_free_[static_cast<size_t>(device)], dataReady(task, device)});
}

void ListScheduler::release(int32_t storage) {
  const TaskGraph::Storage& st = tg_.storages[static_cast<size_t>(storage)];
  if (st.producer >= 0) {
    live_[static_cast<size_t>(task_device_[static_cast<size_t>(st.producer)])] -= st.bytes;
  }
  for (int32_t xi : tg_.tensorsOf(storage)) {
    uint64_t mask = recv_mask_[static_cast<size_t>(xi)];
    for (int d = 0; mask != 0; ++d, mask >>= 1) {
      if (mask & 1) live_[static_cast<size_t>(d)] -= tg_.tensors[static_cast<size_t>(xi)].bytes;
    }
    recv_mask_[static_cast<size_t>(xi)] = 0;
  }
}

void ListScheduler::commit(int32_t task, int device, double not_before) {
  auto t = static_cast<size_t>(task);
  auto d = static_cast<size_t>(device);
  auto nd = static_cast<size_t>(num_devices_);
  MP_INTERNAL_ASSERT(task_device_[t] < 0 && pending_preds_[t] == 0,
                     "{}: task {} committed twice or before its predecessors", pass_id_, task);
  auto grp = static_cast<size_t>(tg_.group[t]);
  MP_INTERNAL_ASSERT(group_device_[grp] < 0 || group_device_[grp] == device,
                     "{}: task {} leaves its group's device", pass_id_, task);
  if (group_device_[grp] < 0) {
    group_device_[grp] = device;
    persistent_[d] += tg_.group_persistent[grp];
  }
  double ready = ready_time_[t];
  for (int32_t xi : tg_.inputsOf(task)) {
    const TaskGraph::Tensor& x = tg_.tensors[static_cast<size_t>(xi)];
    int home = tensorHome(x);
    if (home < 0) {  // a graph input lives where its first reader runs
      input_home_[static_cast<size_t>(x.input_index)] = device;
      const auto& st = tg_.storages[static_cast<size_t>(x.storage)];
      if (st.persistent_input) persistent_[d] += st.bytes;
      continue;
    }
    if (home == device) {
      ready = std::max(ready, tensorAvailable(x));
      continue;
    }
    double& r = recv_time_[static_cast<size_t>(xi) * nd + d];
    if (r < 0) {
      auto h = static_cast<size_t>(home);
      double start = std::max({tensorAvailable(x), channel_free_[h], channel_free_[d]});
      r = start + linkUs(home, device, x.bytes);
      channel_free_[h] = channel_free_[d] = r;
      recv_mask_[static_cast<size_t>(xi)] |= uint64_t{1} << device;
      live_[d] += x.bytes;
    }
    ready = std::max(ready, r);
  }
  double start = std::max({not_before, device_free_[d], ready});
  double end = start + tg_.time_us[t];
  task_device_[t] = device;
  task_start_[t] = start;
  task_end_[t] = end;
  device_free_[d] = end;
  live_[d] += tg_.out_bytes[t];
  peak_[d] = std::max(peak_[d], live_[d] + tg_.temp_bytes[t]);
  for (int32_t s : tg_.releasesOf(task)) {
    if (--pending_readers_[static_cast<size_t>(s)] == 0) release(s);
  }
  order_[d].push_back(task);
  last_[d] = task;
  in_ready_[t] = 0;
  ++num_scheduled_;
  for (int32_t v : tg_.succsOf(task)) {
    auto vi = static_cast<size_t>(v);
    ready_time_[vi] = std::max(ready_time_[vi], end);
    if (--pending_preds_[vi] == 0) newly_ready_.push_back(v);
  }
}

void ListScheduler::run(SchedulingPolicy& policy) {
  using Entry = std::pair<double, int32_t>;  // (ready time, rank)
  std::priority_queue<Entry, std::vector<Entry>, std::greater<>> waiting;
  for (int32_t t = 0; t < tg_.numTasks(); ++t) {
    if (pending_preds_[static_cast<size_t>(t)] == 0 && !scheduled(t)) {
      waiting.emplace(ready_time_[static_cast<size_t>(t)], tg_.rank[static_cast<size_t>(t)]);
    }
  }
  auto by_rank = [&](int32_t a, int32_t b) {
    return tg_.rank[static_cast<size_t>(a)] < tg_.rank[static_cast<size_t>(b)];
  };
  std::vector<int32_t> ready;  // in rank order
  std::vector<int> free;
  double now = 0.0;
  while (num_scheduled_ < tg_.numTasks()) {
    while (!waiting.empty() && waiting.top().first <= now) {
      int32_t t = tg_.topo[static_cast<size_t>(waiting.top().second)];
      waiting.pop();
      in_ready_[static_cast<size_t>(t)] = 1;
      ready.insert(std::upper_bound(ready.begin(), ready.end(), t, by_rank), t);
    }
    free.clear();
    double next = waiting.empty() ? kInf : waiting.top().first;
    for (int d = 0; d < num_devices_; ++d) {
      double f = device_free_[static_cast<size_t>(d)];
      if (f <= now) free.push_back(d);
      else next = std::min(next, f);
    }
    Choice c;
    if (!ready.empty() && !free.empty()) c = policy.choose(*this, now, ready, free);
    if (c.valid() && (c.start < next || next == kInf)) {
      commit(c.task, c.device, c.start);
      policy.committed(c.task, c.device);
      ready.erase(std::find(ready.begin(), ready.end(), c.task));
      for (int32_t v : newly_ready_) waiting.emplace(ready_time_[static_cast<size_t>(v)], tg_.rank[static_cast<size_t>(v)]);
      newly_ready_.clear();
      continue;
    }
    if (next < kInf) {
      now = next;
      continue;
    }
    MP_INTERNAL_ASSERT(!ready.empty(), "{}: {} tasks left but none ready", pass_id_,
                       tg_.numTasks() - num_scheduled_);
    throwDoesNotFit(ready.front());
  }
}

void ListScheduler::throwDoesNotFit(int32_t task) const {
  auto grp = static_cast<size_t>(tg_.group[static_cast<size_t>(task)]);
  int best = -1;
  int64_t best_needed = 0, best_available = 0;
  for (int d = 0; d < num_devices_; ++d) {
    if (group_device_[grp] >= 0 && group_device_[grp] != d) continue;
    Need n = need(task, d);
    auto di = static_cast<size_t>(d);
    int64_t used = persistent_[di] + (n.extra_persistent > 0 ? std::max(peak_[di], live_[di]) : live_[di]);
    int64_t available = capacity_[di] - used;
    if (best < 0 || available - (n.extra_persistent + n.run) > best_available - best_needed) {
      best = d;
      best_needed = n.extra_persistent + n.run;
      best_available = available;
    }
  }
  MP_THROW(PlanDoesNotFitError,
           "modelpar {}: layer '{}' needs {} on device {}, which has {} available of {}; use more "
           "devices or enable checkpointing",
           pass_id_, tg_.group_name[grp], formatBytes(best_needed), best,
           formatBytes(std::max<int64_t>(best_available, 0)),
           formatBytes(capacity_[static_cast<size_t>(best)]));
}

Placement ListScheduler::toPlacement(const ir::Graph& g, std::string placer) const {
  Placement p;
  p.placer = std::move(placer);
  p.num_devices = num_devices_;
  p.node_device.assign(g.numNodes(), -1);
  p.start_us.assign(g.numNodes(), 0.0);
  p.order.resize(static_cast<size_t>(num_devices_));
  for (int d = 0; d < num_devices_; ++d) {
    for (int32_t t : order_[static_cast<size_t>(d)]) {
      double at = task_start_[static_cast<size_t>(t)];
      for (int32_t n : tg_.membersOf(t)) {
        p.node_device[static_cast<size_t>(n)] = d;
        p.start_us[static_cast<size_t>(n)] = at;
        at += g.node(n).cost->time_us;
        p.order[static_cast<size_t>(d)].push_back(n);
      }
    }
  }
  p.input_device.assign(g.inputs().size(), -1);
  for (size_t i = 0; i < input_home_.size() && i < p.input_device.size(); ++i) {
    p.input_device[i] = input_home_[i];
  }
  for (size_t t = 0; t < task_end_.size(); ++t) p.makespan_us = std::max(p.makespan_us, task_end_[t]);
  for (int d = 0; d < num_devices_; ++d) {
    p.peak_bytes.push_back(persistent_[static_cast<size_t>(d)] + peak_[static_cast<size_t>(d)]);
  }
  return p;
}

}  // namespace modelpar::passes
