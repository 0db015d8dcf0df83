// Replay::Graphs in the Executor (executor.h): warm-up, the capture step,
// static input buffers, replays, and the fall-back to stream replay. The CUDA
// side (capturing and launching graphs) is cuda_graph_replay.cpp; on CPU
// workers the same protocol runs on the stream path, which is what CI tests.
#include <ATen/core/Tensor.h>
#include <ATen/ops/empty_like.h>
#include <c10/util/Exception.h>

#include "runtime/check.h"
#include "runtime/executor_impl.h"
#include "runtime/graph_segments.h"
#include "runtime/value_types.h"

// Note [Graph replay]
// ~~~~~~~~~~~~~~~~~~~
// With Replay::Graphs a run() is one of:
//
//   step 1..W      warm-up: the stream path, unchanged (W = warmup_steps >= 1;
//                  lazy set-up such as cuBLAS handles and workspaces happens
//                  here, on the threads and streams the capture will use)
//   step W+1       capture: the inputs are copied into static buffers made
//                  now (one per graph input, on its logical device); if
//                  captureIssues() is empty the workers capture the program
//                  (nothing executes) and the graphs are replayed once for
//                  this step's results; otherwise, or if the capture throws,
//                  the step runs on the stream path and replayStatus() says why
//   step W+2..     replay: inputs are checked against the capture step's
//                  (shape, dtype, device; value for non-tensors; a mismatch is
//                  an ExecutionError naming the input: graphs bake in sizes,
//                  and re-capturing silently would hide a recompile per shape)
//                  and copied into the static buffers; the graphs are launched
//                  in segment order; outputs are cloned from the static
//                  outputs (unless outputs_may_alias); inputs the step writes
//                  in place (inputsWrittenInPlace) are copied back to the
//                  caller's tensors, since the step wrote the static copies.
//
// CPU worker devices cannot capture: they run the same protocol from the
// capture step on (static buffers, copy in, copy back, clone out) on the
// stream path, so a stale static buffer or a missed copy-back shows in CI.
// A CUDA program that cannot be captured runs plain stream replay (no static
// buffers: they would only cost copies).

