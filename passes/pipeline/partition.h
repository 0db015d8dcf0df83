// Pass `partition`: cuts a LayerChain (layer_chain.h) into pipeline stages
// and assigns them to devices, and counts each stage's memory under a
// pipeline schedule.
//
// Methods (PartitionOptions::method):
//   balance-time / balance-size  torchgpipe's balance (seed 002; algorithms.md
//       §2.3): min(n, L) contiguous non-empty blocks; here the exact minimum
//       of the largest block's time u_F+u_B (size: weight_copies x W +
//       a_store), by a DP (torchgpipe's own loop stops at the Bárány-Grinberg
//       bound and need not reach it).
//   balance-time-comm  PipeDream's DP (algorithms.md §5.1), straight pipeline, no
//       replication: at most n contiguous stages minimising the bottleneck
//       max(stage time, cut time C), C counting the activation and its
//       gradient (the form with --activation_compression_ratio).
//   madpipe  MadPipe (seed 004 §4.2): n-1 normal devices with one stage each
//       and one special device that may take several non-contiguous stages;
//       memory of each stage from 1F1B* groups at a target period T^; the
//       binary search of Algorithm 1 on T^ (partition_madpipe.cpp). Phase 2
//       (§4.3, partition_ilp.cpp): when the special device holds several
//       stages, the least period at which an ILP finds an explicit periodic
//       pattern within memory replaces the DP's (StagePartition::pattern).
// Every plan is scheduled by `schedule` (MadPipe: always 1F1B*, or its
// pattern) and its period and memory evaluated (evaluatePartition).
//
// Model (seed 004 §3). Cut c (after layer c) costs C(c) = 2 (latency +
// a_out[c] / bandwidth) per micro-batch on its own link. Period of a plan:
// max(largest device load, largest C over its cuts) for GPipe / 1F1B; for
// 1F1B* the smallest period >= that at which the memory fits. Memory of a
// stage [k, l) keeping g micro-batches of activations:
//     weight_copies x W(k..l) + g x a_store(k..l) + 2 a_out[k-1] + 2 a_out[l-1]
// (buffers for activation + gradient at each cut it has), where g is
//     GPipe m;  1F1B min(m, S - s) for stage s of S;  1F1B* min(m, group of s);
//     interleaved 1F1B min(m, S - s) for virtual stage s of S = p·v (an approximation);
//     ZB-H1 min(m, S - s), as 1F1B (a lower bound: Note [ZB-H1]);
//     ZB-V min(m, S - s) for stage s of S = 2p (its forwards before the
//     first backward, Note [ZB-V]).
// With recomputation (PartitionOptions::recompute; checkpoint 'always',
// 'except_last' or 'per_layer'), g x a_store becomes
//     (g-1) x min(a_out[k-1], a_store(k..l)) + a_store(k..l)
// Note [Partition memory with recomputation]: a checkpointed micro-batch
// keeps the stage's input until its backward and recomputes the rest; the
// one in its backward holds all of it. This is the least a checkpoint mode
// can keep (per_layer recomputes only some layers, chosen afterwards on the
// simulated peaks); the simulated peak of the lowered program is what a
// plan is held to, so the model only has to not refuse plans that fit.
// (Measured before it, tests/python/test_memory_limit_sweep.py: the least
// limit accepted lay at 1.5-2.5x the largest simulated peak.) Random ops'
// masks, which stay stored, are not counted.
// A device's memory is the sum over its stages. Capping g at m reflects a
// pipeline flushed every m micro-batches; a large m gives the paper's stream.
//
// Guarantees: plans cover every layer once, stage_begin ascending from 0;
// partitionChain returns a plan whose memory_bytes fit memory_bytes per
// device or throws PlanDoesNotFitError with the numbers. MadPipe's special
// device is counted with the memory of running its stages' forwards before
// their backwards (Figure 5a), an upper bound where the paper's DP uses the
// g-1 lower bound. The pattern ILP models a stream (no cap at m) and is
// bounded by a CBC time limit: if it finds nothing, the plan keeps the DP's
// period without a pattern. Not done: replication (data parallelism inside
// a stage); plans are not yet wired into planPlacement() or the schedules.
//
// Example:
//   PartitionOptions o;  o.method = "madpipe";  o.devices = 4;
//   o.memory_bytes = parseBytes("8GiB");  o.bandwidth_bytes_per_s = 12e9;
//   StagePartition p = partitionChain(chainFromGraph(g), o);
//   p.stage_begin;  p.stage_device;  p.period_us;  p.memory_bytes;
#pragma once

#include <cstdint>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "passes/pipeline/layer_chain.h"

