// How a captured step runs: on the one-device interpreter, or planned by
// passes/ over the configured logical devices (placement: coarsen → m-TOPO |
// m-ETF | m-SCT → lower → simulate; or a pipeline: the batch made symbolic
// (symbolic_batch.h) → planPipeline) and run by the runtime's multi-device
// Executor. Built once per graph key at a capture; every replay reuses it,
// executor threads included.
#pragma once

#include <memory>
#include <string>
#include <vector>

#include <ATen/core/ivalue.h>

#include "ir/graph.h"
#include "modelpar/modelpar.h"

namespace modelpar::runtime {
class Executor;
class Interpreter;
}  // namespace modelpar::runtime

namespace modelpar::backend {

/// Example:
///   StepRunner r(built.graph, options);   // plans when planned(options)
///   std::vector<c10::IValue> out = r.run(inputs);   // one value per graph output
///   r.summary();                          // "modelpar plan @step: placer m-etf, 2 devices, ..."
class StepRunner {
 public:
  /// Plans `g` when the options ask for it (device_options.h planned()):
  /// placement over `o.devices` with `o.placer` (m-etf when empty) and
  /// `o.memory`, then an Executor over `o.device_map` (CPU workers: one
  /// intra-op thread each). Throws what planPlacement() and the Executor
  /// throw: PlanDoesNotFitError when the step does not fit the memory,
  /// ConfigError when a pipeline cannot find the batch dimension,
  /// UnsupportedOpError when the step cannot be micro-batched exactly,
  /// ConfigError for a device map that cannot be built, InvalidIrError,
  /// UnsupportedOpError for an op the runtime cannot resolve.
  StepRunner(const ir::Graph& g, const Options& o);
  ~StepRunner();
  StepRunner(const StepRunner&) = delete;
  StepRunner& operator=(const StepRunner&) = delete;

  /// Runs the step: one input per graph input, in order; one result per
  /// graph output. Throws ExecutionError naming the failing node. A
  /// pipeline's first run also runs the unpipelined step and throws
  /// UnsupportedOpError (nothing returned) when their results differ (not
  /// for a step with batch norm, which deferred batch norm normalises per
  /// micro-batch on purpose).
  std::vector<c10::IValue> run(std::vector<c10::IValue> inputs) const;

  /// The captured graph (as captured, before planning).
  const ir::Graph& graph() const { return graph_; }
  /// True for a pipeline plan.
  bool pipelined() const { return batch_size_ > 0; }
  /// Logical devices the step runs on (1 on the interpreter).
  int devices() const { return devices_; }
  /// The simulated step time of the plan in microseconds (0 unplanned).
  double simulatedStepUs() const { return simulated_us_; }
  /// The placement or pipeline report (PlacementPlan::summary(),
  /// PipelinePlan::summary()); "" unplanned.
  const std::string& placementSummary() const { return placement_summary_; }
  /// The executor's device map in words ("2 cpu-workers x 1 thread"), or
  /// "the CPU interpreter".
  const std::string& runsOn() const { return runs_on_; }

 private:
  void planPipeline(const Options& o, const std::string& device_map);

  ir::Graph graph_;
  int64_t batch_size_ = 0;  // a pipeline's (0: not a pipeline)
  std::unique_ptr<runtime::Interpreter> reference_;  // a pipeline's unpipelined step
  mutable bool checked_ = false;  // a pipeline's first run was checked
  int devices_ = 1;
  double simulated_us_ = 0;
  std::string placement_summary_;
  std::string runs_on_;
  std::unique_ptr<runtime::Interpreter> interpreter_;
  std::unique_ptr<runtime::Executor> executor_;
};

}  // namespace modelpar::backend
