// Replay::Graphs in the Executor (executor.h): warm-up, the capture step,
// static input buffers, replays, and the fall-back to stream replay. The CUDA
// side (capturing and launching graphs) is cuda_graph_replay.cpp; on CPU
// workers the same protocol runs on the stream path, which is what CI tests.
#include <string>
#include <unordered_map>

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
// Parameters and buffers are the exception: Note [Parameters at their own
// addresses].
//
// CPU worker devices cannot capture: they run the same protocol from the
// capture step on (static buffers, copy in, copy back, clone out) on the
// stream path, so a stale static buffer or a missed copy-back shows in CI.
// A CUDA program that cannot be captured runs plain stream replay (no static
// buffers: they would only cost copies).

// Note [Parameters at their own addresses]
// ~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~
// A static copy of every input would double the parameters' memory per
// capture (a compiled model with one capture per signature holds several)
// and copy every weight each step. Parameters and buffers (InputRole) stay
// where they live between steps, so the capture reads them there: an input
// whose role is param or buffer, already on its logical device's physical
// device, and sharing storage with no other input (two inputs that alias
// would be captured as one address, and a later step could pass them apart)
// is its own static buffer. Nothing is copied in or back for it: the step's
// in-place writes (an optimizer update in the graph, batch norm's running
// statistics) land in the caller's tensor, as on the stream path, and the
// caller's own updates between steps are what the next replay reads.
//
// A replay checks each such input's address, strides and storage offset
// against the capture's. If the caller passes another tensor there (`p.data
// = ...`, a state dict loaded by assignment), the graphs would read the old
// one, a silent wrong answer; so the capture is dropped, that input is marked
// as moved (it gets a static copy from then on, so a parameter that moves
// every step costs one re-capture, not one per step), and this step captures
// anew: ReplayStatus counts recaptures and names the last input that moved.
// CPU worker devices run the same bookkeeping on the stream path (the twin
// CI tests); on CUDA this is what torch's CUDA graph trees do with static
// inputs (re-record when a static input's address changes).

namespace modelpar::runtime {
namespace {

std::string messageOf(const std::exception& e) {
  if (const auto* c = dynamic_cast<const c10::Error*>(&e)) return c->what_without_backtrace();
  return e.what();
}

std::string sizesOf(const at::Tensor& t) { return c10::str(t.sizes()); }

bool definedTensor(const c10::IValue& v) { return v.isTensor() && v.toTensor().defined(); }

// ", 4 parameters/buffers at their own addresses; re-captured once (input %w
// (param) moved ...)" or "".
std::string ownAddressesText(const ReplayStatus& st) {
  std::string s;
  if (st.own_address_inputs > 0) {
    s = c10::str(", ", st.own_address_inputs, " parameters/buffers at their own addresses");
  }
  if (st.recaptures > 0) {
    s += c10::str("; re-captured ", st.recaptures, st.recaptures == 1 ? " time" : " times", " (",
                  st.last_recapture, ")");
  }
  return s;
}

}  // namespace

void Executor::Impl::makeStaticBuffers(const std::vector<c10::IValue>& inputs) {
  const ir::Graph& g = program_.graph();
  // Storages more than one input views (Note [Parameters at their own addresses]).
  std::unordered_map<const void*, int> views;
  for (const c10::IValue& v : inputs) {
    if (definedTensor(v) && v.toTensor().has_storage()) {
      ++views[v.toTensor().storage().unsafeGetStorageImpl()];
    }
  }
  graph_.buffers.assign(inputs.size(), c10::IValue());
  graph_.own_address.assign(inputs.size(), false);
  graph_.moved.resize(inputs.size(), false);
  size_t own = 0;
  for (size_t k = 0; k < inputs.size(); ++k) {
    const c10::IValue& v = inputs[k];
    if (!definedTensor(v)) {
      graph_.buffers[k] = v;
      continue;
    }
    const at::Tensor& t = v.toTensor();
    const ir::Input& in = g.inputs()[k];
    const c10::Device where = lanes_[static_cast<size_t>(in.device.value_or(0))].device->physical();
    const bool stays = in.role != ir::InputRole::Input && !graph_.moved[k] && t.device() == where &&
                       t.has_storage() && views[t.storage().unsafeGetStorageImpl()] == 1;
    graph_.own_address[k] = stays;
    own += stays;
    graph_.buffers[k] = stays ? t : at::empty_like(t, t.options().device(where));
  }
  replay_status_.own_address_inputs = own;
  graph_.written = inputsWrittenInPlace(program_);
  graph_.has_buffers = true;
}

int Executor::Impl::movedOwnAddressInput(const std::vector<c10::IValue>& inputs) const {
  for (size_t k = 0; k < inputs.size(); ++k) {
    if (!graph_.own_address[k]) continue;
    const at::Tensor& now = inputs[k].toTensor();
    const at::Tensor& then = graph_.buffers[k].toTensor();
    if (!now.has_storage() || now.data_ptr() != then.data_ptr() || now.strides() != then.strides()) {
      return static_cast<int>(k);
    }
  }
  return -1;
}

void Executor::Impl::dropCapture() {
  graph_.buffers.clear();
  graph_.own_address.clear();
  graph_.has_buffers = false;
  graph_.outputs.clear();
  graph_.graphs.reset();
  replay_status_.captured = false;
  replay_status_.graphs = 0;
  replay_status_.own_address_inputs = 0;
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
    if (const int k = movedOwnAddressInput(inputs); k >= 0) {
      // Note [Parameters at their own addresses]: capture again, this step.
      graph_.moved[static_cast<size_t>(k)] = true;
      ++st.recaptures;
      st.last_recapture = c10::str("input %", g.value(g.inputs()[static_cast<size_t>(k)].value).name,
                                   " (", name(g.inputs()[static_cast<size_t>(k)].role),
                                   ") moved to another address after the capture");
      dropCapture();
      makeStaticBuffers(inputs);
    }
  }
  ++st.steps;
  if (!graph_.has_buffers) {  // a CUDA program that is not captured: plain streams
    updateSummary();
    return runStep(inputs);
  }
  for (size_t k = 0; k < inputs.size(); ++k) {
    if (definedTensor(graph_.buffers[k]) && !graph_.own_address[k]) {
      graph_.buffers[k].toTensor().copy_(inputs[k].toTensor());
    }
  }
  std::vector<c10::IValue> out;
  if (!cpu && !graph_.graphs) {  // the capture step of a capturable CUDA program
    if (!tryCapture()) {
      dropCapture();
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
    if (definedTensor(inputs[k]) && !graph_.own_address[k]) {
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
                          " logical devices, static input buffers", ownAddressesText(st));
  } else if (!st.static_buffers && (map_.kind() == DeviceKind::CpuWorker
                                        ? st.steps <= options_.warmup_steps
                                        : st.issues.empty())) {
    st.summary = c10::str("graph replay: warming up (", st.steps, " of ", options_.warmup_steps,
                          " stream steps), then capture");
  } else {
    st.summary = c10::str("graph replay: not captured: ", describe(st.issues),
                          st.static_buffers ? "; static input buffers on the stream path"
                                            : "; stream replay",
                          st.static_buffers ? ownAddressesText(st) : std::string());
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
