// Running a step of the multi-device executor (executor.h); building one is
// in executor_setup.cpp.
#include <algorithm>

#include <ATen/core/Tensor.h>
#include <c10/util/Exception.h>

#include "ir/printer.h"
#include "runtime/check.h"
#include "runtime/executor_impl.h"
#include "runtime/spin_wait.h"
#include "runtime/value_types.h"

// Note [Executor stream protocol]
// ~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~
// Every logical device has a worker thread that issues its instruction list
// in program order, a compute stream that is current on that thread (runs
// call their operator right there), and one tx stream per peer it sends to
// (plus, when the peer sits on another GPU, an rx stream on the peer's GPU
// that the copy lands on). This is Baechi's tx/rx protocol (seed 000 §1.3.3)
// and torchgpipe's copy streams (seed 002 §3.2.3) driven by an explicit
// Program. `send %v -> R` on device S at instruction i and its `recv %v <- S`
// on device R:
//
//   S worker          S compute        S tx->R              R compute     R worker
//   run %v ---------> [op -> %v]
//   send %v -> R      ready.record --> ready.block
//     recordStream(%v, tx)             [copy %v -> %v']
//                                      done.record --.
//     post mail(S->R, %v) ---------------------------+-------------------> recv %v <- S
//   (goes on issuing)                                |                    (host waits for
//                                                    '-> done.block        the post only)
//                                                        recordStream(%v', R compute)
//                                                        [ops on %v']
//
// Host threads only wait for a send to be *issued* (the mailbox); device
// order is carried by the two events. On CPU workers the compute stream is
// the worker itself, so `ready` has always happened, and `done.block` on R's
// compute stream is where R's worker waits for the copy thread.
//
// Hazards the protocol closes (seed 000 §1.2.3):
//  - Read-after-write: the copy starts after `ready` (the producer is done),
//    R's ops start after `done`.
//  - Write-after-read: a run that writes one of its inputs (schema alias
//    info, e.g. relu_, _foreach_add_) first makes S's compute wait for every
//    transfer S issued before it, so an in-place op cannot change a tensor
//    (or a view of it) while it is still being copied.
//  - Dangling free (Note [Lifetime of sent tensors] below).
// Steps are fenced with the caller: the compute streams wait for the
// caller's current stream before reading inputs (acceptFromCaller), the
// caller's current streams wait for every stream of every device when the
// step ends (joinCaller: events, no host wait, so the host runs ahead of the
// GPU as eager PyTorch does; CPU workers finish their copies before they
// report done), and returned tensors are recorded on the caller's stream.
// The first GPU run measured the host wait this replaced: a compute-bound
// step took 12.4 ms against eager's 8.7 ms, with the GPU idle between the
// forward and the backward.
//
// Note [Lifetime of sent tensors]
// ~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~
// `free %v` may drop the sender's last reference while the copy is still
// queued. CUDA: recordStream(%v, tx) makes the caching allocator wait for the
// tx stream's work before reusing the block, and recordStream(%v', R compute)
// does the same for the copy, which was allocated on another stream. CPU: the
// copy closure holds a reference to %v until it has run. Freeing therefore
// never waits on the host.
//
// Note [Executor errors]
// ~~~~~~~~~~~~~~~~~~~~~~
// The first failure (an operator, a copy, a missing value, a run-time
// deadlock) is kept with its device and instruction, and sets the cancel
// flag: workers stop before their next instruction, waits for mail and for
// CPU events throw Cancelled, queued CPU copies are dropped. run() then waits
// for every worker, resets the devices (waits for their streams to drain) and
// throws the kept error; the executor is ready for the next step. A deadlock
// is detected when every device has finished or waits for mail nobody has
// posted, which only programs that skipped verification can reach.

