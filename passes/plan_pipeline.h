// planPipeline(): pipeline parallelism from one training-step graph — the
// issue-6 passes chained the way planPlacement() chains the model-parallel ones:
//
//   microbatch(m=1) → cost → chainFromGraph → partition      (stages from one micro-batch)
//   microbatch(m)   → cost → checkpoint → schedule + lower  → simulate
//
// The step graph has a symbolic batch dimension (microbatch.h). The chain the
// partitioner cuts is the step at the first micro-batch's size (so times and
// bytes are per micro-batch, MadPipe's unit); every node of the micro-batched
// graph then runs on the stage of its `layer` (a node without a layer takes
// the latest stage among the nodes it reads, else stage 0), the checkpoint
// pass adds recompute copies, and the schedule pass orders each device's
// tasks (GPipe, 1F1B, 1F1B* with the partition's in-flight counts,
// interleaved 1F1B over devices x virtual_stages stages placed looping,
// ZB-H1 with each backward split into B and W, or ZB-V over devices x 2
// stages placed in a V, backwards split likewise) and
// lowers them to a Program with explicit sends per micro-batch. With
// checkpoint='per_layer' the layers to recompute are chosen first, the fewest
// that make every device's simulated peak fit its memory (Note [Recompute
// per layer]). Values that
// cross several stages go straight from producer to reader (portals) unless
// `portals` is off (relayed stage by stage).
//
// Nothing half-applied: every option is checked before the first pass; the
// caller's graph is not modified. Errors: ConfigError naming the option and
// its valid values; the passes' errors (UnsupportedOpError from microbatch for
// a step that cannot be split exactly, PlanDoesNotFitError from partition);
// PlanDoesNotFitError when the simulated peak memory of a device exceeds its
// capacity (the partition's memory model is an estimate; the simulation of
// the lowered Program is what runs).
//
// Example:
//   PipelinePlanOptions o;
//   o.devices = 2;  o.microbatches = 8;  o.batch_size = 64;
//   o.schedule = "1f1b";  o.partition = "balance-time";  o.checkpoint = "except_last";
//   PipelinePlan p = planPipeline(step, o);
//   p.program;                       // run it on runtime::Executor (inputs at full batch)
//   std::cout << p.summary();        // stages, period, step time, bubble, memory
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "ir/graph.h"
#include "ir/program.h"
#include "passes/cost/cost_model.h"
#include "passes/cost/device_model.h"
#include "passes/lower/simulate.h"
#include "passes/pipeline/checkpoint.h"
#include "passes/pipeline/layer_chain.h"
#include "passes/pipeline/microbatch.h"
#include "passes/pipeline/partition.h"
#include "passes/plan_placement.h"

