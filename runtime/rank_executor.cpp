// The rank executor (rank_executor.h): one logical device per process, its
// transfers over a c10d ProcessGroup.
//
// The only translation unit of runtime/ that includes c10d's headers;
// ProcessGroup.hpp pulls in ATen/ATen.h, which the rest of runtime/ avoids.
#include "runtime/rank_executor.h"

#include <algorithm>
#include <condition_variable>
#include <deque>
#include <memory>
#include <mutex>
#include <thread>
#include <utility>

#include <ATen/core/Tensor.h>
#include <ATen/ops/empty.h>
#include <ATen/ops/empty_strided.h>
#include <c10/util/Exception.h>
#include <torch/csrc/distributed/c10d/ProcessGroup.hpp>
#include <torch/csrc/distributed/c10d/Types.hpp>
#include <torch/csrc/distributed/c10d/Work.hpp>

#include "ir/printer.h"
#include "ir/random_ops.h"
#include "ir/verifier.h"
#include "runtime/check.h"
#include "runtime/memory_meter.h"
#include "runtime/op_call.h"
#include "runtime/random_seeding.h"
#include "runtime/rank_messages.h"
#include "runtime/rank_schedule.h"
#include "runtime/threads.h"
#include "runtime/value_types.h"

namespace modelpar::runtime {

// Note [Rank transfers]
// Rank r runs device r's instruction list on the calling thread. Each
// `send %v -> p` / `recv %v <- s` of the Program is one message pair on the
// group, tagged with v's ValueId: a Program sends a value at most once per
// (value, from, to) in a step, and c10d matches a recv with the sends of the
// same (peer, tag) in issue order, so pairs match whatever order the two
// lists issue them in. The verifier's deadlock freedom carries over because
// the semantics are the Program's own (Note [Program semantics]):
//
//   send  posts group.send and returns at once (buffered; over Gloo the
//         sender thread posts it: Note [Issuing sends off the compute
//         thread]); the Work and the
//         sent tensor are kept until the end of the step, or until a later
//         `run` that writes an input in place reads memory a pending send
//         reads (that send is finished first: the fence of Note [Lifetime of
//         sent tensors], per send instead of all of them).
//   recv  posts group.recv into a fresh tensor and waits for it.
//
// A value whose IR type fixes its size travels as one message
// (rank_messages.h): its strides, then its data in that layout, so a
// transposed tensor arrives transposed; the receive is posted ahead (Note
// [Posting receives ahead]). A value with a symbolic size travels as two on
// its tag: a header (sizes, strides; the rank comes from the IR type) and
// the data, contiguous (Gloo sends dense buffers only), rebuilt with its
// strides. An overlapping tensor (expanded) arrives contiguous; a scalar
// travels as 8 bytes.
//
// On GPUs the group is NCCL: ProcessGroupNCCL runs each point-to-point pair
// on its own stream per (device, peer), makes it wait for the current
// stream with an event, records the sent and received tensors' use on it
// (recordStream) and, on Work::wait, makes the current stream wait for it:
// the per-peer tx stream, events and recordStream of Note [Executor stream
// protocol], done by c10d instead of by us. The rank executor issues
// everything on the current stream of `options.device`. NCCL ignores tags
// and pairs transfers by order, so the executor runs the program with every
// device's receives in its peers' send order (Note [Receiving in send
// order], rank_schedule.h; over Gloo too, so that the tested path is the
// one NCCL runs, and receives are posted ahead in the order data comes).
//
// Note [One stream per direction]: c10d's NCCL group runs every transfer
// between two ranks, both directions, on one communicator and one stream
// (its key is "low:high"), in the order each rank issues them. NCCL pairs by
// order, and a send larger than NCCL's buffers completes only once its
// receive runs, so a pair whose ranks each send before they receive could
// wait on each other's stream where the Program's buffered sends do not.
// With `reverse_group` (modelpar/distributed/rank_executor.py makes one over NCCL) the
// transfers from a higher rank to a lower one go over that group: each
// direction is a FIFO of its own, receives come in send order (Note
// [Receiving in send order]), and a send waits only for its data and for
// its receive to be posted, which the receiver does at the program's recv.
//
// Every wait has the executor's timeout: a peer that raised or died makes the
// wait fail (Gloo: connection closed, or the timeout) and run() throws
// PeerError naming the peer and the instruction. What a peer sends is
// checked before memory is laid out from it (Note [Peer data is checked],
// rank_messages.cpp).

// Note [Random ops over ranks]
// Each rank draws from its own process's generators, so without care every
// stage's first dropout draws the same mask (torch.manual_seed(s) on every
// rank sets them all alike), and which rank runs a stage decides its masks.
// As in one process (Note [Reproducible random ops over workers],
// random_seeding.cpp), a program with random ops (ir::isRandom) reseeds each
// of them from the step's seed and its node, so what an op draws is a
// function of torch.manual_seed, the step and the op alone, whichever rank
// runs it. The step's seed must be one on every rank: each rank draws one
// from its default CPU generator (so every rank's generator moves on alike,
// one draw per step, as in one process) and rank 0 broadcasts its own,
// which every rank uses. Rank 0's generator thus decides, as the one
// process's does in-process: a pipeline over ranks draws the masks the same
// pipeline over CPU workers draws after the same torch.manual_seed, even
// when the other ranks' generators have drawn other numbers. The broadcast
// is the first message of a step (one int64), before any receive is posted.
// Programs without random ops skip it. After the step, the generators are
// put back as the seed's draw left them.

// Note [One step at a time]
// A step fills the executor's value slots, receive buffers and pending
// sends, and its messages are matched by tag and order with the peers' of
// the same step, so two steps of one executor must not interleave: run()
// holds a mutex for the whole step, and a second thread calling it (one
// compiled function called from two threads) waits for the first step to
// end. Every rank must still run the same sequence of steps.

namespace {

using Kind = ir::Instruction::Kind;
using Clock = std::chrono::steady_clock;

bool writesAnInput(const c10::OperatorHandle& op) {
  for (const c10::Argument& a : op.schema().arguments()) {
    if (a.alias_info() != nullptr && a.alias_info()->isWrite()) return true;
  }
  return false;
}

std::string errorText(const std::exception& e) {
  if (const auto* c = dynamic_cast<const c10::Error*>(&e)) return c->what_without_backtrace();
  return e.what();
}

// Note [Issuing sends off the compute thread]: with Gloo, posting a send
// (ProcessGroupGloo::send) returns in ~40 us on an idle machine but takes
// 0.1-0.3 ms, and now and then 3-5 ms, while the peer process computes on
// the other core (measured on a 2-vCPU VM: a 1F1B step over 2 ranks spent
// 10 ms of its 64 ms in its 16 sends' issue, two of them 3 and 5 ms, each
// stalling the rank that issued it and so the pipeline). Over Gloo the
// rank executor therefore hands each send to a thread of its own, which
// issues them in order (c10d matches by peer and tag, so the order against
// the receives the compute thread posts does not matter); the compute
// thread goes on at once and waits only where it waited before: at a fence
// (an op that writes memory a pending send reads) and at the end of the
// step, each now first for the send to be issued. NCCL's calls on one
// communicator must come from one thread at a time, and cost only a kernel
// launch, so over NCCL the compute thread issues them itself.

// One send handed to the sender thread: filled in when it is issued.
struct IssuedSend {
  std::mutex m;
  std::condition_variable cv;
  bool issued = false;
  c10::intrusive_ptr<c10d::Work> work;
  std::string error;  // the issue failed
};

// The thread that issues a rank's sends (Note [Issuing sends off the
// compute thread]).
class Sender {
 public:
  /// Throws ExecutionError when the thread cannot start (startThread).
  explicit Sender(c10::intrusive_ptr<c10d::ProcessGroup> group)
      : group_(std::move(group)),
        thread_(startThread(c10::str("rank ", group_->getRank(), "'s sends"), [this] { loop(); })) {}
  ~Sender() {
    {
      std::lock_guard<std::mutex> lock(m_);
      stop_ = true;
    }
    cv_.notify_one();
    thread_.join();
  }
  Sender(const Sender&) = delete;
  Sender& operator=(const Sender&) = delete;