namespace modelpar::runtime {
namespace {

using detail::Kind;

std::string messageOf(const std::exception_ptr& e) {
  try {
    std::rethrow_exception(e);
  } catch (const c10::Error& err) {
    return err.what_without_backtrace();
  } catch (const std::exception& err) {
    return err.what();
  } catch (...) {
    return "unknown exception";
  }
}

}  // namespace

void Executor::Impl::workerMain(int d) {
  Lane& lane = lanes_[static_cast<size_t>(d)];
  std::string error;
  try {
    lane.device->enterWorker();
  } catch (const std::exception&) {
    error = c10::str(lane.device->describe(), ": ", messageOf(std::current_exception()));
  }
  uint64_t seen = 0;
  {
    std::lock_guard<std::mutex> lock(ctl_mu_);
    if (!error.empty() && startup_error_.empty()) startup_error_ = error;
    ++started_;
  }
  done_cv_.notify_all();
  for (;;) {
    {
      std::unique_lock<std::mutex> lock(ctl_mu_);
      ctl_cv_.wait(lock, [&] { return shutdown_ || generation_ != seen; });
      if (shutdown_) return;
      seen = generation_;
    }
    runLane(d);
    {
      std::lock_guard<std::mutex> lock(ctl_mu_);
      --pending_;
    }
    done_cv_.notify_all();
  }
}

void Executor::Impl::runLane(int d) {
  Lane& lane = lanes_[static_cast<size_t>(d)];
  at::ThreadLocalStateGuard tls(*tls_);
  std::vector<Span>* spans = options_.record_trace ? &trace_.host[static_cast<size_t>(d)] : nullptr;
  size_t i = 0;
  bool bound = false;
  try {
    lane.copy_back.clear();
    if (lane.meter) lane.meter->reset();
    for (const auto& [k, v] : lane.inputs) {
      c10::IValue placed;
      try {
        placed = lane.device->place((*inputs_)[k]);
      } catch (const std::exception&) {
        MP_RT_THROW(ExecutionError, "cannot place input %", program_.graph().value(v).name, " on ",
                    lane.device->describe(), ": ", messageOf(std::current_exception()));
      }
      const c10::IValue& given = (*inputs_)[k];
      if (written_inputs_[k] && placed.isTensor() && given.isTensor() &&
          !placed.toTensor().is_same(given.toTensor())) {
        lane.copy_back.emplace_back(k, placed.toTensor());
      }
      setSlot(lane, v, std::move(placed));
    }
    if (lane.meter) lane.meter->mark(-1);
    bound = true;
    for (; i < lane.steps.size(); ++i) {
      if (cancelled_.load(std::memory_order_relaxed)) break;
      lane.at = i;
      if (capture_ != nullptr) capture_->before(d, i);
      if (spans == nullptr) {
        execute(d, i);
      } else {
        const int64_t start = now();
        execute(d, i);
        (*spans)[i] = Span{start, now()};
      }
      if (capture_ != nullptr) capture_->after(d, i);
      if (lane.meter) lane.meter->mark(static_cast<int64_t>(i));
    }
    if (capture_ != nullptr) capture_->abandon(d);  // a capture left open by a cancel
    if (!cancelled_.load()) {
      // Note [In-place writes reach the caller]: an input the program
      // writes in place (batch norm's running statistics under no_grad, a
      // static KV cache's index_copy_) that place() copied onto this device
      // (a CPU tensor on a GPU, another GPU's, the modelpar device's) was
      // written in the copy; the caller's tensor gets its new values here,
      // on the worker, after the step's ops on the compute stream (current
      // on the worker), so a GPU copy waits for them. Graph replay copies
      // its static buffers back the same way (executor_replay.cpp).
      for (auto& [k, placed] : lane.copy_back) {
        try {
          (*inputs_)[k].toTensor().copy_(placed);
        } catch (const std::exception&) {
          MP_RT_THROW(ExecutionError, "cannot write input %", program_.graph().value(
                          program_.graph().inputs()[k].value).name,
                      " back from ", lane.device->describe(), " after the step wrote it in place: ",
                      messageOf(std::current_exception()));
        }
      }
      lane.copy_back.clear();
      lane.device->finishStep();
    }
  } catch (const Cancelled&) {
    if (capture_ != nullptr) capture_->abandon(d);
  } catch (const std::exception&) {
    if (capture_ != nullptr) capture_->abandon(d);
    const bool in_step = bound && i < lane.steps.size();
    fail(Failure{c10::str(in_step ? where(d, i) : c10::str("device ", d), ": ",
                          messageOf(std::current_exception())),
                 d, i});
  }
  std::optional<std::string> deadlock;
  {
    std::lock_guard<std::mutex> lock(mail_mu_);
    lane.finished = true;
    deadlock = deadlockLocked();
  }
  if (deadlock) fail(Failure{*deadlock});
}

void Executor::Impl::execute(int d, size_t i) {
  Lane& lane = lanes_[static_cast<size_t>(d)];
  const Step& s = lane.steps[i];
  switch (s.kind) {
    case Kind::Run: {
      for (int32_t m : s.fence) {
        if (capture_ != nullptr && !capture_->fenceApplies(d, m)) continue;
        mail_[static_cast<size_t>(m)].done->block(lane.device->compute());
      }
      // Note [Reproducible random ops over workers]; not inside a CUDA graph
      // capture, where a generator must not be reseeded (its replays keep
      // the generator's own order).
      std::unique_lock<std::mutex> seeded;
      if (s.seeded && capture_ == nullptr) {
        seeded = seeding_->seed(s.node, lane.place_on.value_or(c10::Device(c10::kCPU)));
      }
      std::vector<c10::IValue> out = s.op->call(lane.env, lane.place_on ? &*lane.place_on : nullptr);
      if (seeded.owns_lock()) seeded.unlock();
      for (size_t k = 0; k < out.size(); ++k) setSlot(lane, (*s.defs)[k], std::move(out[k]));
      return;
    }
    case Kind::Send:
      send(d, i, s);
      return;
    case Kind::Recv:
      recv(d, s);
      return;
    case Kind::Free: {
      const c10::IValue& v = lane.env[static_cast<size_t>(s.value)];
      MP_RT_CHECK(!v.isNone(), ExecutionError, "%", program_.graph().value(s.value).name,
                  " is not on device ", d);
      setSlot(lane, s.value, c10::IValue());
      return;
    }
  }
}

void Executor::Impl::send(int d, size_t i, const Step& s) {
  Lane& lane = lanes_[static_cast<size_t>(d)];
  Device& src = *lane.device;
  Device& dst = *lanes_[static_cast<size_t>(s.peer)].device;
  Mail& m = mail_[static_cast<size_t>(s.mail)];
  const c10::IValue& v = lane.env[static_cast<size_t>(s.value)];
  MP_RT_CHECK(!v.isNone(), ExecutionError, "%", program_.graph().value(s.value).name,
              " is not on device ", d);
  Stream& tx = src.tx(s.peer);
  m.ready->record(src.compute());
  m.ready->block(tx);
  src.recordStream(v, tx);
  Span* span = options_.record_trace ? &trace_.transfer[static_cast<size_t>(d)][i] : nullptr;
  const int64_t bytes = v.isTensor() && v.toTensor().defined()
                            ? static_cast<int64_t>(v.toTensor().nbytes()) : 0;
  src.enqueueCopy(tx, [this, &m, &src, &dst, v, d, i, span] {
    try {
      at::ThreadLocalStateGuard tls(*tls_);
      const int64_t start = span != nullptr ? now() : 0;
      m.value = src.copyTo(v, dst);
      if (span != nullptr) *span = Span{start, now()};
    } catch (const Cancelled&) {
    } catch (const std::exception&) {
      fail(Failure{c10::str(where(d, i), ": copy failed: ", messageOf(std::current_exception())),
                   d, i});
    }
  }, bytes);
  m.done->record(tx);
  if (capture_ != nullptr) capture_->sent(d, s.peer, s.mail, v);
  {
    std::lock_guard<std::mutex> lock(mail_mu_);
    m.posted = true;
  }
  lanes_[static_cast<size_t>(s.peer)].mail_cv.notify_all();
}

void Executor::Impl::recv(int d, const Step& s) {
  Lane& lane = lanes_[static_cast<size_t>(d)];
  Mail& m = mail_[static_cast<size_t>(s.mail)];
  std::optional<std::string> deadlock;
  // Note [Spinning before sleeping]
  spinUntil([&] { return m.posted.load() || cancelled_.load(); });
  {
    std::unique_lock<std::mutex> lock(mail_mu_);
    if (!m.posted) {
      lane.waiting_for = s.mail;
      deadlock = deadlockLocked();
      if (!deadlock) lane.mail_cv.wait(lock, [&] { return m.posted || cancelled_.load(); });
      lane.waiting_for = -1;
    }
  }
  if (deadlock) fail(Failure{*deadlock});
  if (!m.posted || cancelled_.load()) throw Cancelled();
  Device& dev = *lane.device;
  if (capture_ != nullptr) {
    capture_->received(d, s.mail, m.value);
  } else {
    m.done->block(dev.compute());
  }
  // A copy that failed has cancelled the step before its `done` was reached.
  if (cancelled_.load()) throw Cancelled();
  dev.recordStream(m.value, dev.compute());
  setSlot(lane, s.value, std::move(m.value));
}

std::optional<std::string> Executor::Impl::deadlockLocked() const {
  bool any_waiting = false;
  for (const Lane& lane : lanes_) {
    if (lane.finished) continue;
    if (lane.waiting_for < 0 || mail_[static_cast<size_t>(lane.waiting_for)].posted) return std::nullopt;
    any_waiting = true;
  }
  if (!any_waiting) return std::nullopt;
  std::string waits;
  for (size_t d = 0; d < lanes_.size(); ++d) {
    const Lane& lane = lanes_[d];
    if (lane.finished) continue;
    waits += c10::str(waits.empty() ? "" : "; ", "device ", d, " waits at instruction ", lane.at,
                      " (", ir::printInstruction(program_.graph(), program_.schedule(static_cast<int>(d))[lane.at]),
                      ")");
  }
  return c10::str("deadlock at run time: ", waits,
                  "; no device can issue the sends these wait for");
}

void Executor::Impl::fail(Failure f) {
  {
    std::lock_guard<std::mutex> lock(fail_mu_);
    if (failure_) return;
    failure_ = std::move(f);
  }
  cancelled_.store(true);
  for (Lane& lane : lanes_) lane.device->cancel();
  if (capture_ != nullptr) capture_->cancel();
  {
    std::lock_guard<std::mutex> lock(mail_mu_);  // no lost wake-up: waiters test the flag under it
  }
  for (Lane& lane : lanes_) lane.mail_cv.notify_all();
}

// Drops every value the step left behind, so that memory is released now,
// not at the next step.
void Executor::Impl::clearStep() {
  for (Lane& lane : lanes_) {
    std::fill(lane.env.begin(), lane.env.end(), c10::IValue());
    lane.copy_back.clear();
    lane.finished = false;
    lane.waiting_for = -1;
  }
  for (Mail& m : mail_) {
    m.value = c10::IValue();
    m.posted = false;
  }
  inputs_ = nullptr;
  tls_.reset();
}

std::vector<c10::IValue> Executor::Impl::run(std::vector<c10::IValue> inputs) {
  std::lock_guard<std::mutex> step(run_mu_);
  if (options_.replay == Replay::Graphs) return runGraphs(inputs);
  ++replay_status_.steps;
  return runStep(inputs);
}

std::vector<c10::IValue> Executor::Impl::runStep(std::vector<c10::IValue>& inputs) {
  const ir::Graph& g = program_.graph();
  checkGraphInputs(g, inputs);
  if (options_.record_trace) {
    for (size_t d = 0; d < lanes_.size(); ++d) {
      const size_t k = lanes_[d].steps.size();
      trace_.host[d].assign(k, Span{});
      trace_.transfer[d].assign(k, Span{});
    }
  }
  // Whatever happens below, the step's values and mail go when run() returns.
  struct ClearAtExit {
    Impl* self;
    ~ClearAtExit() { self->clearStep(); }
  } clear_at_exit{this};
  inputs_ = &inputs;
  tls_.emplace();
  // Note [Reproducible random ops over workers]: the generators as the step
  // seed's draw left them, whatever happens below.
  struct EndSeeding {
    std::optional<RandomSeeding>& seeding;
    ~EndSeeding() {
      if (seeding) seeding->endStep();
    }
  } end_seeding{seeding_};
  if (seeding_ && capture_ == nullptr) seeding_->beginStep(seeded_devices_);
  t0_ = Clock::now();
  for (Lane& lane : lanes_) lane.device->acceptFromCaller();
  {
    std::unique_lock<std::mutex> lock(ctl_mu_);
    pending_ = static_cast<int>(lanes_.size());
    ++generation_;
    ctl_cv_.notify_all();
    done_cv_.wait(lock, [&] { return pending_ == 0; });
  }
  trace_.step_ns = now();

  bool failed = false;
  {
    std::lock_guard<std::mutex> lock(fail_mu_);
    failed = failure_.has_value();
  }
  if (failed) {
    for (Lane& lane : lanes_) {
      try {
        lane.device->reset();
      } catch (const std::exception&) {  // the step has failed already; report that
      }
    }
    Failure f = std::move(*failure_);
    failure_.reset();
    cancelled_.store(false);
    if (f.device < 0) throw ExecutionError(std::move(f.message));
    throw InstructionError(std::move(f.message), f.device, f.instruction);
  }

  if (options_.measure_memory) {  // Note [Measured memory]
    memory_report_.devices.clear();
    for (const Lane& lane : lanes_) memory_report_.devices.push_back(lane.meter->result());
    ++memory_report_.steps;
  }

  // The caller's streams wait for the step on the GPU; the host goes on
  // (Note [Executor stream protocol], "Steps are fenced with the caller").
  for (Lane& lane : lanes_) lane.device->joinCaller();
  std::vector<c10::IValue> out;
  out.reserve(g.outputs().size());
  for (ir::ValueId v : g.outputs()) {
    const Lane* holder = nullptr;
    for (const Lane& lane : lanes_) {
      if (!lane.env[static_cast<size_t>(v)].isNone()) {
        holder = &lane;
        break;
      }
    }
    if (holder == nullptr) {
      MP_RT_THROW(ExecutionError, "graph output %", g.value(v).name,
                  " is on no device when the program ends (freed, or never computed)");
    }
    out.push_back(holder->env[static_cast<size_t>(v)]);
    holder->device->handToCaller(out.back());
  }
  return out;
}

std::vector<c10::IValue> Executor::run(std::vector<c10::IValue> inputs) {
  return impl_->run(std::move(inputs));
}

MemoryReport Executor::Impl::memoryReport() {
  std::lock_guard<std::mutex> lock(run_mu_);
  MP_RT_CHECK(options_.measure_memory, ConfigError,
              "modelpar executor: memoryReport() needs ExecutorOptions::measure_memory "
              "(Python: measure_memory=True)");
  return memory_report_;
}

MemoryReport Executor::memoryReport() const { return impl_->memoryReport(); }

}  // namespace modelpar::runtime