namespace modelpar::passes {

inline constexpr std::string_view kPartitionPassId = "partition";

enum class PipelineSchedule : uint8_t {
  GPipe, OneFOneB, OneFOneBStar, Interleaved, ZeroBubbleH1, ZeroBubbleV
};
std::string_view name(PipelineSchedule s);  // gpipe 1f1b 1f1b* interleaved zb-h1 zb-v
std::optional<PipelineSchedule> parsePipelineSchedule(std::string_view s);

struct PartitionOptions {
  /// "balance-time" | "balance-size" | "balance-time-comm" | "madpipe".
  std::string method = "madpipe";
  int devices = 2;
  /// Micro-batches per flush: caps the activations a stage keeps.
  int microbatches = 8;
  /// Capacity of each device (MadPipe plans with it on every device).
  int64_t memory_bytes = int64_t{16} << 30;
  /// Per device, where devices differ (one entry per device): the balance-*
  /// plans are checked against each device's own; empty: memory_bytes each.
  std::vector<int64_t> device_memory_bytes;
  int64_t capacityOf(int device) const {
    return device_memory_bytes.empty() ? memory_bytes
                                       : device_memory_bytes[static_cast<size_t>(device)];
  }
  double bandwidth_bytes_per_s = 12e9;
  double latency_us = 0;
  /// Schedule whose memory the plans of balance-* are counted
  /// with (MadPipe plans always use 1F1B*).
  PipelineSchedule schedule = PipelineSchedule::OneFOneBStar;
  /// The balance-* plans are counted as checkpointed: a stage keeps only
  /// its input for each micro-batch in flight but one (Note [Partition
  /// memory with recomputation]). MadPipe's DP does not recompute.
  bool recompute = false;
  /// MadPipe: most binary-search steps on T^ (Algorithm 1's K; the paper
  /// uses 10); the search also stops when its bounds are within 0.1 %.
  int madpipe_iterations = 20;
  /// MadPipe: DP states keep one partial plan per bucket of the delay V
  /// (this many per period) and of the special device's memory (this many
  /// per capacity). Buckets only prune: kept states carry exact values.
  int madpipe_delay_buckets = 8;
  int madpipe_memory_buckets = 16;
  /// MadPipe phase 2 (§4.3): when the plan puts several stages on a device,
  /// the least period (binary search, 8 steps) at which periodicPatternIlp
  /// finds a pattern, with this CBC time limit per solve, a backstop set
  /// well above what the node limit takes; 0 skips phase 2.
  double madpipe_pattern_time_limit_s = 10;
  /// And CBC's limit on branch-and-bound nodes per solve, which decides
  /// where an unfinished solve stops: work that does not depend on the
  /// machine's load, so two processes planning the same step get the same
  /// pattern (Note [A pattern that does not depend on the clock] in
  /// partition_madpipe.cpp). 0: none (the clock decides; not for plans made
  /// over ranks).
  int64_t madpipe_pattern_node_limit = 200;
};

/// A periodic pattern (seed 004 §3): in period k, each operation starts at
/// k T + its start and processes micro-batch k - its shift. Per stage the
/// forward and backward, per cut the activation and the gradient transfer.
struct PeriodicPattern {
  double period_us = 0;
  std::vector<double> fwd_start_us, bwd_start_us, act_start_us, grad_start_us;
  std::vector<int> fwd_shift, bwd_shift, act_shift, grad_shift;
  std::vector<int> stage_activations;  ///< bwd_shift - fwd_shift + 1 per stage
  std::vector<int64_t> memory_bytes;   ///< per device
  bool optimal = false;                ///< CBC proved the memory minimal
};

/// A partition of the chain into stages placed on devices.
struct StagePartition {
  std::string method;
  PipelineSchedule schedule = PipelineSchedule::OneFOneBStar;
  std::vector<int> stage_begin;   ///< first layer of each stage, ascending
  std::vector<int> stage_device;  ///< device of each stage
  int num_devices = 0;            ///< devices available (some may be unused)
  double load_period_us = 0;      ///< max(device load, cut time), memory ignored
  double period_us = 0;           ///< period the schedule runs at (inf: does not fit)
  std::vector<int> stage_activations;  ///< micro-batches of activations per stage
  std::vector<int64_t> memory_bytes;   ///< per device, as the model counts it
  bool fits = false;              ///< memory_bytes <= capacity on every device
  /// MadPipe, when a device holds several stages: the ILP's pattern (§4.3),
  /// whose period and memory then replace the DP's (dp_period_us keeps the
  /// DP's). Empty when phase 2 is off or CBC found none within its limit.
  std::optional<PeriodicPattern> pattern;
  double dp_period_us = 0;

