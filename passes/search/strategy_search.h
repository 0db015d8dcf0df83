// Pass `strategy-search`: chooses how to run a training step on N devices by
// planning and simulating every candidate strategy and keeping the fastest
// one that fits (DistIR's grid search by simulation, seeds/003 §5; the
// strategies are Baechi's placers and the pipelines of issue 6).
//
// Candidates, for a step graph with a symbolic batch of size B:
//   one-device   the step on device 0 (planPlacement, devices = 1);
//   placement    planPlacement with each placer of `placers` on N devices;
//   pipeline     planPipeline for every schedule x stages per device v
//                (interleaved 1F1B only: Note [Schedules in the search]) x
//                micro-batch count m in {N, 2N, 4N, ...} (m <= B) x
//                partition method x checkpoint mode (MadPipe's partition
//                only with 1F1B*, the schedule it is made for; per_layer,
//                Note [Recompute per layer], planned only where the same
//                pipeline with checkpoint='never' does not fit, since it is
//                that plan otherwise: pruned with that reason); only with
//                N >= 2.
// Each is planned and simulated; a candidate over its devices' memory
// (PlanDoesNotFitError) or whose plan fails (a deadlocked or invalid
// Program, a step that cannot be micro-batched) is dropped with the reason.
// The chosen candidate has the smallest simulated step time; ties go to the
// earlier candidate in the order above (the simpler plan).
//
// Note [A lower bound per candidate]: before planning anything, the search
// costs the step once on one device at the real batch size: T1 (the sum of
// node times) and L (the launch overhead summed over the nodes that read or
// write a value of the batch's size, which every micro-batch repeats).
// Under the analytic cost model (cost_model.h) an op's time minus its
// launch overhead is at least linear in its share of the batch (flops and
// activation bytes scale with it; parameter bytes do not shrink), and a
// profiled time is split the same way (MicrobatchOptions::
// launch_overhead_us), so m micro-batches cost at least (T1 - L) + m·L
// together, and N devices run them in no less than
// LB = ((T1 - L) + m·L) / N + the machine's step overhead (and worker
// overhead N - 1 times: a placement's or pipeline's program has N devices) (placements:
// m = 1; one device: N = 1; N is at most the machine's host cores where it
// sets them, Note [Shared host cores] in passes/lower/simulate.cpp). The search plans candidates in order of LB and
// stops once LB > the best step found: none of the rest can beat it
// (counted as `pruned`). A step without a symbolic batch gets one
// "pipelines" row saying why there are none.
//
// Note [Schedules in the search]: every schedule of kPipelineScheduleNames
// is searched unless `schedules` names some. Interleaved 1F1B adds a
// dimension, its stages per device v: those named in `virtual_stages`, else
// each v of kSearchedVirtualStages (2 and 3) for which the step has at least
// N·v layers (orderLayers, planPipeline's first pass, counts them once before
// the search), so a small model is not offered candidates that can only fail
// to cut; named with no v that fits, v = 2 is planned and its failure says
// why; zb-v (2 stages per device in a V) likewise when the step has 2N
// layers or zb-v is named. Their partitions are balance-time and
// balance-size unless `partitions` names balance-time-comm, which chooses
// its own number of stages and so cut fewer than N·v on most small steps. Larger v shrink the bubble ((p-1)/(v·m + p-1)) for v times the
// transfers and are named when wanted. ZB-H1's partition counts memory as
// 1F1B's, a lower bound for stages after the first (Note [ZB-H1] in
// passes/pipeline/schedule_zero_bubble.cpp), interleaved's by an
// approximation (partition.cpp, activationsInFlight): a candidate is kept or
// dropped on the simulator's peak per device against the memory limit
// (planPipeline checks it), never on the partition's estimate. Before issue
// 35 these two were searched only when named; the lower bound prunes most of
// their candidates once a 1F1B plan near the bound is found.
//
// Preconditions: `step` verifies; options.batch_size is set. Guarantees: the
// caller's graph is not modified; every candidate appears in the result
// with its status. Does not: search device counts other than N, data or
// tensor parallelism, or placements inside pipeline stages.
//
// Example:
//   StrategySearchOptions o;
//   o.devices = 2;  o.batch_size = 64;  o.machine = DeviceModel::load("cpu.json");
//   StrategySearch s = searchStrategy(step, o);
//   s.chosenCandidate().label();   // "pipeline 1f1b m=4 balance-time checkpoint=never"
//   s.pipeline ? s.pipeline->program : s.placement->program;   // run it
//   std::cout << s.table();        // every candidate, time, memory, chosen marked
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "ir/graph.h"
#include "passes/cost/device_model.h"
#include "passes/pipeline/microbatch.h"
#include "passes/plan_pipeline.h"
#include "passes/plan_placement.h"

