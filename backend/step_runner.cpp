// A captured step on the interpreter or on a placed plan's Executor
// (step_runner.h).
#include "backend/step_runner.h"

#include "backend/device_options.h"
#include "runtime/check.h"
#include "runtime/executor.h"
#include "runtime/interpreter.h"

#ifdef MODELPAR_BACKEND_HAS_PASSES
#include "passes/plan_placement.h"
#endif

namespace modelpar::backend {

StepRunner::StepRunner(const ir::Graph& g, const Options& o) : graph_(g) {
  if (!planned(o)) {
    interpreter_ = std::make_unique<runtime::Interpreter>(graph_);
    runs_on_ = "the CPU interpreter";
    return;
  }
#ifdef MODELPAR_BACKEND_HAS_PASSES
  passes::PlacementOptions po;
  po.devices = o.devices;
  po.placer = o.placer.empty() ? "m-etf" : o.placer;
  if (o.memory) po.memory_bytes = {*o.memory};
  po.dump_dir = "";  // dumps are the torch.compile path's (MODELPAR_DUMP_DIR)
  const passes::PlacementPlan plan = passes::planPlacement(graph_, po);
  devices_ = plan.program.numDevices();
  simulated_us_ = plan.stepTimeUs();
  placement_summary_ = plan.summary();
  const std::string spec = o.device_map == "cpu" ? "cpu-workers" : o.device_map;
  runtime::DeviceMap map = runtime::DeviceMap::parse(spec, devices_, /*threads_per_device=*/1);
  executor_ = std::make_unique<runtime::Executor>(plan.program, map);
  runs_on_ = map.toString();
#else
  MP_RT_THROW(ConfigError, "modelpar: this build has no passes/, so the device cannot plan steps");
#endif
}

StepRunner::~StepRunner() = default;

std::vector<c10::IValue> StepRunner::run(std::vector<c10::IValue> inputs) const {
  return executor_ ? executor_->run(std::move(inputs)) : interpreter_->run(std::move(inputs));
}

}  // namespace modelpar::backend
