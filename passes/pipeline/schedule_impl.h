// Internals of the `schedule` pass (schedule.h), shared by schedule.cpp (the
// checks, each task's nodes, the global order, shared nodes, the projection
// onto devices), schedule_clock.cpp (Note [Global clock]),
// schedule_interleaved.cpp (interleaved 1F1B's device orders),
// schedule_zero_bubble.cpp (ZB-H1's stage orders) and schedule_zbv.cpp
// (ZB-V's placement and device orders). Not part of the API:
// include passes/pipeline/schedule.h.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include <fmt/format.h>

#include "ir/graph.h"
#include "passes/pipeline/schedule.h"

namespace modelpar::passes::schedule_detail {

enum class Role : uint8_t { InTask, Shared, Final };
/// Task kinds: forward, backward (all of it, or the B part under zb-h1 and
/// zb-v), and the W part (Note [Backward split]; empty under the other
/// schedules).
inline constexpr int kF = 0, kB = 1, kW = 2, kKinds = 3;

inline std::string_view kindName(int k) { return k == kF ? "F" : k == kB ? "B" : "W"; }

/// The problem after the precondition checks. A task is (stage, micro-batch,
/// F, B or W), numbered taskId(s, k, kind).
struct Pipeline {
  int n = 0, m = 0, num_devices = 0;
  bool reverse_backward = false;    // GPipe: B(m-1) .. B0 (torchgpipe's fork/join order)
  /// Interleaved 1F1B: the clock runs each device's order (a lane per
  /// device) instead of each stage's; n = num_devices * virtual_stages and
  /// stage s is on device s % num_devices.
  bool interleaved = false;
  int virtual_stages = 1;
  /// ZB-H1 and ZB-V: backward tasks split into B and W (Note [Backward
  /// split]); ZB-H1 runs each stage in Note [ZB-H1]'s order.
  bool zero_bubble = false;
  /// ZB-V: n = 2p stages placed in a V (stage s on device s for s < p, on
  /// device 2p-1-s after), the clock runs each device's order of Note
  /// [ZB-V] (a lane per device); with zero_bubble, virtual_stages = 2.
  bool v_shape = false;
  std::vector<int32_t> device_of_stage;
  std::vector<int> warmup;          // per stage, clamped to [1, m] (not used by interleaved)
  std::vector<Role> role;           // per node
  std::vector<int32_t> stage;       // per node (shared: filled in by anchorSharedNodes)
  std::vector<int32_t> task;        // per node, InTask only: taskId(stage, mb, F|B|W)
  const PatternTimes* pattern = nullptr;  // 1f1b* with MadPipe's pattern

  int32_t taskId(int s, int k, int kind) const { return (s * m + k) * kKinds + kind; }
  size_t numTasks() const { return static_cast<size_t>(n) * static_cast<size_t>(m) * kKinds; }
  static int kindOf(int32_t t) { return t % kKinds; }
  int stageOf(int32_t t) const { return t / kKinds / m; }
  int microbatchOf(int32_t t) const { return (t / kKinds) % m; }
  // Note [Lowering the periodic pattern]: the start of a task in the
  // pattern's time, (k + shift) * T + start.
  double patternStart(int32_t t) const {
    const auto s = static_cast<size_t>(stageOf(t));
    const int k = microbatchOf(t);
    const bool f = kindOf(t) == kF;
    return (k + (f ? pattern->fwd_shift[s] : pattern->bwd_shift[s])) * pattern->period_us +
           (f ? pattern->fwd_start_us[s] : pattern->bwd_start_us[s]);
  }
  std::string taskName(int32_t t) const {
    return fmt::format("{}{} of stage {}", kindName(kindOf(t)), microbatchOf(t), stageOf(t));
  }
};

/// The data dependencies between tasks: an edge per graph edge between
/// nodes of two different tasks.
struct TaskEdges {
  std::vector<std::vector<int32_t>> succ;  ///< per task: the tasks reading it (repeated per edge)
  std::vector<int32_t> num_preds;          ///< per task: edges into it
  /// Per task: the edges into it, (producer node, reader node), for messages.
  std::vector<std::vector<std::pair<ir::NodeId, ir::NodeId>>> in_edges;
};
TaskEdges taskEdges(const ir::Graph& g, const Pipeline& P);

/// One run of Note [Global clock] over `lanes`: per lane (a stage's or a
/// device's sequence of tasks), at each tick the lane's next task fires when
/// every task it reads fired at an earlier tick.
struct ClockRun {
  std::vector<int32_t> tick;  ///< per task; -1 for a task that never fired or is in no lane
  /// Empty when every task fired; else, per lane that is stuck, "; <task>
  /// waits (<reader> reads <node> of <task>)", naming an edge from a task
  /// that has not run.
  std::string blocked;
  bool ok() const { return blocked.empty(); }
};
ClockRun runClock(const ir::Graph& g, const Pipeline& P, const TaskEdges& e,
                  const std::vector<std::vector<int32_t>>& lanes);

/// Interleaved 1F1B (Note [Interleaved 1F1B] in schedule_interleaved.cpp):
/// each device's task order, its warm-up raised until the clock runs it.
/// `used` says, per task, whether it has nodes (empty tasks are left out).
/// Throws ConfigError naming the blocked tasks when even running every
/// forward first cannot run (the graph's edges contradict the stage order).
struct DeviceOrders {
  std::vector<std::vector<int32_t>> lanes;  ///< per device
  std::vector<int> warmup;                  ///< per device: forwards before the first backward
  std::vector<int32_t> tick;                ///< per task (ClockRun::tick)
};
DeviceOrders interleavedOrders(const ir::Graph& g, const Pipeline& P, const TaskEdges& e,
                               const std::vector<char>& used);

/// ZB-H1 (Note [ZB-H1] in schedule_zero_bubble.cpp): stage s's task order,
/// B and W tasks of every micro-batch included (the caller drops empty ones).
std::vector<int32_t> zeroBubbleSequence(const Pipeline& P, int s);

/// ZB-V (Note [ZB-V] in schedule_zbv.cpp): checks that device_of_stage is
/// the V over p = n/2 devices (ConfigError naming the stage, its device and
/// the placement to give) and sets v_shape and virtual_stages.
void checkVPlacement(Pipeline& P);

/// ZB-V's device orders (Note [ZB-V]), tasks without nodes left out, run by
/// the clock as they are (warmup: each device's forwards before its first
/// backward). Throws ConfigError naming the blocked tasks when the graph's
/// edges contradict them.
DeviceOrders zbvOrders(const ir::Graph& g, const Pipeline& P, const TaskEdges& e,
                       const std::vector<char>& used);

}  // namespace modelpar::passes::schedule_detail