namespace modelpar::passes {

inline constexpr std::string_view kStrategySearchId = "strategy-search";
/// Interleaved 1F1B's stages per device searched when `virtual_stages` is
/// empty (Note [Schedules in the search]).
inline constexpr int kSearchedVirtualStages[] = {2, 3};

struct StrategySearchOptions {
  /// Devices N (1..kMaxDevices).
  int devices = 2;
  /// The full batch size B (required): the value of the batch symbol.
  std::optional<int64_t> batch_size;
  /// The machine (unset: DeviceSpec{} copies joined by LinkSpec{}); a
  /// one-device machine is replicated, as planPlacement does.
  std::optional<DeviceModel> machine;
  /// Memory per device: empty keeps the machine's, one for all, or one per device.
  std::vector<int64_t> memory_bytes;
  /// The pipelines' micro-batching options (batch symbol, loss, reduction,
  /// batch norm, allow_random); microbatches and batch_size are set per candidate.
  MicrobatchOptions microbatch;
  bool portals = true;
  /// What to enumerate; empty: every valid value (option_names.h).
  std::vector<std::string> placers, schedules, partitions, checkpoints;
  /// Interleaved 1F1B's stages per device, each >= 2; empty: those of
  /// kSearchedVirtualStages the step's layers allow (Note [Schedules in the
  /// search]).
  std::vector<int> virtual_stages;
  /// Micro-batch counts; empty: N, 2N, 4N, ... up to B.
  std::vector<int> microbatches;
  /// Per micro-batch count m: the per-op overhead that pipelines of m
  /// micro-batches are planned with (every device's launch_overhead_us, which
  /// MicrobatchOptions::launch_overhead_us charges each micro-batch's copy of
  /// a profiled node whole). The cost of an op does not fall linearly with its
  /// share of the batch, so one overhead fitted at B and B/2 does not hold at
  /// B/m (Note [The searched step] in modelpar/step_search.py measures the
  /// step at each B/m). A count not listed keeps the machine's.
  std::vector<std::pair<int, double>> microbatch_launch_overhead_us;
  bool one_device = true;   ///< the one-device candidate
  bool placements = true;   ///< the placer candidates
  bool pipelines = true;    ///< the pipeline candidates (N >= 2)
  /// Skip candidates whose lower bound cannot beat the best found
  /// (Note [A lower bound per candidate]).
  bool prune = true;
  /// m-SCT's LP: its iteration limit decides (the same on every rank and
  /// load: Note [An LP that does not depend on the clock]); the time limit is
  /// a backstop.
  int64_t msct_lp_iteration_limit = 100000;
  double msct_lp_time_limit_s = 5.0;
  /// MadPipe's pattern ILP: CBC's node limit per solve, which bounds the
  /// search's time the same on every machine and load, so that ranks
  /// searching the same step agree (Note [A pattern that does not depend on
  /// the clock]); the binary search solves up to 10. The time limit is a
  /// backstop.
  int64_t madpipe_pattern_node_limit = 200;
  double madpipe_pattern_time_limit_s = 5.0;
  /// Keep every planned candidate's simulated timeline, so that the chosen
  /// plan's Chrome trace can be written (toChromeTrace needs it).
  bool record_timeline = false;
};

enum class CandidateStatus { Ok, DoesNotFit, Failed, Pruned };
std::string_view toString(CandidateStatus s);

struct StrategyCandidate {
  std::string kind;  ///< "one-device", "placement" or "pipeline"
  std::string placer;                          ///< placement
  std::string schedule, partition, checkpoint; ///< pipeline
  int virtual_stages = 1;                      ///< pipeline: stages per device (interleaved)
  int microbatches = 1;                        ///< pipeline: asked for
  CandidateStatus status = CandidateStatus::Pruned;
  double lower_bound_us = 0;
  double step_us = 0;      ///< simulated (Ok only)
  int64_t peak_bytes = 0;  ///< simulated, the largest device's (Ok only)
  double plan_seconds = 0;
  std::string reason;      ///< why it was dropped or pruned
  /// "one-device", "placement m-etf", "pipeline 1f1b m=8 madpipe checkpoint=never",
  /// "pipeline interleaved v=2 m=4 balance-time checkpoint=never".
  std::string label() const;
};

struct StrategySearch {
  std::vector<StrategyCandidate> candidates;  ///< in enumeration order
  int chosen = -1;
  double seconds = 0;  ///< the whole search
  double t1_us = 0;    ///< T1 of the bound (one device, full batch)
  /// The chosen candidate's plan: one of the two is set.
  std::optional<PlacementPlan> placement;
  std::optional<PipelinePlan> pipeline;

  const StrategyCandidate& chosenCandidate() const;
  int count(CandidateStatus s) const;
  /// One line per candidate: label, status, simulated step, peak memory,
  /// the chosen one marked with '*'; then the search time.
  std::string table() const;
};

/// Runs the search on a copy of `step`. Throws ConfigError for bad options
/// (before planning anything), PlanDoesNotFitError when no candidate fits
/// (naming the candidate that came closest and the reasons), and
/// InternalError from a planner's own bug.
StrategySearch searchStrategy(const ir::Graph& step, const StrategySearchOptions& options);

/// Whether a candidate simulated at `step_us` beats the best so far
/// (`best_us`), candidate `index` against `best_index` (-1: none yet).
/// Times within a relative 1e-9 are a tie, which the earlier candidate in
/// enumeration order (the simpler plan) wins: the same work summed in
/// another order differs in its last bits (measured: m-TOPO placing all of
/// mlp's step on device 0, 116.41999999999999 us, chosen over the
/// one-device plan's 116.42 us, then ran 10 % slower with its idle worker).
bool beatsBest(double step_us, int index, double best_us, int best_index);

}  // namespace modelpar::passes
