// Internals of the Executor, shared by executor_setup.cpp (turning a Program
// into per-device steps, starting the workers) and executor.cpp (running a
// step). Not part of the runtime's API: include runtime/executor.h.
#pragma once

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <deque>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include <ATen/ThreadLocalState.h>

#include "runtime/device.h"
#include "runtime/executor.h"
#include "runtime/memory_meter.h"
#include "runtime/op_call.h"
#include "runtime/random_seeding.h"

namespace modelpar::runtime::detail {

using Clock = std::chrono::steady_clock;
using Kind = ir::Instruction::Kind;

/// One instruction, resolved at construction.
struct Step {
  Kind kind = Kind::Run;
  const ResolvedOp* op = nullptr;                  // run
  const std::vector<ir::ValueId>* defs = nullptr;  // run: the node's outputs
  ir::ValueId value = ir::kNoId;                   // send, recv, free
  int peer = -1;
  int32_t mail = -1;            // send, recv: the mailbox slot
  std::vector<int32_t> fence;   // run that writes an input: sends to finish first
  ir::NodeId node = ir::kNoId;  // run
  bool seeded = false;          // run of a random op seeded per op (random_seeding.h)
};

/// One send -> recv pair (a Program sends each (value, from, to) once).
struct Mail {
  std::unique_ptr<Event> ready;  // sender's compute, after the producer
  std::unique_ptr<Event> done;   // sender's tx stream, after the copy
  c10::IValue value;             // the receiver's copy; read only after `done`
  std::atomic<bool> posted{false};  // written under Impl::mail_mu_; polled by spinUntil
};

/// One logical device.
struct Lane {
  std::unique_ptr<Device> device;
  /// Where factory ops make their tensors: the device's GPU, or none on CPU
  /// workers (Note [Factory ops follow their device] in op_call.cpp).
  std::optional<c10::Device> place_on;
  std::vector<Step> steps;
  std::vector<std::pair<size_t, ir::ValueId>> inputs;  // graph input index, value
  /// This step's inputs that the program writes in place and that place()
  /// copied onto the device: written back to the caller's tensor after the
  /// step (Note [In-place writes reach the caller] in executor.cpp).
  std::vector<std::pair<size_t, at::Tensor>> copy_back;
  Env env;
  std::condition_variable mail_cv;  // a slot for this lane was posted, or cancel
  int32_t waiting_for = -1;         // mail awaited in a recv (guarded by mail_mu_)
  bool finished = false;            // guarded by mail_mu_
  size_t at = 0;                    // current instruction (for deadlock reports)
  /// ExecutorOptions::measure_memory only (Note [Measured memory]).
  std::unique_ptr<StorageMeter> meter;
  std::thread thread;
};

struct Failure {
  std::string message;
  int device = -1;  // -1: not one instruction's fault (deadlock)
  size_t instruction = 0;
};

/// A capture of the program into CUDA graphs (cuda_graph_replay.cpp), driven
/// by the workers during the capture step: the executor calls the hooks below
/// where the stream protocol differs inside a capture (Note [Graph replay]).
class GraphCapture {
 public:
  virtual ~GraphCapture() = default;
  /// Worker `d`, around its instruction `i`: a segment starting at `i` waits
  /// for its turn in the launch order and begins a capture; one ending at `i`
  /// joins the tx streams it used back and ends it. Throw Cancelled / errors.
  virtual void before(int d, size_t i) = 0;
  virtual void after(int d, size_t i) = 0;
  /// Worker `d` issued the copy of send `mail` on its tx stream to `peer`.
  virtual void sent(int d, int peer, int32_t mail, const c10::IValue& v) = 0;
  /// Whether a fence on `mail` applies inside the segment `d` is capturing
  /// (a send of an earlier segment was joined at that segment's end).
  virtual bool fenceApplies(int d, int32_t mail) = 0;
  /// Worker `d` receives `mail` (`v` is the copy): its compute stream waits on
  /// the sender's external event instead of Mail::done.
  virtual void received(int d, int32_t mail, const c10::IValue& v) = 0;
  /// Worker `d`, whatever happened: ends a capture it left open.
  virtual void abandon(int d) noexcept = 0;
  /// Any thread: wakes workers waiting for their turn (they throw Cancelled).
  virtual void cancel() = 0;
  /// Caller, after a capture step without error: checks every segment was
  /// captured and drops what the capture kept alive.
  virtual void finish() = 0;
  /// Caller: one step: the compute streams wait for the caller's stream, every
  /// graph is launched in order on its device's compute stream, and the
  /// caller's stream waits for all of them.
  virtual void replay() = 0;
  virtual size_t numGraphs() const = 0;
};

/// Static input buffers, signature and state of Replay::Graphs.
struct GraphReplayState {
  std::vector<c10::IValue> buffers;  // per graph input: its static copy (or the scalar)
  /// Per graph input: the buffer is the caller's own tensor (a parameter or
  /// buffer already where it lives; Note [Parameters at their own addresses]).
  std::vector<bool> own_address;
  /// Per graph input: it moved after a capture, so it gets a static copy from
  /// then on (at most one re-capture per input).
  std::vector<bool> moved;
  std::vector<c10::Device> devices;  // per graph input: where the caller's was at capture
  bool has_buffers = false;
  std::vector<size_t> written;       // inputs the step writes in place: copied back
  std::vector<c10::IValue> outputs;  // captured: the static outputs
  std::unique_ptr<GraphCapture> graphs;
  std::string failure;               // a capture that failed at run time
};

/// Builds the capture of `lanes` (CUDA devices) for one capture step.
/// Defined in cuda_graph_replay.cpp; null in builds without CUDA.
std::unique_ptr<GraphCapture> createCudaGraphCapture(const ir::Program& p, std::vector<Lane>& lanes,
                                                     std::deque<Mail>& mail);

}  // namespace modelpar::runtime::detail

