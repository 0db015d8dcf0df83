// The names users type for modelpar's planning options, their valid values,
// and the checks, defined once. passes/ checks with them; the Python package
// reads them from `modelpar._C.option_names()` (python/bind_passes.cpp)
// instead of keeping copies, so C++ and Python accept and refuse the same.
//
// Example:
//   checkDevices("plan", o.devices);                                  // 1..kMaxDevices
//   checkOneOf("pipeline", "schedule", o.schedule, kPipelineScheduleNames);
#pragma once

#include <cstdint>
#include <iterator>
#include <span>
#include <string>
#include <string_view>
#include <vector>

namespace modelpar::passes {

/// Logical devices a plan may have: 1 to kMaxDevices.
inline constexpr int kMaxDevices = 64;

/// `placer`: Baechi's three placers.
inline constexpr std::string_view kPlacerNames[] = {"m-topo", "m-etf", "m-sct"};
/// `schedule`: torchgpipe's clock-cycle GPipe, PipeDream's 1F1B, MadPipe's 1F1B*,
/// Megatron-LM's interleaved 1F1B (virtual_stages chunks per device), zero
/// bubble's ZB-H1 (backward split into B and W, Qi et al. 2024) and ZB-V (the
/// same split, 2 stages per device placed in a V).
inline constexpr std::string_view kPipelineScheduleNames[] = {"gpipe", "1f1b", "1f1b*",
                                                              "interleaved", "zb-h1", "zb-v"};

/// What planning, the search and the option checks ask of a schedule, in one
/// table (a schedule is added here, not in string compares across files).
/// What one schedule alone does (GPipe's backward order, 1F1B*'s in-flight
/// counts, a placement check) stays with its code.
struct ScheduleTraits {
  /// How many stages a device runs: one; exactly two (ZB-V's V); any v >= 1,
  /// the `virtual_stages` option (interleaved 1F1B's looping placement).
  enum class StagesPerDevice : uint8_t { One, Two, Any };
  std::string_view name;
  StagesPerDevice stages_per_device;
  /// Stages per device when `virtual_stages` is 0 (unset).
  int default_virtual_stages;
  /// Each backward task is split into B and W (Note [Backward split]).
  bool splits_backward;
};
inline constexpr ScheduleTraits kScheduleTraits[] = {
    {"gpipe", ScheduleTraits::StagesPerDevice::One, 1, false},
    {"1f1b", ScheduleTraits::StagesPerDevice::One, 1, false},
    {"1f1b*", ScheduleTraits::StagesPerDevice::One, 1, false},
    {"interleaved", ScheduleTraits::StagesPerDevice::Any, 2, false},
    {"zb-h1", ScheduleTraits::StagesPerDevice::One, 1, true},
    {"zb-v", ScheduleTraits::StagesPerDevice::Two, 2, true},
};
static_assert(std::size(kScheduleTraits) == std::size(kPipelineScheduleNames) && [] {
  for (size_t i = 0; i < std::size(kScheduleTraits); ++i) {
    if (kScheduleTraits[i].name != kPipelineScheduleNames[i]) return false;
  }
  return true;
}(), "one traits row per schedule name, in the same order");

/// The row of `schedule`, or a row of a schedule of one stage per device
/// with nothing split for a name the table lacks (callers check the name
/// with checkOneOf first).
constexpr ScheduleTraits scheduleTraits(std::string_view schedule) {
  for (const ScheduleTraits& t : kScheduleTraits) {
    if (t.name == schedule) return t;
  }
  return {schedule, ScheduleTraits::StagesPerDevice::One, 1, false};
}
/// Whether the schedule runs more than one stage on a device.
constexpr bool severalStagesPerDevice(std::string_view schedule) {
  return scheduleTraits(schedule).stages_per_device != ScheduleTraits::StagesPerDevice::One;
}
/// `partition`: balance compute time, balance memory, balance compute time
/// with the transfer time of every cut (PipeDream's straight-pipeline DP,
/// no stage replication), MadPipe's memory-aware DP.
inline constexpr std::string_view kPartitionMethodNames[] = {"balance-time", "balance-size",
                                                             "balance-time-comm", "madpipe"};
/// The checkpoint pass's modes: torchgpipe's.
inline constexpr std::string_view kCheckpointModeNames[] = {"always", "except_last", "never"};
/// `checkpoint` of a pipeline: torchgpipe's modes for every layer, or
/// "per_layer": the fewest layers recomputed that make each device's
/// simulated peak fit its memory (Note [Recompute per layer]).
inline constexpr std::string_view kPipelineCheckpointNames[] = {"always", "except_last", "never",
                                                                "per_layer"};
/// `batch_norm`: refuse training-mode batch norm, or torchgpipe's DeferredBatchNorm.
inline constexpr std::string_view kBatchNormModeNames[] = {"refuse", "deferred"};
/// `loss_reduction`: how micro-batch losses combine.
inline constexpr std::string_view kLossReductionNames[] = {"auto", "mean", "sum"};
/// `strategy`: who picks the plan: the options as given ("manual"), or the
/// search over placers and pipelines by simulation ("auto", passes/search/).
inline constexpr std::string_view kStrategyNames[] = {"manual", "auto"};

/// `devices` given as a word instead of a count: one logical device per rank
/// of the torch.distributed process group (python/modelpar/distributed/rank_executor.py).
inline constexpr std::string_view kDeviceWordNames[] = {"world"};

/// One option and its valid values, for listing (modelpar._C.option_names()).
struct OptionValues {
  std::string_view option;
  std::span<const std::string_view> values;
};
std::vector<OptionValues> optionValues();

/// "'a', 'b', 'c'".
std::string quotedList(std::span<const std::string_view> values);

/// ConfigError `modelpar <who>: <option>='<value>' is not valid; <option>
/// takes one of 'a', 'b'` unless `value` is one of `values`. A value that was
/// renamed gets the new name in the message.
void checkOneOf(std::string_view who, std::string_view option, std::string_view value,
                std::span<const std::string_view> values);

/// ConfigError `modelpar <who>: devices=<n> is not valid; devices takes an
/// int from 1 to 64` unless 1 <= n <= kMaxDevices.
void checkDevices(std::string_view who, int64_t devices);

}  // namespace modelpar::passes