namespace modelpar::runtime {
namespace {

std::string messageOf(const std::exception& e) {
  if (const auto* c = dynamic_cast<const c10::Error*>(&e)) return c->what_without_backtrace();
  return e.what();
}

std::string sizesOf(const at::Tensor& t) { return c10::str(t.sizes()); }

}  // namespace

void Executor::Impl::makeStaticBuffers(const std::vector<c10::IValue>& inputs) {
  const ir::Graph& g = program_.graph();
  graph_.buffers.assign(inputs.size(), c10::IValue());
  for (size_t k = 0; k < inputs.size(); ++k) {
    const c10::IValue& v = inputs[k];
    if (!v.isTensor() || !v.toTensor().defined()) {
      graph_.buffers[k] = v;
      continue;
    }
    const at::Tensor& t = v.toTensor();
    const int d = g.inputs()[k].device.value_or(0);
    const c10::Device where = lanes_[static_cast<size_t>(d)].device->physical();
    graph_.buffers[k] = at::empty_like(t, t.options().device(where));
  }
  graph_.written = inputsWrittenInPlace(program_);
  graph_.has_buffers = true;
}

void Executor::Impl::checkSignature(const std::vector<c10::IValue>& inputs) const {
  const ir::Graph& g = program_.graph();
  for (size_t k = 0; k < inputs.size(); ++k) {
    const c10::IValue& now = inputs[k];
    const c10::IValue& then = graph_.buffers[k];
    const std::string& name = g.value(g.inputs()[k].value).name;
    const bool tensor = then.isTensor() && then.toTensor().defined();
    if (!tensor) {
      MP_RT_CHECK(now.isTensor() == then.isTensor() && (now.isTensor() || now == then), ExecutionError,
                  "modelpar executor (graph replay): input %", name, " is ", describe(now),
                  " but was ", describe(then),
                  " at capture; a captured step bakes non-tensor inputs in; pass the same value "
                  "or use stream replay");
      continue;
    }
    MP_RT_CHECK(now.isTensor() && now.toTensor().defined(), ExecutionError,
                "modelpar executor (graph replay): input %", name, " is ", describe(now),
                " but was a tensor at capture");
    const at::Tensor& a = now.toTensor();
    const at::Tensor& b = then.toTensor();
    MP_RT_CHECK(a.sizes() == b.sizes() && a.scalar_type() == b.scalar_type(), ExecutionError,
                "modelpar executor (graph replay): input %", name, " is ", a.scalar_type(),
                sizesOf(a), " but was ", b.scalar_type(), sizesOf(b),
                " at capture; a captured step replays fixed shapes and dtypes; pass inputs like "
                "the capture step's or use stream replay (a new Executor captures anew)");
    MP_RT_CHECK(a.device() == graph_.devices[k], ExecutionError,
                "modelpar executor (graph replay): input %", name, " is on ", a.device().str(),
                " but was on ", graph_.devices[k].str(), " at capture");
  }
}

bool Executor::Impl::tryCapture() {
  std::unique_ptr<detail::GraphCapture> graphs = detail::createCudaGraphCapture(program_, lanes_, mail_);
  if (!graphs) {
    graph_.failure = "this build has no CUDA graph support";
    return false;
  }
  capture_ = graphs.get();
  try {
    graph_.outputs = runStep(graph_.buffers);
    capture_->finish();
  } catch (const std::exception& e) {
    capture_ = nullptr;
    graph_.outputs.clear();
    graph_.failure = "the capture failed: " + messageOf(e);
    return false;
  }
  capture_ = nullptr;
  graph_.graphs = std::move(graphs);
  return true;
}

std::vector<c10::IValue> Executor::Impl::runGraphs(std::vector<c10::IValue>& inputs) {
  const ir::Graph& g = program_.graph();
  checkGraphInputs(g, inputs);
  ReplayStatus& st = replay_status_;
  if (st.steps < options_.warmup_steps) {
    ++st.steps;
    updateSummary();
    return runStep(inputs);
  }
  const bool cpu = map_.kind() == DeviceKind::CpuWorker;
  if (!graph_.has_buffers && !st.captured && (cpu || st.issues.empty())) {
    graph_.devices.clear();
    for (const c10::IValue& v : inputs) {
      graph_.devices.push_back(v.isTensor() && v.toTensor().defined() ? v.toTensor().device()
                                                                        : c10::Device(c10::kCPU));
    }
    makeStaticBuffers(inputs);
  } else if (graph_.has_buffers) {
    checkSignature(inputs);
  }
  ++st.steps;
  if (!graph_.has_buffers) {  // a CUDA program that is not captured: plain streams
    updateSummary();
    return runStep(inputs);
  }
  for (size_t k = 0; k < inputs.size(); ++k) {
    if (graph_.buffers[k].isTensor() && graph_.buffers[k].toTensor().defined()) {
      graph_.buffers[k].toTensor().copy_(inputs[k].toTensor());
    }
  }
  std::vector<c10::IValue> out;
  if (!cpu && !graph_.graphs) {  // the capture step of a capturable CUDA program
    if (!tryCapture()) {
      graph_.buffers.clear();
      graph_.has_buffers = false;
      st.issues.push_back(CaptureIssue{-1, -1, graph_.failure});
      updateSummary();
      return runStep(inputs);
    }
  }
  if (graph_.graphs) {
    graph_.graphs->replay();
    out = graph_.outputs;
  } else {
    out = runStep(graph_.buffers);
  }
  for (size_t k : graph_.written) {
    if (inputs[k].isTensor() && inputs[k].toTensor().defined()) {
      inputs[k].toTensor().copy_(graph_.buffers[k].toTensor());
    }
  }
  if (!options_.outputs_may_alias) {
    for (c10::IValue& v : out) {
      if (v.isTensor() && v.toTensor().defined()) v = v.toTensor().clone();
    }
  }
  updateSummary();
  return out;
}

void Executor::Impl::updateSummary() {
  ReplayStatus& st = replay_status_;
  st.captured = graph_.graphs != nullptr;
  st.static_buffers = graph_.has_buffers;
  st.graphs = st.captured ? graph_.graphs->numGraphs() : 0;
  if (st.requested == Replay::Streams) {
    st.summary = "stream replay";
  } else if (st.captured) {
    st.summary = c10::str("graph replay: ", st.graphs, " CUDA graphs on ", lanes_.size(),
                          " logical devices, static input buffers");
  } else if (!st.static_buffers && (map_.kind() == DeviceKind::CpuWorker
                                        ? st.steps <= options_.warmup_steps
                                        : st.issues.empty())) {
    st.summary = c10::str("graph replay: warming up (", st.steps, " of ", options_.warmup_steps,
                          " stream steps), then capture");
  } else {
    st.summary = c10::str("graph replay: not captured: ", describe(st.issues),
                          st.static_buffers ? "; static input buffers on the stream path"
                                            : "; stream replay");
  }
}

void Executor::Impl::initReplay() {
  MP_RT_CHECK(options_.warmup_steps >= 1, ConfigError,
              "modelpar executor: warmup_steps must be >= 1 for graph replay (lazy set-up must "
              "not happen inside a capture), got ", options_.warmup_steps);
  replay_status_.requested = options_.replay;
  if (options_.replay == Replay::Graphs) {
    replay_status_.issues = captureIssues(program_, map_);
    if (replay_status_.issues.empty()) (void)graphSegments(program_);  // cycles fail here
  }
  updateSummary();
}

ReplayStatus Executor::Impl::replayStatus() {
  std::lock_guard<std::mutex> lock(run_mu_);
  return replay_status_;
}

ReplayStatus Executor::replayStatus() const { return impl_->replayStatus(); }

#ifndef MODELPAR_WITH_CUDA
std::unique_ptr<detail::GraphCapture> detail::createCudaGraphCapture(const ir::Program&,
                                                                     std::vector<Lane>&,
                                                                     std::deque<Mail>&) {
  return nullptr;
}
#endif

}  // namespace modelpar::runtime
