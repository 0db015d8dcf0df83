// The model-parallel sequence of passes, passes/' entry point (ARCHITECTURE.md:
// `planPlacement(Graph, Options) -> PlacementPlan`, the Program plus its report):
//
//   cost → coarsen (optional) → place-mtopo | place-metf | place-msct → lower → simulate
//
// The cross-cutting work lives here, not in the passes (STYLE.md): every pass
// is timed; the IR is verified after every pass, and a broken invariant names
// the pass that broke it; with a dump directory the IR after every pass is
// written as text; a progress callback hears each pass start and end; the
// passes' counters are collected into a statistics table. Passes never print
// and neither does the pipeline: PlacementPlan::summary() returns text.
//
// Nothing half-applied: every option is checked before the first pass runs,
// and the passes work on a copy, so the caller's graph is never modified,
// whether planPlacement() returns or throws.
//
// Example:
//   PlacementOptions o;
//   o.devices = 4;
//   o.placer = "m-sct";
//   o.memory_bytes = {parseBytes("16GiB")};
//   o.progress = [](const PassEvent& e) { if (e.finished) log(e.pass, e.seconds); };
//   PlacementPlan p = planPlacement(graph, o);          // graph is unchanged
//   p.program;                        // run it on runtime::Executor
//   std::string text = p.summary();   // what `python -m modelpar plan` prints
#pragma once

#include <cstdint>
#include <functional>
#include <optional>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "ir/graph.h"
#include "ir/program.h"
#include "passes/cost/cost_model.h"
#include "passes/cost/device_model.h"
#include "passes/lower/lower.h"
#include "passes/lower/simulate.h"
#include "passes/option_names.h"
#include "passes/pass_runner.h"
#include "passes/place/coarsen.h"
#include "passes/place/place_msct.h"
#include "passes/place/placement.h"