  /// Issues a send of `tensors` to `peer` over `over` (the group's own, or
  /// its reverse group: Note [One stream per direction]).
  std::shared_ptr<IssuedSend> post(c10d::ProcessGroup* over, std::vector<at::Tensor> tensors,
                                   int peer, int tag) {
    auto slot = std::make_shared<IssuedSend>();
    {
      std::lock_guard<std::mutex> lock(m_);
      jobs_.push_back({over, std::move(tensors), peer, tag, slot});
    }
    cv_.notify_one();
    return slot;
  }

 private:
  struct Job {
    c10d::ProcessGroup* over = nullptr;
    std::vector<at::Tensor> tensors;
    int peer;
    int tag;
    std::shared_ptr<IssuedSend> slot;
  };
  void loop() {
    for (;;) {
      Job job;
      {
        std::unique_lock<std::mutex> lock(m_);
        cv_.wait(lock, [&] { return stop_ || !jobs_.empty(); });
        if (jobs_.empty()) return;  // stopping, nothing left
        job = std::move(jobs_.front());
        jobs_.pop_front();
      }
      c10::intrusive_ptr<c10d::Work> work;
      std::string error;
      try {
        work = job.over->send(job.tensors, job.peer, job.tag);
      } catch (const std::exception& e) {
        error = errorText(e);
      }
      {
        std::lock_guard<std::mutex> lock(job.slot->m);
        job.slot->work = std::move(work);
        job.slot->error = std::move(error);
        job.slot->issued = true;
      }
      job.slot->cv.notify_all();
    }
  }

