// A captured step on the interpreter or on a placed or pipelined plan's
// Executor (step_runner.h).
#include "backend/step_runner.h"

#include <algorithm>
#include <cmath>

#include "backend/device_options.h"
#include "ir/random_ops.h"
#include "runtime/check.h"
#include "runtime/executor.h"
#include "runtime/interpreter.h"

#ifdef MODELPAR_BACKEND_HAS_PASSES
#include "backend/symbolic_batch.h"
#include "passes/plan_pipeline.h"
#include "passes/plan_placement.h"
#endif

namespace modelpar::backend {
namespace {

/// The largest difference between a pipelined and an unpipelined output,
/// relative to the largest element of the unpipelined one (infinite for
/// another shape or dtype, or unequal integer tensors).
double relativeDifference(const at::Tensor& got, const at::Tensor& want) {
  if (!got.sizes().equals(want.sizes()) || got.scalar_type() != want.scalar_type()) return INFINITY;
  if (want.numel() == 0) return 0;
  if (!want.is_floating_point()) return got.equal(want) ? 0 : INFINITY;
  const double scale = std::max(1e-30, want.abs().max().item().toDouble());
  return got.sub(want).abs().max().item().toDouble() / scale;
}

}  // namespace

StepRunner::StepRunner(const ir::Graph& g, const Options& o) : graph_(g) {
  if (!planned(o)) {
    interpreter_ = std::make_unique<runtime::Interpreter>(graph_);
    runs_on_ = "the CPU interpreter";
    return;
  }
#ifdef MODELPAR_BACKEND_HAS_PASSES
  const std::string spec = o.device_map == "cpu" ? "cpu-workers" : o.device_map;
  if (o.pipeline) {
    planPipeline(o, spec);
    return;
  }
  passes::PlacementOptions po;
  po.devices = o.devices;
  po.placer = o.placer.empty() ? "m-etf" : o.placer;
  if (o.memory) po.memory_bytes = {*o.memory};
  po.dump_dir = "";  // dumps are the torch.compile path's (MODELPAR_DUMP_DIR)
  const passes::PlacementPlan plan = passes::planPlacement(graph_, po);
  devices_ = plan.program.numDevices();
  simulated_us_ = plan.stepTimeUs();
  placement_summary_ = plan.summary();
  runtime::DeviceMap map = runtime::DeviceMap::parse(spec, devices_, /*threads_per_device=*/1);
  executor_ = std::make_unique<runtime::Executor>(plan.program, map);
  runs_on_ = map.toString();
#else
  MP_RT_THROW(ConfigError, "modelpar: this build has no passes/, so the device cannot plan steps");
#endif
}

void StepRunner::planPipeline(const Options& o, const std::string& spec) {
#ifdef MODELPAR_BACKEND_HAS_PASSES
  const PipelineOptions& p = *o.pipeline;
  const SymbolicBatch sym = makeBatchSymbolic(graph_, p.batched_inputs);
  batch_size_ = sym.batch_size;
  passes::PipelinePlanOptions po;
  po.devices = o.devices;
  po.microbatches = p.microbatches;
  po.batch_size = sym.batch_size;
  po.schedule = p.schedule;
  po.virtual_stages = p.virtual_stages;
  po.partition = p.partition;
  po.checkpoint = p.checkpoint;
  po.portals = p.portals;
  if (o.memory) po.memory_bytes = {*o.memory};
  po.microbatch.batch_symbol = kBatchSymbol;
  po.microbatch.loss_reduction = passes::parseLossReduction(p.loss_reduction);
  po.microbatch.allow_random = p.allow_random;
  po.microbatch.batch_norm = passes::parseBatchNormMode(p.batch_norm);
  po.dump_dir = "";
  const passes::PipelinePlan plan = passes::planPipeline(sym.graph, po);
  devices_ = plan.program.numDevices();
  simulated_us_ = plan.stepTimeUs();
  std::string batched;
  for (const std::string& n : sym.batched_inputs) batched += c10::str(batched.empty() ? "%" : ", %", n);
  placement_summary_ = c10::str("batch ", sym.batch_size, " (inputs ", batched, "; dimension 0)\n", plan.summary());
  runtime::DeviceMap map = runtime::DeviceMap::parse(spec, devices_, /*threads_per_device=*/1);
  executor_ = std::make_unique<runtime::Executor>(plan.program, map);
  // Deferred batch norm normalises each micro-batch with its own statistics
  // (torchgpipe's semantics), and random ops (dropout, allowed by default as
  // under torch.compile: allow_random) draw per micro-batch: such a step is
  // meant to differ from the captured one, so it is not checked against it
  // (checked, a dropout pipeline was refused at its first step by an error
  // blaming a number computed from the batch size).
  bool differs_by_design = false;
  for (const ir::Node& n : graph_.nodes()) {
    differs_by_design = differs_by_design || n.op.find("batch_norm") != std::string::npos ||
                        ir::isRandomOp(n.op) || ir::isRandomOp(n.qualifiedName());
  }
  if (!differs_by_design) reference_ = std::make_unique<runtime::Interpreter>(graph_);
  runs_on_ = map.toString();
#else
  (void)o;
  (void)spec;
#endif
}

StepRunner::~StepRunner() = default;

std::vector<c10::IValue> StepRunner::run(std::vector<c10::IValue> inputs) const {
  if (!executor_) return interpreter_->run(std::move(inputs));
  if (batch_size_ == 0) return executor_->run(std::move(inputs));
  // A pipeline: the symbolic step also reads %B. Its first run is checked
  // against the step as captured (Note in symbolic_batch.h: a number
  // computed from the batch size would go unnoticed otherwise).
  std::vector<c10::IValue> with_size = inputs;
  with_size.emplace_back(batch_size_);
  std::vector<c10::IValue> got = executor_->run(std::move(with_size));
  if (checked_ || !reference_) return got;
  const std::vector<c10::IValue> want = reference_->run(std::move(inputs));
  for (size_t i = 0; i < want.size() && i < got.size(); ++i) {
    if (!want[i].isTensor() || !got[i].isTensor()) continue;
    const double diff = relativeDifference(got[i].toTensor(), want[i].toTensor());
    // Micro-batching reorders fp32 sums (about 1e-6 of the largest element);
    // a constant computed from the batch size is off by a factor of the
    // micro-batch count or more.
    MP_RT_CHECK(diff <= 1e-3, UnsupportedOpError, "modelpar pipeline: the micro-batched step ",
                "differs from the captured step at output ", i, " (%",
                graph_.value(graph_.outputs()[i]).name, ": ",
                ir::toString(graph_.value(graph_.outputs()[i]).type), ", largest difference ", diff,
                " of its largest element): the step computes a number from the batch size (such as "
                "a mean's backward dividing by the element count), which the device cannot split. "
                "Use a loss whose backward does not (cross_entropy, mse_loss and nll_loss do not), "
                "or leave pipeline unset");
  }
  checked_ = true;
  return got;
}

}  // namespace modelpar::backend
