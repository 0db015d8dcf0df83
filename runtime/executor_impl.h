// Internals of the Executor, shared by executor_setup.cpp (turning a Program
// into per-device steps, starting the workers) and executor.cpp (running a
// step). Not part of the runtime's API: include runtime/executor.h.
#pragma once

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdint>
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
#include "runtime/op_call.h"

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
};

/// One send -> recv pair (a Program sends each (value, from, to) once).
struct Mail {
  std::unique_ptr<Event> ready;  // sender's compute, after the producer
  std::unique_ptr<Event> done;   // sender's tx stream, after the copy
  c10::IValue value;             // the receiver's copy; read only after `done`
  bool posted = false;           // guarded by Impl::mail_mu_
};

/// One logical device.
struct Lane {
  std::unique_ptr<Device> device;
  std::vector<Step> steps;
  std::vector<std::pair<size_t, ir::ValueId>> inputs;  // graph input index, value
  Env env;
  std::condition_variable mail_cv;  // a slot for this lane was posted, or cancel
  int32_t waiting_for = -1;         // mail awaited in a recv (guarded by mail_mu_)
  bool finished = false;            // guarded by mail_mu_
  size_t at = 0;                    // current instruction (for deadlock reports)
  std::thread thread;
};

struct Failure {
  std::string message;
  int device = -1;  // -1: not one instruction's fault (deadlock)
  size_t instruction = 0;
};

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

 private:
  void resolve();
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
  void stopWorkers();

  ExecutorOptions options_;
  std::vector<ResolvedOp> ops_;  // by NodeId
  std::vector<Lane> lanes_;
  std::vector<Mail> mail_;

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

  // Per step, written by run() before the workers start.
  std::vector<c10::IValue>* inputs_ = nullptr;
  std::optional<at::ThreadLocalState> tls_;
  Clock::time_point t0_;
};

}  // namespace modelpar::runtime