  c10::intrusive_ptr<c10d::ProcessGroup> group_;
  std::mutex m_;
  std::condition_variable cv_;
  std::deque<Job> jobs_;
  bool stop_ = false;
  std::thread thread_;  // last: starts after the members it uses
};

// A pending send: its Work (or, over Gloo, the sender thread's slot for it)
// and the tensors it reads (kept alive until done).
struct Pending {
  c10::intrusive_ptr<c10d::Work> work;
  std::vector<at::Tensor> keep;
  size_t instruction = 0;
  int peer = -1;
  std::shared_ptr<IssuedSend> slot;
  ir::Instruction inst;  // for messages (instruction may be past the list: sendHome)
};

}  // namespace

class RankExecutor::Impl {
 public:
  Impl(const ir::Program& p, c10::intrusive_ptr<c10d::ProcessGroup> group, RankExecutorOptions o)
      : program_(receiveInSendOrder(p)), group_(std::move(group)), options_(std::move(o)) {
    MP_RT_CHECK(group_, ConfigError, "modelpar rank executor: no process group");
    rank_ = group_->getRank();
    size_ = group_->getSize();
    MP_RT_CHECK(size_ == program_.numDevices(), ConfigError, "modelpar rank executor: the program has ",
                program_.numDevices(), " devices but the process group has ", size_,
                " ranks; plan with devices equal to the world size (devices='world')");
    if (options_.reverse_group) {
      MP_RT_CHECK(options_.reverse_group->getSize() == size_ &&
                      options_.reverse_group->getRank() == rank_,
                  ConfigError, "modelpar rank executor: the reverse group has rank ",
                  options_.reverse_group->getRank(), " of ", options_.reverse_group->getSize(),
                  " but the group rank ", rank_, " of ", size_, "; make it of the same ranks");
    }
    if (options_.verify) ir::verify(program_);
    if (group_->getBackendName() == "nccl") {
      checkPairOrder(program_);  // holds after receiveInSendOrder
    } else {  // Note [Issuing sends off the compute thread]
      sender_ = std::make_unique<Sender>(group_);
    }
    const ir::Graph& g = program_.graph();
    ops_.reserve(g.numNodes());
    writes_.resize(g.numNodes());
    for (size_t n = 0; n < g.numNodes(); ++n) {
      ops_.emplace_back(g, static_cast<ir::NodeId>(n));
      writes_[n] = writesAnInput(ops_.back().handle());
    }
    for (size_t k = 0; k < g.inputs().size(); ++k) {
      if (g.inputs()[k].device.value_or(0) == rank_) local_inputs_.push_back(k);
    }
    OutputPlaces places = outputPlaces(program_);
    holders_ = std::move(places.holder);
    present_ = std::move(places.present);
    for (size_t k : options_.replicated_outputs) {
      MP_RT_CHECK(k < g.outputs().size(), ConfigError, "modelpar rank executor: replicated output ",
                  k, " of ", g.outputs().size(), " graph outputs");
    }
    for (const auto& [k, home] : options_.output_homes) {
      MP_RT_CHECK(k < g.outputs().size() && home >= 0 && home < size_, ConfigError,
                  "modelpar rank executor: output home (", k, ", ", home, ") out of range: ",
                  g.outputs().size(), " graph outputs, ", size_, " devices");
      if (holders_[k] >= 0 && !present_[k][static_cast<size_t>(home)]) moves_.emplace_back(k, home);
    }
    // Note [Random ops over ranks]: the program's, not only this rank's, so
    // that every rank takes part in the seed's broadcast.
    seeded_.assign(g.numNodes(), false);
    for (int d = 0; d < size_; ++d) {
      for (const ir::Instruction& inst : program_.schedule(d)) {
        if (inst.kind == Kind::Run && ir::isRandom(g.node(inst.node))) {
          random_ = true;
          seeded_[static_cast<size_t>(inst.node)] = true;
        }
      }
    }
    env_.assign(g.numValues(), c10::IValue());
    if (options_.measure_memory) meter_ = std::make_unique<detail::StorageMeter>();
    const std::vector<ir::Instruction>& mine = program_.schedule(rank_);
    posted_.resize(mine.size());
    for (size_t i = 0; i < mine.size(); ++i) {
      if (mine[i].kind == Kind::Recv && packedBytes(g.value(mine[i].value).type)) fixed_recvs_.push_back(i);
    }
  }