namespace modelpar::runtime {

class Executor::Impl {
  using Clock = detail::Clock;
  using Step = detail::Step;
  using Mail = detail::Mail;
  using Lane = detail::Lane;
  using Failure = detail::Failure;

 public:
  Impl(const ir::Program& p, const DeviceMap& map, ExecutorOptions options);
  ~Impl();
  std::vector<c10::IValue> run(std::vector<c10::IValue> inputs);

  ir::Program program_;
  DeviceMap map_;
  ExecutionTrace trace_;
  ReplayStatus replay_status_;  // guarded by run_mu_
  MemoryReport memory_report_;  // guarded by run_mu_

 private:
  void resolve();
  // resolve()'s steps (executor_setup.cpp).
  std::vector<bool> resolveOps();
  int32_t newMailSlot(int owner);
  void seedRandomSteps();
  void workerMain(int d);
  void runLane(int d);
  void execute(int d, size_t i);
  void send(int d, size_t i, const Step& s);
  void recv(int d, const Step& s);
  void fail(Failure f);
  std::optional<std::string> deadlockLocked() const;
  std::string where(int d, size_t i) const;
  int64_t now() const {
    return std::chrono::duration_cast<std::chrono::nanoseconds>(Clock::now() - t0_).count();
  }
  void clearStep();
  /// env[v] = x, through the lane's meter when measuring.
  static void setSlot(Lane& lane, ir::ValueId v, c10::IValue x) {
    c10::IValue& slot = lane.env[static_cast<size_t>(v)];
    if (lane.meter) {
      lane.meter->remove(slot);
      lane.meter->add(x);
    }
    slot = std::move(x);
  }
  void stopWorkers();
  std::vector<c10::IValue> runStep(std::vector<c10::IValue>& inputs);
  // Replay::Graphs (executor_replay.cpp).
  std::vector<c10::IValue> runGraphs(std::vector<c10::IValue>& inputs);
  void makeStaticBuffers(const std::vector<c10::IValue>& inputs);
  void checkSignature(const std::vector<c10::IValue>& inputs) const;
  /// A parameter captured at its own address that the caller now passes at
  /// another (-1: none); its name goes to ReplayStatus::last_recapture.
  int movedOwnAddressInput(const std::vector<c10::IValue>& inputs) const;
  void dropCapture();
  bool tryCapture();
  void updateSummary();
  void initReplay();

 public:
  ReplayStatus replayStatus();
  MemoryReport memoryReport();

 private:

  ExecutorOptions options_;
  std::vector<ResolvedOp> ops_;  // by NodeId
  std::vector<Lane> lanes_;
  std::vector<bool> written_inputs_;  // by graph input: written in place by the program
  std::deque<Mail> mail_;  // a deque: Mail holds an atomic, so it does not move

  // Step control: workers wait for a new generation, run() for pending == 0.
  std::mutex ctl_mu_;
  std::condition_variable ctl_cv_, done_cv_;
  uint64_t generation_ = 0;
  int pending_ = 0;
  int started_ = 0;
  bool shutdown_ = false;
  std::string startup_error_;

  std::mutex run_mu_;  // one step at a time
  std::mutex mail_mu_;
  std::atomic<bool> cancelled_{false};
  std::mutex fail_mu_;
  std::optional<Failure> failure_;

  // Note [Reproducible random ops over workers]: set when the program's
  // random ops may run in either order; the devices whose generators they use.
  std::optional<RandomSeeding> seeding_;
  std::vector<c10::Device> seeded_devices_;

  // Replay::Graphs; capture_ is set only during a capture step.
  detail::GraphReplayState graph_;
  detail::GraphCapture* capture_ = nullptr;

  // Per step, written by run() before the workers start.
  std::vector<c10::IValue>* inputs_ = nullptr;
  std::optional<at::ThreadLocalState> tls_;
  Clock::time_point t0_;
};

}  // namespace modelpar::runtime