namespace modelpar::passes {

inline constexpr std::string_view kPlanPipelineId = "pipeline";

/// The runner options (verify, dump_dir, progress, after_pass) are PassRunnerOptions'.
struct PipelinePlanOptions : PassRunnerOptions {
  /// Devices (>= 1); stages <= devices (MadPipe may put several on one).
  int devices = 2;
  /// Micro-batches asked for (>= 1; torch.chunk's rule may give fewer).
  int microbatches = 4;
  /// The full batch size B (required): the value of the batch symbol.
  std::optional<int64_t> batch_size;
  /// microbatch's other options (batch symbol / dims, loss, seed,
  /// reduction, allow_random); its microbatches and batch_size are set
  /// from the fields above.
  MicrobatchOptions microbatch;
  std::string schedule = "gpipe";         ///< one of kPipelineScheduleNames
  /// Stages per device, v (>= 0): 0 is the default, 2 for "interleaved" and
  /// "zb-v", 1 otherwise; more than 1 only with "interleaved", whose chain
  /// is cut into devices x v stages, stage s on device s % devices, and
  /// "zb-v", which takes only 2 (devices x 2 stages, stage s on device s for
  /// s < devices and 2·devices-1-s after: Note [ZB-V]).
  int virtual_stages = 0;
  std::string partition = "balance-time"; ///< one of kPartitionMethodNames
  std::string checkpoint = "except_last"; ///< one of kPipelineCheckpointNames
  /// Skip values go straight to their readers (true) or are relayed through
  /// every stage between (false, torchgpipe without portals).
  bool portals = true;
  /// The machine. Unset: `devices` copies of DeviceSpec{} joined by LinkSpec{}
  /// (a one-device machine is replicated, as planPlacement() does).
  std::optional<DeviceModel> machine;
  /// Memory per device: empty keeps the machine's, one value for all, or
  /// one per device.
  std::vector<int64_t> memory_bytes;
  CostOptions cost_options;
  /// Memory per weight byte (LayerChain::weight_copies).
  double weight_copies = 3.0;
  /// Keep every instruction's times in the report (for traces).
  bool record_timeline = false;
  /// Planned for the ranks of a process group: every device's receives
  /// are put in their senders' order (ir/receive_order.h) before the
  /// simulation, as the rank executor runs them, so that the simulated
  /// peaks and the memory check are those of what runs.
  bool receive_in_send_order = false;
  /// MadPipe's phase 2: CBC's time limit per pattern solve, a backstop
  /// (PartitionOptions::madpipe_pattern_time_limit_s).
  double madpipe_pattern_time_limit_s = 10;
  /// And its node limit, which decides: the same pattern on every rank and
  /// under any load (PartitionOptions::madpipe_pattern_node_limit).
  int64_t madpipe_pattern_node_limit = 200;
};

struct PipelinePlan {
  /// The lowered program over the devices the stages use; its graph takes
  /// the step's inputs at full batch and returns the step's outputs.
  ir::Program program{ir::Graph("pipeline"), 1};
  /// The chain the partitioner cut (one micro-batch) and its result.
  LayerChain chain;
  StagePartition partition;
  /// The scheduled graph (with relay copies) and its placement, from which
  /// `program` was lowered (split_phases.h splits them for torch.compile).
  ir::Graph graph{"pipeline"};
  Placement placement;
  /// Per NodeId of program.graph(): its stage.
  std::vector<int32_t> stage_of_node;
  /// Per chain layer, its stage.
  std::vector<int32_t> stage_of_layer;
  std::vector<int64_t> microbatch_sizes;
  std::string schedule, checkpoint;
  /// checkpoint='per_layer': the layers recomputed (chain order; Note
  /// [Recompute per layer]), in every micro-batch when
  /// recompute_every_microbatch, else in all but the last.
  std::vector<std::string> recomputed_layers;
  bool recompute_every_microbatch = false;
  /// Stages per device (PipelinePlanOptions::virtual_stages resolved): v.
  int virtual_stages = 1;
  bool portals = true;
  DeviceModel machine;
  SimulationReport simulation;
  /// The step on one device: the sum of the micro-batched graph's node times.
  double single_device_us = 0;
  std::vector<PassStats> stats;

  int numStages() const { return partition.numStages(); }
  double stepTimeUs() const { return simulation.step_time_us; }
  /// single_device_us / step time.
  double speedup() const;
  /// The ideal speed-up of n uniform stages over m micro-batches with free
  /// transfers: GPipe/1F1B n·m / (m + n − 1); interleaved, n = p·v stages on
  /// p devices, p·v·m / (v·m + p − 1); ZB-H1 with forward, B and W alike,
  /// n·3m / (3m + n − 1) (Note [ZB-H1]); ZB-V likewise, n = 2p stages on p
  /// devices, p·6m / max(6m + p − 1, 4(m + p) − 2) (Note [ZB-V]).
  double idealSpeedup() const;
  /// 1 − (compute busy summed over used devices) / (devices × step time).
  double bubbleFraction() const;
  std::string summary() const;
};

/// Runs the pipeline passes on a copy of `step` (see the file comment).
PipelinePlan planPipeline(const ir::Graph& step, const PipelinePlanOptions& options);

}  // namespace modelpar::passes