  std::vector<c10::IValue> run(std::vector<c10::IValue> inputs) {
    std::lock_guard<std::mutex> one_step(run_mu_);  // Note [One step at a time]
    const ir::Graph& g = program_.graph();
    MP_RT_CHECK(inputs.size() == g.inputs().size(), ExecutionError, "modelpar rank ", rank_,
                ": graph @", g.name(), " takes ", g.inputs().size(), " inputs, got ", inputs.size());
    std::fill(env_.begin(), env_.end(), c10::IValue());
    pending_.clear();
    if (meter_) meter_->reset();
    for (size_t k : local_inputs_) {
      const ir::Value& v = g.value(g.inputs()[k].value);
      c10::IValue in = std::move(inputs[k]);
      MP_RT_CHECK(hasType(in, v.type), ExecutionError, "modelpar rank ", rank_, ": input %", v.name,
                  " of graph @", g.name(), " should be ", ir::toString(v.type), ", got ",
                  describe(in));
      if (in.isTensor() && in.toTensor().device() != options_.device) {
        in = in.toTensor().to(options_.device);
      }
      setSlot(g.inputs()[k].value, std::move(in));
    }
    if (meter_) meter_->mark(-1);
    MP_RT_CHECK(!broken_, ExecutionError, "modelpar rank ", rank_, ": a previous step failed (",
                broken_reason_, "); messages of that step may still be in flight, so this "
                "executor cannot run again: every rank of the group must stop");
    try {
      const std::vector<ir::Instruction>& sched = program_.schedule(rank_);
      next_post_ = taken_ = 0;
      wait_ns_ = 0;
      if (random_) agreeStepSeed();  // Note [Random ops over ranks]
      postAhead();
      if (options_.record_trace) {
        startTrace();
        for (size_t i = 0; i < sched.size(); ++i) {
          const int64_t start = sinceStep();
          step(i, sched[i]);
          if (meter_) meter_->mark(static_cast<int64_t>(i));
          const Span span{start, sinceStep()};
          trace_.host[static_cast<size_t>(rank_)][i] = span;
          // A send's track shows its hand-off (to the sender thread over
          // Gloo, to c10d over NCCL); the transfer itself runs in c10d.
          if (sched[i].kind == Kind::Send) trace_.transfer[static_cast<size_t>(rank_)][i] = span;
        }
      } else {
        for (size_t i = 0; i < sched.size(); ++i) {
          step(i, sched[i]);
          if (meter_) meter_->mark(static_cast<int64_t>(i));
        }
      }
      if (meter_) {  // Note [Measured memory]: this rank's device
        memory_report_.devices.assign(static_cast<size_t>(size_), DeviceMemory{});
        memory_report_.devices[static_cast<size_t>(rank_)] = meter_->result();
        ++memory_report_.steps;
      }
      if (random_) seeding_.endStep();
      sendHome();
      finishSends();
      std::vector<c10::IValue> out = outputs();
      if (options_.record_trace) trace_.step_ns = sinceStep();
      std::fill(env_.begin(), env_.end(), c10::IValue());
      return out;
    } catch (const std::exception& e) {
      if (random_) seeding_.endStep();
      broken_ = true;
      broken_reason_ = e.what();
      std::fill(env_.begin(), env_.end(), c10::IValue());
      throw;
    }
  }

  int rank() const { return rank_; }
  int size() const { return size_; }
  const ExecutionTrace& trace() const { return trace_; }
  const ir::Program& program() const { return program_; }
  const std::vector<int>& holders() const { return holders_; }

 private:
  void startTrace() {
    trace_.host.assign(static_cast<size_t>(size_), {});
    trace_.transfer.assign(static_cast<size_t>(size_), {});
    for (int d = 0; d < size_; ++d) {
      const size_t n = program_.schedule(d).size();
      trace_.host[static_cast<size_t>(d)].assign(n, Span{});
      trace_.transfer[static_cast<size_t>(d)].assign(n, Span{});
    }
    trace_.step_ns = 0;
    t0_ = std::chrono::steady_clock::now();
  }
  // +1: a span that starts at the step's first nanosecond is not empty().
  int64_t sinceStep() const {
    return std::chrono::duration_cast<std::chrono::nanoseconds>(std::chrono::steady_clock::now() - t0_)
               .count() + 1;
  }

  std::string where(size_t i, const ir::Instruction& inst) const {
    std::string s = c10::str("modelpar rank ", rank_, ", instruction ", i, " (",
                             ir::printInstruction(program_.graph(), inst));
    if (inst.kind == Kind::Run) s += ", " + ops_[static_cast<size_t>(inst.node)].opName();
    return s + ")";
  }