namespace modelpar::passes {

inline constexpr std::string_view kPlanPlacementId = "plan";
inline constexpr std::string_view kFixedPlacementPassId = "fixed-placement";

/// Options of planPlacement(). Defaults plan for one 16 GiB device of DeviceSpec{}
/// with m-ETF on coarsened units.
struct PlacementOptions : PassRunnerOptions {
  /// Logical devices, >= 1. Unset: the machine's count (1 without a machine).
  std::optional<int> devices;
  /// The machine. Unset: `devices` copies of DeviceSpec{} joined by LinkSpec{}.
  /// With more devices asked for than it has, a one-device machine is
  /// replicated (its default link joins the copies); a larger one is an
  /// error. With fewer, its first `devices` devices are used.
  std::optional<DeviceModel> machine;
  /// Memory per device in bytes (> 0): empty keeps the machine's, one value
  /// applies to every device, otherwise one value per device.
  std::vector<int64_t> memory_bytes;
  /// One of kPlacerNames.
  std::string placer = "m-etf";
  /// Layer -> device: every node whose `layer` is a key runs on that device,
  /// whatever the placer chose (how torch.compile puts a layer's backward on
  /// its forward's device). After the placer, pinned nodes are moved and the
  /// per-device orders rebuilt in graph order (a topological order), so the
  /// placement stays valid, and graph inputs go to their first reader's
  /// device; the placer's makespan estimate is then stale, the
  /// simulation is not. Devices out of range are a ConfigError.
  std::vector<std::pair<std::string, int>> pinned_layers;
  /// Graph input name -> device: the input is bound there (after
  /// pinned_layers, whatever its first reader; names this graph does not
  /// have as inputs are skipped). How a training step compiled again over
  /// ranks keeps each parameter on the rank whose optimizer owns it (planJoint
  /// then puts its gradient there too). Devices out of range are a ConfigError.
  std::vector<std::pair<std::string, int>> pinned_inputs;
  /// A fixed placement to lower and simulate instead of placing: when set,
  /// coarsen and the placer are skipped (units: one per node) and this
  /// placement, checked against the graph (checkPlacement) and the machine's
  /// device count, is used as pass `fixed-placement` (pinned_layers still
  /// apply after it). Its peak memory is checked by the simulator instead of
  /// a placer: a device whose simulated peak exceeds its capacity is a
  /// PlanDoesNotFitError naming the device and the bytes. How the joint
  /// forward + backward plan is split into one Program per graph
  /// (passes/plan_joint.h).
  std::optional<Placement> placement;
  /// Run pass `coarsen` (off: one placement unit per node, grouped by layer).
  bool coarsen = true;
  CoarsenOptions coarsen_options;
  CostOptions cost_options;
  /// m-TOPO: balance memory over the devices (true) or fill each in turn.
  bool mtopo_uniform = true;
  /// m-SCT: the favourite-child rounding threshold, the LP's iteration
  /// limit (what decides where an unfinished LP stops: the same on every
  /// rank and load; MSctOptions::lp_iteration_limit) and its time limit (a
  /// backstop).
  double msct_threshold = 0.5;
  int64_t msct_lp_iteration_limit = 100000;
  double msct_lp_time_limit_s = 20.0;
  LowerOptions lower_options;
  /// Keep every instruction's times in the report (needed for traces).
  bool record_timeline = false;
  /// Planned for the ranks of a process group: every device's receives in
  /// their senders' order after lowering (ir/receive_order.h), as the rank
  /// executor runs them, so that the simulated peaks and the memory check
  /// are those of what runs.
  bool receive_in_send_order = false;
};

/// What planPlacement() returns: the Program and its report.
struct PlacementPlan {
  /// The lowered program: costs and devices on every node, explicit
  /// send / recv / free per device. It verifies.
  ir::Program program;
  Placement placement;
  /// The placement units (one per node without coarsening).
  Coarsening units;
  /// The machine planned for (memory options applied).
  DeviceModel machine;
  SimulationReport simulation;
  CostStats cost;
  MSctStats msct;  ///< filled by m-SCT only
  /// The step on one device of the machine: the sum of node times.
  double single_device_us = 0;
  std::vector<PassStats> stats;

  double stepTimeUs() const { return simulation.step_time_us; }
  /// single_device_us / step time (1 for an empty step).
  double speedup() const;
  /// Units and nodes each device runs.
  std::vector<int64_t> unitsPerDevice() const;
  std::vector<int64_t> nodesPerDevice() const;
  /// The statistics table as text, one line per pass.
  std::string statsTable() const;
  /// People's summary: placer, units and nodes per device, simulated step
  /// time, speed-up over one device, peak memory per device against its
  /// capacity, transfers, and the statistics table.
  std::string summary() const;
};

/// Runs the pipeline on a copy of g. Whatever the placer chose, an in-place
/// node writing a graph input (`aten::copy_(%running_mean, ...)`) runs on
/// that input's device, or its write would land on a copy (Note [In-place
/// writes to graph inputs] in plan_placement.cpp). Throws:
///   ConfigError naming the option and its valid values for a bad option
///     (devices < 1, an unknown placer, memory <= 0 or a count that matches
///     neither 1 nor the devices, a machine too small), before any pass runs;
///   InvalidIrError for an input graph that does not verify, or naming the
///     pass after which the IR broke an invariant;
///   PlanDoesNotFitError from the placer, naming layer, device and bytes, or
///     when nodes moved after the placer (pinned layers, in-place input
///     writes) make a simulated peak exceed a device's capacity;
///   InternalError if a simulated peak exceeds a capacity the placer accepted.
PlacementPlan planPlacement(const ir::Graph& g, const PlacementOptions& options = {});

/// The machine planPlacement() would use for `options` (the option checks included).
DeviceModel planMachine(const PlacementOptions& options);

/// "61.2 us", "1.23 ms", "2.10 s".
std::string formatMicros(double us);

}  // namespace modelpar::passes