  int numStages() const { return static_cast<int>(stage_begin.size()); }
  /// One past the last layer of stage s (needs the chain length).
  int stageEnd(int s, int num_layers) const;
};

/// C(c): link time of cut c (activation + gradient) per micro-batch.
double cutTime(const LayerChain& chain, int c, const PartitionOptions& o);

/// 1F1B* groups (seed 004 §4.1) of stages with times U(s) and cut times C
/// (cut_us[s] between stage s and s+1; empty = no communication), at period
/// T: walking from the last stage, stages and cuts (cuts act as stages) join
/// the current group while its total stays <= T. Group 1 holds the last
/// stage. Result: group number of each stage = micro-batches whose
/// activations it keeps (= forwards it runs ahead of its backward). Throws
/// ConfigError when T <= 0, a size mismatches, or an element exceeds T.
std::vector<int> oneFOneBStarGroups(std::span<const double> stage_us,
                                    std::span<const double> cut_us, double period_us);

/// Micro-batches of activations each of `groups.size()` (or num_stages)
/// stages keeps under a schedule: GPipe m, 1F1B min(m, S - s), 1F1B*
/// min(m, groups[s]) (groups needed only for 1F1B*), interleaved 1F1B
/// min(m, S - s) over its S virtual stages, ZB-H1 min(m, S - s) (1F1B's
/// count; both approximations: see the .cpp), ZB-V min(m, S - s) over its S
/// = 2p stages.
std::vector<int> activationsInFlight(PipelineSchedule s, int num_stages, int microbatches,
                                     std::span<const int> groups = {});

/// Memory of each stage keeping activations[s] micro-batches (file comment);
/// with `recompute`, all of them but one keep only the stage's input
/// (Note [Partition memory with recomputation]).
std::vector<int64_t> stageMemory(const LayerChain& chain, std::span<const int> stage_begin,
                                 std::span<const int> activations, bool recompute = false);

/// Loads, period and memory of a given partition under o.schedule (1F1B*:
/// the smallest period >= the load period at which memory fits, found
/// exactly among the periods where a group changes). fits=false and
/// period_us=inf when no period fits. Throws ConfigError on a malformed
/// partition (unsorted, out of range, device >= o.devices).
StagePartition evaluatePartition(const LayerChain& chain, std::vector<int> stage_begin,
                                 std::vector<int> stage_device, const PartitionOptions& o,
                                 std::string method = "given");

/// The device whose memory need (per device, as StagePartition::memory_bytes)
/// is furthest over its capacity in o (the first on a tie): what an error names.
int mostOverCapacity(const std::vector<int64_t>& need, const PartitionOptions& o);

/// First index of each of min(blocks, costs.size()) contiguous non-empty
/// blocks minimising the largest block sum (costs >= 0).
std::vector<int> balanceBlocks(std::span<const double> costs, int blocks);

/// PipeDream's straight-pipeline DP: stage_begin of at most o.devices stages
/// minimising max(stage time, cut time). Memory is ignored.
std::vector<int> balanceTimeCommSplit(const LayerChain& chain, const PartitionOptions& o);

/// MadPipe (partition_madpipe.cpp): the best plan found, evaluated under
/// 1F1B*, then (phase 2) given a pattern; nullopt when no allocation fits
/// (a result, not an error).
std::optional<StagePartition> madpipePartition(const LayerChain& chain, const PartitionOptions& o);


/// MadPipe's second phase (seed 004 §4.3) as an ILP on COIN-OR CBC: a valid
/// periodic pattern of period `period_us` for the plan's stages and devices
/// (each device and each cut's link runs one operation at a time, cyclically;
/// same-micro-batch dependencies F_s -> act_s -> F_s+1, F_last -> B_last,
/// B_s+1 -> grad_s -> B_s), each device's memory <= o.memory_bytes counting
/// stage s with bwd_shift - fwd_shift + 1 micro-batches, minimising that
/// memory. Our own formulation (the paper's cites an ILP of a companion
/// report): binary order variables per pair of operations on a resource.
/// The pattern is a stream (no cap at o.microbatches). nullopt when CBC proves
/// it infeasible or finds nothing within time_limit_s (or node_limit
/// branch-and-bound nodes, when > 0).
/// With minimise_memory=false any feasible pattern will do (CBC stops at the
/// first one; much faster on shared devices with many stages).
std::optional<PeriodicPattern> periodicPatternIlp(const LayerChain& chain, const StagePartition& plan,
                                                  const PartitionOptions& o, double period_us,
                                                  double time_limit_s = 10,
                                                  bool minimise_memory = true,
                                                  int64_t node_limit = 0);

namespace detail {
/// The 1F1B* delay arithmetic shared by oneFOneBStarGroups and MadPipe's DP
/// (seed 004 §4.2's x (+) y): adding y to a delay x stays in x's group if the
/// group's total stays <= T, else starts the next group.
double groupAdd(double x, double y, double period_us);
/// Group number of a delay (>= 1).
int groupOf(double delay_us, double period_us);
}  // namespace detail

/// Pass `partition`: checks options (ConfigError naming the option), runs
/// o.method, evaluates the plan; throws PlanDoesNotFitError with the memory
/// needed and available when the plan (madpipe: any plan) does not fit.
StagePartition partitionChain(const LayerChain& chain, const PartitionOptions& o);

}  // namespace modelpar::passes