  // output_homes: every holder posts its sends first, then homes receive, so
  // no rank blocks before the sends it needs are issued. The messages use
  // the output's value id as tag, after every message of the step on it.
  void sendHome() {
    const ir::Graph& g = program_.graph();
    const size_t end = program_.schedule(rank_).size();
    for (const auto& [k, home] : moves_) {
      if (holders_[k] != rank_) continue;
      const ir::ValueId v = g.outputs()[k];
      for (at::Tensor& t : frame(env_[static_cast<size_t>(v)], g.value(v).type, options_.device)) {
        issueSend({t}, home, static_cast<int>(v), end, ir::Instruction::send(v, home));
      }
    }
    for (const auto& [k, home] : moves_) {
      if (home != rank_) continue;
      const ir::ValueId v = g.outputs()[k];
      const ir::Instruction inst = ir::Instruction::recv(v, holders_[k]);
      env_[static_cast<size_t>(v)] = receive(g.value(v).type, source(end, inst, inst.peer), [&](at::Tensor& t) {
        std::vector<at::Tensor> one{t};
        wait([&] { return over(inst.peer, rank_).recv(one, inst.peer, static_cast<int>(v)); }, end,
             inst, inst.peer, "sent nothing");
      });
    }
  }

  void step(size_t i, const ir::Instruction& inst) {
    const ir::Graph& g = program_.graph();
    switch (inst.kind) {
      case Kind::Run: {
        if (writes_[static_cast<size_t>(inst.node)]) fence(inst.node);
        const ResolvedOp& op = ops_[static_cast<size_t>(inst.node)];
        std::vector<c10::IValue> out;
        std::unique_lock<std::mutex> seeded;  // Note [Random ops over ranks]
        if (seeded_[static_cast<size_t>(inst.node)]) seeded = seeding_.seed(inst.node, options_.device);
        try {
          // Note [Factory ops follow their device] (op_call.cpp): on a GPU rank.
          out = op.call(env_, options_.device.is_cuda() ? &options_.device : nullptr);
        } catch (const Error& e) {
          MP_RT_THROW(ExecutionError, where(i, inst), ": ", e.what());
        } catch (const std::exception& e) {
          MP_RT_THROW(ExecutionError, where(i, inst), ": ", errorText(e));
        }
        const std::vector<ir::ValueId>& defs = g.node(inst.node).outputs;
        for (size_t k = 0; k < defs.size(); ++k) setSlot(defs[k], std::move(out[k]));
        return;
      }
      case Kind::Send: {
        const c10::IValue& v = env_[static_cast<size_t>(inst.value)];
        MP_RT_CHECK(!v.isNone(), ExecutionError, where(i, inst), ": %", g.value(inst.value).name,
                    " is not on rank ", rank_);
        const ir::Type& type = g.value(inst.value).type;
        std::vector<at::Tensor> messages;
        if (packedBytes(type)) {
          messages.push_back(pack(v, type, options_.device));
        } else {
          messages = frame(v, type, options_.device);
        }
        for (at::Tensor& t : messages) issueSend({t}, inst.peer, static_cast<int>(inst.value), i, inst);
        return;
      }
      case Kind::Recv: {
        const ir::Type& type = g.value(inst.value).type;
        if (packedBytes(type)) {
          setSlot(inst.value, takePosted(i, inst));
          return;
        }
        setSlot(inst.value, receive(type, source(i, inst, inst.peer), [&](at::Tensor& t) {
          std::vector<at::Tensor> one{t};
          wait([&] { return over(inst.peer, rank_).recv(one, inst.peer, static_cast<int>(inst.value)); },
               i, inst, inst.peer, "sent nothing");
        }));
        return;
      }
      case Kind::Free: {
        const c10::IValue& v = env_[static_cast<size_t>(inst.value)];
        MP_RT_CHECK(!v.isNone(), ExecutionError, where(i, inst), ": %", g.value(inst.value).name,
                    " is not on rank ", rank_);
        setSlot(inst.value, c10::IValue());
        return;
      }
    }
  }

  // Who sends value `v` to this rank at instruction i (`inst`), for the
  // checks of what it sends.
  MessageSource source(size_t i, const ir::Instruction& inst, int sender) const {
    return MessageSource{where(i, inst), sender, program_.graph().value(inst.value).name};
  }

  // Receives one value of `type` from `from`; `get(t)` receives one message
  // into t. The header is checked before anything is allocated from it
  // (Note [Peer data is checked]).
  template <typename Get>
  c10::IValue receive(const ir::Type& type, const MessageSource& from, Get&& get) {
    const at::TensorOptions on = at::TensorOptions().device(options_.device);
    if (!type.isTensor()) {
      const bool real = type.kind == ir::Type::Kind::Float;
      at::Tensor t = at::empty({1}, on.dtype(real ? c10::kDouble : c10::kLong));
      get(t);
      at::Tensor c = t.cpu();
      if (real) return c10::IValue(c.data_ptr<double>()[0]);
      const int64_t n = c.data_ptr<int64_t>()[0];
      if (type.kind == ir::Type::Kind::Bool) return c10::IValue(n != 0);
      return c10::IValue(n);
    }
    const auto ndim = static_cast<int64_t>(type.shape.size());
    const at::TensorOptions dt = on.dtype(toC10(type.dtype));
    if (ndim == 0) {
      at::Tensor t = at::empty({}, dt);
      get(t);
      return t;
    }
    at::Tensor h = at::empty({2 * ndim}, on.dtype(c10::kLong));
    get(h);
    at::Tensor hc = h.cpu();
    const int64_t* p = hc.data_ptr<int64_t>();
    const FrameLayout layout = checkFrameHeader(c10::ArrayRef<int64_t>(p, static_cast<size_t>(2 * ndim)),
                                                type, from, options_.max_message_bytes);
    const std::vector<int64_t>& sizes = layout.sizes;
    const std::vector<int64_t>& strides = layout.strides;
    at::Tensor data = at::empty(sizes, dt);
    get(data);
    if (strides == contiguousStrides(sizes)) return data;
    at::Tensor out = at::empty_strided(sizes, strides, dt);
    out.copy_(data);
    return out;
  }

  // Note [Random ops over ranks]: every rank draws a seed (its CPU generator
  // moves on as rank 0's does); rank 0's, broadcast, is the step's.
  void agreeStepSeed() {
    seeding_.beginStep({options_.device});
    at::Tensor seed = at::empty({1}, at::TensorOptions().dtype(c10::kLong));
    seed.data_ptr<int64_t>()[0] = static_cast<int64_t>(seeding_.stepSeed());
    seed = seed.to(options_.device);
    c10d::BroadcastOptions bo;
    bo.rootRank = 0;
    bo.timeout = options_.timeout;
    std::vector<at::Tensor> one{seed};
    const auto start = Clock::now();
    try {
      group_->broadcast(one, bo)->wait(options_.timeout);
      wait_ns_ += std::chrono::duration_cast<std::chrono::nanoseconds>(Clock::now() - start).count();
    } catch (const std::exception& e) {
      throw PeerError(c10::str("modelpar rank ", rank_, ": rank 0 did not broadcast the step's "
                               "random seed within the ", options_.timeout.count(),
                               " ms timeout: rank 0 raised, was killed, or runs another program; ",
                               errorText(e)), 0);
    }
    seeding_.setStepSeed(static_cast<uint64_t>(seed.cpu().data_ptr<int64_t>()[0]));
  }

  // Note [Posting receives ahead]: a receive of a fixed size is posted up to
  // kRecvWindow receives before the instruction that takes it, so that the
  // data flows while this rank still computes: with Gloo a send moves only
  // once its receive is posted. The window bounds the buffers held early.
  static constexpr size_t kRecvWindow = 4;

  void postAhead() {
    const std::vector<ir::Instruction>& sched = program_.schedule(rank_);
    const ir::Graph& g = program_.graph();
    while (next_post_ < fixed_recvs_.size() && next_post_ < taken_ + kRecvWindow) {
      const size_t i = fixed_recvs_[next_post_++];
      const ir::Instruction& inst = sched[i];
      Posted& p = posted_[i];
      p.buffer = at::empty({*packedBytes(g.value(inst.value).type)},
                           at::TensorOptions().dtype(c10::kByte).device(options_.device));
      std::vector<at::Tensor> one{p.buffer};
      try {
        p.work = over(inst.peer, rank_).recv(one, inst.peer, static_cast<int>(inst.value));
      } catch (const std::exception& e) {
        throw PeerError(c10::str(where(i, inst), ": the receive from rank ", inst.peer,
                                 " could not be posted: ", errorText(e)), inst.peer);
      }
    }
  }

  c10::IValue takePosted(size_t i, const ir::Instruction& inst) {
    postAhead();  // posts instruction i's receive if it is not yet
    Posted& p = posted_[i];
    MP_RT_CHECK(p.work, InternalError, where(i, inst), ": its receive was never posted");
    const auto start = Clock::now();
    try {
      p.work->wait(options_.timeout);
      wait_ns_ += std::chrono::duration_cast<std::chrono::nanoseconds>(Clock::now() - start).count();
    } catch (const std::exception& e) {
      throwPeer(i, inst, inst.peer, "sent nothing", start, errorText(e));
    }
    c10::IValue v = unpack(p.buffer, program_.graph().value(inst.value).type, source(i, inst, inst.peer));
    p = Posted{};
    ++taken_;
    postAhead();
    return v;
  }

  // Posts a transfer and waits for it within the timeout.
  template <typename Post>
  void wait(Post&& post, size_t i, const ir::Instruction& inst, int peer, const char* what) {
    const auto start = Clock::now();
    try {
      c10::intrusive_ptr<c10d::Work> work = post();
      work->wait(options_.timeout);
      wait_ns_ += std::chrono::duration_cast<std::chrono::nanoseconds>(Clock::now() - start).count();
    } catch (const std::exception& e) {
      throwPeer(i, inst, peer, what, start, errorText(e));
    }
  }

  [[noreturn]] void throwPeer(size_t i, const ir::Instruction& inst, int peer, const char* what,
                              Clock::time_point start, const std::string& detail) const {
    const double waited = std::chrono::duration<double>(Clock::now() - start).count();
    const double limit = std::chrono::duration<double>(options_.timeout).count();
    throw PeerError(c10::str(where(i, inst), ": rank ", peer, " ", what, " (waited ", waited,
                             " s of the ", limit, " s timeout): rank ", peer,
                             " raised, was killed, or waits on a rank that did; ", detail),
                    peer);
  }

  // Before an op that writes an input in place: finish the pending sends
  // that read memory of one of its inputs (the others may stay in flight).
  void fence(ir::NodeId n) {
    std::vector<at::Tensor> inputs;
    for (ir::ValueId v : program_.graph().node(n).inputs()) {
      const c10::IValue& x = env_[static_cast<size_t>(v)];
      if (x.isTensor() && x.toTensor().defined()) inputs.push_back(x.toTensor());
    }
    std::vector<Pending> still;
    for (Pending& s : pending_) {
      const bool reads = std::any_of(s.keep.begin(), s.keep.end(), [&](const at::Tensor& k) {
        return std::any_of(inputs.begin(), inputs.end(),
                           [&](const at::Tensor& t) { return k.is_alias_of(t); });
      });
      if (reads) {
        finishSend(s);
      } else {
        still.push_back(std::move(s));
      }
    }
    pending_ = std::move(still);
  }

  void finishSends() {
    for (Pending& s : pending_) finishSend(s);
    pending_.clear();
  }

  // The group that carries transfers from rank `from` to rank `to` (Note
  // [One stream per direction]).
  c10d::ProcessGroup& over(int from, int to) const {
    return from > to && options_.reverse_group ? *options_.reverse_group : *group_;
  }

  // Posts one message of instruction i (`inst`): on the sender thread over
  // Gloo, here over NCCL (Note [Issuing sends off the compute thread]).
  void issueSend(std::vector<at::Tensor> one, int peer, int tag, size_t i,
                 const ir::Instruction& inst) {
    c10d::ProcessGroup& group = over(rank_, peer);
    if (sender_) {
      std::shared_ptr<IssuedSend> slot = sender_->post(&group, one, peer, tag);
      pending_.push_back({{}, std::move(one), i, peer, std::move(slot), inst});
      return;
    }
    c10::intrusive_ptr<c10d::Work> work;
    try {
      work = group.send(one, peer, tag);
    } catch (const std::exception& e) {
      throw PeerError(c10::str(where(i, inst), ": the send to rank ", peer, " failed: ",
                               errorText(e)), peer);
    }
    pending_.push_back({std::move(work), std::move(one), i, peer, nullptr, inst});
  }

  // Waits (at most the timeout) until the peer has taken send `s`.
  void finishSend(Pending& s) {
    const auto start = Clock::now();
    if (s.slot) {  // issued by the sender thread: first wait for the issue
      std::unique_lock<std::mutex> lock(s.slot->m);
      if (!s.slot->cv.wait_until(lock, start + options_.timeout, [&] { return s.slot->issued; })) {
        throwPeer(s.instruction, s.inst, s.peer, "did not take what was sent", start,
                  "the send was never issued");
      }
      if (!s.slot->error.empty()) {
        throw PeerError(c10::str(where(s.instruction, s.inst),
                                 ": the send to rank ", s.peer, " failed: ", s.slot->error),
                        s.peer);
      }
      s.work = s.slot->work;
    }
    try {
      s.work->wait(options_.timeout);
      wait_ns_ += std::chrono::duration_cast<std::chrono::nanoseconds>(Clock::now() - start).count();
    } catch (const std::exception& e) {
      throwPeer(s.instruction, s.inst, s.peer, "did not take what was sent", start, errorText(e));
    }
  }

  std::vector<c10::IValue> outputs() {
    const ir::Graph& g = program_.graph();
    std::vector<c10::IValue> out(g.outputs().size());
    for (size_t k = 0; k < out.size(); ++k) {
      if (holders_[k] == rank_ || present_[k][static_cast<size_t>(rank_)]) {
        out[k] = env_[static_cast<size_t>(g.outputs()[k])];
      }
    }
    for (const auto& [k, home] : options_.output_homes) {  // only at home
      out[k] = home == rank_ ? env_[static_cast<size_t>(g.outputs()[k])] : c10::IValue();
    }
    for (size_t k : options_.replicated_outputs) out[k] = broadcast(k, out[k]);
    return out;
  }

  // Output k from its holder to every rank (two broadcasts for a tensor of
  // rank >= 1: the header, then the data).
  c10::IValue broadcast(size_t k, const c10::IValue& mine) {
    const ir::Graph& g = program_.graph();
    const ir::Value& v = g.value(g.outputs()[k]);
    const int root = holders_[k];
    MP_RT_CHECK(root >= 0, ExecutionError, "modelpar rank ", rank_, ": graph output %", v.name,
                " is on no device when the program ends (freed, or never computed)");
    c10d::BroadcastOptions bo;
    bo.rootRank = root;
    bo.timeout = options_.timeout;
    const ir::Instruction here = ir::Instruction::recv(g.outputs()[k], root);
    const size_t end = program_.schedule(rank_).size();
    auto one = [&](at::Tensor& t) {
      std::vector<at::Tensor> ts{t};
      wait([&] { return group_->broadcast(ts, bo); }, end, here, root, "did not broadcast the output");
    };
    if (root == rank_) {
      for (at::Tensor& t : frame(mine, v.type, options_.device)) one(t);
      return asFramed(mine);  // Note [Framed tensors keep their layout]
    }
    return receive(v.type, source(end, here, root), one);
  }

  ir::Program program_;
  c10::intrusive_ptr<c10d::ProcessGroup> group_;
  RankExecutorOptions options_;
  int rank_ = 0;
  int size_ = 0;
  std::vector<ResolvedOp> ops_;     // by NodeId
  std::vector<bool> writes_;        // by NodeId: writes an input in place
  std::vector<size_t> local_inputs_;
  std::vector<int> holders_;        // by graph output
  std::vector<std::vector<bool>> present_;  // by graph output, device: holds it at the end
  std::vector<std::pair<size_t, int>> moves_;  // output_homes its holder must send
  Env env_;
  // Note [Measured memory] (memory_meter.h), with measure_memory: this
  // rank's Env, as a worker of the multi-device executor measures its own.
  std::unique_ptr<detail::StorageMeter> meter_;
  MemoryReport memory_report_;
  std::vector<Pending> pending_;
  std::unique_ptr<Sender> sender_;  // over Gloo (Note [Issuing sends off the compute thread])
  // A receive posted ahead (Note [Posting receives ahead]).
  struct Posted {
    at::Tensor buffer;
    c10::intrusive_ptr<c10d::Work> work;
  };
  std::vector<size_t> fixed_recvs_;  // this rank's receives of a fixed size, in order
  std::vector<Posted> posted_;       // by instruction
  size_t next_post_ = 0;             // into fixed_recvs_
  size_t taken_ = 0;                 // receives of fixed_recvs_ completed this step
  bool broken_ = false;
  std::string broken_reason_;
  std::mutex run_mu_;  // Note [One step at a time]
  // Note [Random ops over ranks]: whether the program has random ops, and
  // which nodes are.
  bool random_ = false;
  std::vector<bool> seeded_;  // by NodeId
  RandomSeeding seeding_;
  int64_t wait_ns_ = 0;  // this step: blocked in waits for peers
  ExecutionTrace trace_;  // the last step's, with record_trace
  std::chrono::steady_clock::time_point t0_;

 public:
  int64_t waitNs() const { return wait_ns_; }
  MemoryReport memoryReport() {
    std::lock_guard<std::mutex> lock(run_mu_);
    MP_RT_CHECK(options_.measure_memory, ConfigError,
                "modelpar rank executor: memoryReport() needs RankExecutorOptions::measure_memory "
                "(Python: measure_memory=True)");
    return memory_report_;
  }

 private:
  /// env_[v] = x, through the meter when measuring.
  void setSlot(ir::ValueId v, c10::IValue x) {
    c10::IValue& slot = env_[static_cast<size_t>(v)];
    if (meter_) {
      meter_->remove(slot);
      meter_->add(x);
    }
    slot = std::move(x);
  }
};

RankExecutor::RankExecutor(const ir::Program& p, c10::intrusive_ptr<c10d::ProcessGroup> group,
                           RankExecutorOptions options)
    : impl_(std::make_unique<Impl>(p, std::move(group), std::move(options))) {}
RankExecutor::~RankExecutor() = default;

std::vector<c10::IValue> RankExecutor::run(std::vector<c10::IValue> inputs) {
  return impl_->run(std::move(inputs));
}
int RankExecutor::rank() const { return impl_->rank(); }
int RankExecutor::worldSize() const { return impl_->size(); }
const ir::Program& RankExecutor::program() const { return impl_->program(); }
const std::vector<int>& RankExecutor::outputHolders() const { return impl_->holders(); }
int64_t RankExecutor::lastStepWaitNs() const { return impl_->waitNs(); }

const ExecutionTrace& RankExecutor::lastTrace() const { return impl_->trace(); }

MemoryReport RankExecutor::memoryReport() const { return impl_->memoryReport(); }

}  // namespace modelpar::runtime
