// RankExecutor over a c10d ProcessGroup, with ranks as threads of this test:
// the group's backend is a loopback (below, test-only: c10d's own Gloo needs
// headers the wheel lacks; the Python tests run real Gloo groups in separate
// processes, and so does examples/rank_train.cpp from C++ where Debian's
// libgloo-dev provides them). Two ranks running their halves of a Program
// give what the reference interpreter gives; a rank that never sends makes
// its peer raise PeerError naming it within the timeout; bad set-ups are
// typed errors.
#include "runtime/rank_executor.h"

#include <gtest/gtest.h>

#include <chrono>
#include <condition_variable>
#include <deque>
#include <exception>
#include <cstring>
#include <map>
#include <optional>
#include <mutex>
#include <set>
#include <atomic>
#include <thread>
#include <tuple>

#include <torch/library.h>

#include <ATen/core/Tensor.h>
#include <ATen/ops/equal.h>
#include <ATen/ops/randn.h>
#include <ATen/ops/tensor.h>
#include <ATen/ops/zeros.h>
#include <torch/csrc/distributed/c10d/Backend.hpp>
#include <torch/csrc/distributed/c10d/ProcessGroup.hpp>
#include <torch/csrc/distributed/c10d/Work.hpp>

#include "ir/parser.h"
#include "runtime/executor.h"
#include "runtime/program_interpreter.h"
#include "tests/support/expect_error.h"
#include "tests/support/read_file.h"

namespace {

// Counts the calls inside it at once (the most seen in `overlap_peak`): an
// op that sleeps `ms` so that two unserialised steps overlap in it.
std::atomic<int> overlap_now{0};
std::atomic<int> overlap_peak{0};
at::Tensor overlapProbe(const at::Tensor& x, int64_t ms) {
  const int now = ++overlap_now;
  int peak = overlap_peak.load();
  while (now > peak && !overlap_peak.compare_exchange_weak(peak, now)) {
  }
  std::this_thread::sleep_for(std::chrono::milliseconds(ms));
  --overlap_now;
  return x.clone();
}

TORCH_LIBRARY_FRAGMENT(modelpar_test, m) {
  m.def("overlap_probe(Tensor x, int ms) -> Tensor", &overlapProbe);
}

}  // namespace

namespace modelpar::runtime {
namespace {

using c10::IValue;
using modelpar::testing::messageOf;
using modelpar::testing::readFile;

// Messages between the ranks of one loopback group, FIFO per (from, to, tag).
struct Wire {
  std::mutex mu;
  std::condition_variable cv;
  std::map<std::tuple<int, int, int>, std::deque<at::Tensor>> box;
};

constexpr int kBroadcastTag = -1;

class Done : public c10d::Work {
 public:
  bool isCompleted() override { return true; }
  bool wait(std::chrono::milliseconds) override { return true; }
};

class Receive : public c10d::Work {
 public:
  Receive(Wire& w, std::tuple<int, int, int> key, at::Tensor into)
      : wire_(w), key_(key), into_(std::move(into)) {}
  bool wait(std::chrono::milliseconds timeout) override {
    std::unique_lock<std::mutex> lock(wire_.mu);
    auto& q = wire_.box[key_];
    TORCH_CHECK(wire_.cv.wait_for(lock, timeout, [&] { return !q.empty(); }),
                "loopback: nothing from rank ", std::get<0>(key_), " within ", timeout.count(), " ms");
    into_.copy_(q.front());
    q.pop_front();
    return true;
  }

 private:
  Wire& wire_;
  std::tuple<int, int, int> key_;
  at::Tensor into_;
};

class Loopback : public c10d::Backend {
 public:
  Loopback(Wire& w, int rank, int size) : c10d::Backend(rank, size), wire_(w) {}
  const std::string getBackendName() const override { return "loopback"; }
  c10::intrusive_ptr<c10d::Work> send(std::vector<at::Tensor>& t, int to, int tag) override {
    post(getRank(), to, tag, t.at(0));
    return c10::make_intrusive<Done>();
  }
  c10::intrusive_ptr<c10d::Work> recv(std::vector<at::Tensor>& t, int from, int tag) override {
    return c10::make_intrusive<Receive>(wire_, std::make_tuple(from, getRank(), tag), t.at(0));
  }
  c10::intrusive_ptr<c10d::Work> broadcast(std::vector<at::Tensor>& t,
                                           const c10d::BroadcastOptions& o) override {
    const auto root = static_cast<int>(o.rootRank);
    if (root != getRank()) {
      return c10::make_intrusive<Receive>(wire_, std::make_tuple(root, getRank(), kBroadcastTag), t.at(0));
    }
    for (int r = 0; r < getSize(); ++r) {
      if (r != root) post(root, r, kBroadcastTag, t.at(0));
    }
    return c10::make_intrusive<Done>();
  }

 private:
  void post(int from, int to, int tag, const at::Tensor& t) {
    {
      std::lock_guard<std::mutex> lock(wire_.mu);
      wire_.box[{from, to, tag}].push_back(t.clone());
    }
    wire_.cv.notify_all();
  }
  Wire& wire_;
};

c10::intrusive_ptr<c10d::ProcessGroup> loopbackGroup(Wire& w, int rank, int size) {
  auto pg = c10::make_intrusive<c10d::ProcessGroup>(rank, size);
  pg->setBackend(c10::DeviceType::CPU, c10d::ProcessGroup::BackendType::CUSTOM,
                 c10::make_intrusive<Loopback>(w, rank, size));
  pg->setDefaultBackend(c10d::ProcessGroup::BackendType::CUSTOM);
  return pg;
}

ir::Program mlpPipeline() {
  return ir::parseProgram(readFile(MODELPAR_SOURCE_DIR "/examples/ir/mlp_pipeline_2dev.txt"));
}

std::vector<IValue> mlpInputs() {
  return {at::randn({8, 16}), at::randn({8, 4}), at::randn({16, 32}), at::randn({32, 4})};
}

// One step of every rank's executor, each on a thread of its own (a rank
// waits for its peers); rethrows the first rank's error.
std::vector<std::vector<IValue>> runRanks(std::vector<std::unique_ptr<RankExecutor>>& ex,
                                          const std::vector<IValue>& in) {
  std::vector<std::vector<IValue>> got(ex.size());
  std::vector<std::exception_ptr> err(ex.size());
  std::vector<std::thread> ranks;
  for (size_t r = 0; r < ex.size(); ++r) {
    ranks.emplace_back([&, r] {
      try {
        got[r] = ex[r]->run(in);
      } catch (...) {
        err[r] = std::current_exception();
      }
    });
  }
  for (std::thread& t : ranks) t.join();
  for (const std::exception_ptr& e : err) {
    if (e) std::rethrow_exception(e);
  }
  return got;
}

// The hand-written 2-device pipeline (examples/ir/mlp_pipeline_2dev.txt:
// outputs %loss, %w1_new on device 0, %w2_new on device 1), one thread per
// rank, %loss replicated: every output equals the reference interpreter's on
// its holder, the loss on both ranks, and the others are None. Two steps, so
// the second reuses what the first set up.
TEST(RankExecutor, TwoRanksOfAPipelineEqualTheReferenceInterpreter) {
  const ir::Program p = mlpPipeline();
  Wire wire;
  RankExecutorOptions o;
  o.replicated_outputs = {0};
  std::vector<std::unique_ptr<RankExecutor>> ex;
  for (int r = 0; r < 2; ++r) ex.push_back(std::make_unique<RankExecutor>(p, loopbackGroup(wire, r, 2), o));
  EXPECT_EQ(ex[0]->outputHolders(), (std::vector<int>{1, 0, 1}));
  for (int step = 0; step < 2; ++step) {
    const std::vector<IValue> in = mlpInputs();
    const std::vector<IValue> want = ProgramInterpreter(p).run(in);
    const std::vector<std::vector<IValue>> got = runRanks(ex, in);
    for (int r = 0; r < 2; ++r) {
      EXPECT_TRUE(at::equal(got[static_cast<size_t>(r)][0].toTensor(), want[0].toTensor())) << "loss, rank " << r;
    }
    EXPECT_TRUE(at::equal(got[0][1].toTensor(), want[1].toTensor()));  // w1_new on rank 0
    EXPECT_TRUE(got[1][1].isNone());
    EXPECT_TRUE(at::equal(got[1][2].toTensor(), want[2].toTensor()));  // w2_new on rank 1
    EXPECT_TRUE(got[0][2].isNone());
  }
}

// measure_memory (Note [Measured memory]): each rank measures its own
// device as a worker of the multi-device executor measures it on the same
// program and inputs (the same instructions on the same Env slots), and
// leaves the other devices' entries zero. One difference is real: a small
// received tensor is a view of its message, which carries its strides
// ahead of the data (8 bytes a dimension, rank_messages.h), so a rank holds
// up to that much more per tensor it received. Without the option the
// report is a ConfigError.
TEST(RankExecutor, MeasuredMemoryOfEachRankEqualsTheExecutorsForItsDevice) {
  const ir::Program p = mlpPipeline();
  Wire wire;
  RankExecutorOptions o;
  o.measure_memory = true;
  std::vector<std::unique_ptr<RankExecutor>> ex;
  for (int r = 0; r < 2; ++r) ex.push_back(std::make_unique<RankExecutor>(p, loopbackGroup(wire, r, 2), o));
  ExecutorOptions eo;
  eo.measure_memory = true;
  Executor in_process(p, DeviceMap::cpuWorkers(2, 1), eo);
  for (int step = 0; step < 2; ++step) {
    const std::vector<IValue> in = mlpInputs();
    runRanks(ex, in);
    in_process.run(in);
  }
  const MemoryReport want = in_process.memoryReport();
  ASSERT_EQ(want.devices.size(), 2u);
  for (int r = 0; r < 2; ++r) {
    const MemoryReport got = ex[static_cast<size_t>(r)]->memoryReport();
    EXPECT_EQ(got.steps, 2);
    ASSERT_EQ(got.devices.size(), 2u);
    const DeviceMemory& mine = got.devices[static_cast<size_t>(r)];
    const DeviceMemory& theirs = want.devices[static_cast<size_t>(r)];
    EXPECT_GT(mine.peak_bytes, 0) << "rank " << r;
    EXPECT_EQ(mine.start_bytes, theirs.start_bytes) << "rank " << r;
    int64_t headers = 0;  // every tensor this rank receives, held at once at most
    for (const ir::Instruction& inst : p.schedule(r)) {
      if (inst.kind != ir::Instruction::Kind::Recv) continue;
      const ir::Type& t = p.graph().value(inst.value).type;
      if (t.isTensor()) headers += 8 * static_cast<int64_t>(t.shape.size());
    }
    EXPECT_GT(headers, 0) << "rank " << r;
    EXPECT_GE(mine.peak_bytes, theirs.peak_bytes) << "rank " << r;
    EXPECT_LE(mine.peak_bytes, theirs.peak_bytes + headers) << "rank " << r;
    EXPECT_EQ(mine.peak_instruction, theirs.peak_instruction) << "rank " << r;
    EXPECT_GE(mine.end_bytes, theirs.end_bytes) << "rank " << r;
    EXPECT_LE(mine.end_bytes, theirs.end_bytes + headers) << "rank " << r;
    EXPECT_EQ(got.devices[static_cast<size_t>(1 - r)].peak_bytes, 0) << "rank " << r;
  }
  std::vector<std::unique_ptr<RankExecutor>> plain;
  Wire wire2;
  for (int r = 0; r < 2; ++r) plain.push_back(std::make_unique<RankExecutor>(p, loopbackGroup(wire2, r, 2)));
  EXPECT_HAS(messageOf<ConfigError>([&] { plain[0]->memoryReport(); }), "measure_memory");
}

// record_trace: each rank's trace holds a non-empty span for every one of
// its own instructions, in order, and nothing on the other rank's row, and
// its Chrome trace has spans of its own device (pid) only.
TEST(RankExecutor, ATraceHoldsThisRanksInstructionsOnly) {
  const ir::Program p = mlpPipeline();
  Wire wire;
  RankExecutorOptions o;
  o.record_trace = true;
  std::vector<std::unique_ptr<RankExecutor>> ex;
  for (int r = 0; r < 2; ++r) ex.push_back(std::make_unique<RankExecutor>(p, loopbackGroup(wire, r, 2), o));
  runRanks(ex, mlpInputs());
  for (int r = 0; r < 2; ++r) {
    const ExecutionTrace& t = ex[static_cast<size_t>(r)]->lastTrace();
    ASSERT_EQ(t.host.size(), 2u);
    const std::vector<Span>& mine = t.host[static_cast<size_t>(r)];
    ASSERT_EQ(mine.size(), p.schedule(r).size());
    for (size_t i = 0; i < mine.size(); ++i) {
      EXPECT_FALSE(mine[i].empty()) << "rank " << r << ", instruction " << i;
      EXPECT_LE(mine[i].start_ns, mine[i].end_ns);
      if (i > 0) EXPECT_LE(mine[i - 1].end_ns, mine[i].start_ns);
    }
    for (const Span& s : t.host[static_cast<size_t>(1 - r)]) EXPECT_TRUE(s.empty());
    EXPECT_GE(t.step_ns, mine.back().end_ns);
    const std::string json = toChromeTrace(p, t);
    EXPECT_NE(json.find(c10::str("\"ph\":\"X\",\"pid\":", r)), std::string::npos);
    EXPECT_EQ(json.find(c10::str("\"ph\":\"X\",\"pid\":", 1 - r)), std::string::npos);
  }
}

// Rank 1 never runs: rank 0's first receive from it gives up after the
// timeout with a PeerError naming rank 1 and the instruction, and the
// executor refuses another step.
TEST(RankExecutor, APeerThatNeverSendsIsAPeerErrorNamingItWithinTheTimeout) {
  Wire wire;
  RankExecutorOptions o;
  o.timeout = std::chrono::milliseconds(200);
  RankExecutor ex(mlpPipeline(), loopbackGroup(wire, 0, 2), o);
  const auto start = std::chrono::steady_clock::now();
  try {
    ex.run(mlpInputs());
    FAIL() << "no error";
  } catch (const PeerError& e) {
    EXPECT_EQ(e.peer(), 1);
    EXPECT_HAS(std::string(e.what()), "modelpar rank 0, instruction");
    EXPECT_HAS(std::string(e.what()), "<- 1): rank 1 sent nothing");
  }
  EXPECT_LT(std::chrono::steady_clock::now() - start, std::chrono::seconds(5));
  EXPECT_HAS(messageOf<ExecutionError>([&] { ex.run(mlpInputs()); }), "a previous step failed");
}

// Note [One stream per direction]: with a reverse group, the transfers from
// rank 1 to rank 0 (the pipeline's gradients) travel over it and those from
// 0 to 1 (activations) over the main group; the step still equals the
// reference interpreter's.
TEST(RankExecutor, WithAReverseGroupEachDirectionHasAGroupOfItsOwn) {
  const ir::Program p = mlpPipeline();
  Wire up, down;  // main group (0 -> 1), reverse group (1 -> 0)
  std::vector<std::unique_ptr<RankExecutor>> ex;
  for (int r = 0; r < 2; ++r) {
    RankExecutorOptions o;
    o.replicated_outputs = {0};
    o.reverse_group = loopbackGroup(down, r, 2);
    ex.push_back(std::make_unique<RankExecutor>(p, loopbackGroup(up, r, 2), o));
  }
  const std::vector<IValue> in = mlpInputs();
  const std::vector<IValue> want = ProgramInterpreter(p).run(in);
  const std::vector<std::vector<IValue>> got = runRanks(ex, in);
  EXPECT_TRUE(at::equal(got[0][0].toTensor(), want[0].toTensor()));
  EXPECT_TRUE(at::equal(got[0][1].toTensor(), want[1].toTensor()));
  EXPECT_TRUE(at::equal(got[1][2].toTensor(), want[2].toTensor()));
  auto directions = [](const Wire& w) {
    std::set<std::pair<int, int>> out;
    for (const auto& [key, q] : w.box) {
      if (std::get<2>(key) != kBroadcastTag) out.emplace(std::get<0>(key), std::get<1>(key));
    }
    return out;
  };
  EXPECT_EQ(directions(up), (std::set<std::pair<int, int>>{{0, 1}}));
  EXPECT_EQ(directions(down), (std::set<std::pair<int, int>>{{1, 0}}));
}

TEST(RankExecutor, AReverseGroupOfOtherRanksIsAConfigError) {
  Wire wire, other;
  RankExecutorOptions o;
  o.reverse_group = loopbackGroup(other, 1, 2);
  EXPECT_HAS(messageOf<ConfigError>([&] { RankExecutor(mlpPipeline(), loopbackGroup(wire, 0, 2), o); }),
             "the reverse group has rank 1 of 2 but the group rank 0 of 2");
}

TEST(RankExecutor, AGroupOfAnotherSizeIsAConfigError) {
  Wire wire;
  EXPECT_HAS(messageOf<ConfigError>([&] { RankExecutor(mlpPipeline(), loopbackGroup(wire, 0, 3)); }),
             "the program has 2 devices but the process group has 3 ranks");
}

TEST(RankExecutor, ABadLocalInputIsAnExecutionErrorNamingIt) {
  Wire wire;
  RankExecutor ex(mlpPipeline(), loopbackGroup(wire, 0, 2));
  std::vector<IValue> in = mlpInputs();
  in[0] = at::randn({8, 15});
  EXPECT_HAS(messageOf<ExecutionError>([&] { ex.run(in); }), "input %x of graph @mlp_pipeline should be f32[8, 16]");
}


// Two threads calling run() of one executor (one compiled function called
// from two threads): the steps run one after the other, never inside each
// other (the executor's value slots and transfers are per step).
TEST(RankExecutor, StepsCalledFromTwoThreadsRunOneAfterTheOther) {
  const ir::Program p = ir::parseProgram(R"(
    program devices=1
    graph @probe(%x: f32[4] input {device=0}) {
      %y: f32[4] = modelpar_test::overlap_probe(%x, 100) {device=0}
      return %y
    }
    device 0 { run %y }
  )");
  Wire wire;
  RankExecutor ex(p, loopbackGroup(wire, 0, 1));
  overlap_peak = 0;
  const at::Tensor x = at::randn({4});
  std::vector<std::vector<IValue>> got(2);
  std::vector<std::thread> callers;
  for (size_t t = 0; t < 2; ++t) callers.emplace_back([&, t] { got[t] = ex.run({x}); });
  for (std::thread& t : callers) t.join();
  EXPECT_EQ(overlap_peak.load(), 1);
  for (const std::vector<IValue>& out : got) {
    ASSERT_EQ(out.size(), 1u);
    EXPECT_TRUE(at::equal(out[0].toTensor(), x));
  }
}

// A program whose device 0 sends %y (of symbolic size B) to device 1: rank 1
// runs it while the test plays rank 0 and writes forged messages on the wire.
ir::Program symbolicSend() {
  return ir::parseProgram(R"(
    program devices=2
    graph @fwd(%x: f32[B, 4] input {device=0}, %w: f32[4, 4] input {device=0}) {
      %y: f32[B, 4] = aten::relu(%x) {device=0}
      %v: f32[4, 4] = aten::relu(%w) {device=0}
      %z: f32[B, 4] = aten::neg(%y) {device=1}
      %u: f32[4, 4] = aten::neg(%v) {device=1}
      return %z, %u
    }
    device 0 { run %y
      run %v
      send %y -> 1
      send %v -> 1 }
    device 1 { recv %y <- 0
      recv %v <- 0
      run %z
      run %u }
  )");
}

// Rank 1's step with `header` (sizes, strides) and `data` forged for %y, a
// good %v; the message of the ExecutionError it raises ("" if none).
std::string receiveForged(const std::vector<int64_t>& header, const at::Tensor& data,
                          std::optional<std::vector<int64_t>> v_strides = std::nullopt) {
  const ir::Program p = symbolicSend();
  Wire wire;
  RankExecutorOptions o;
  o.timeout = std::chrono::milliseconds(2000);
  RankExecutor ex(p, loopbackGroup(wire, 1, 2), o);
  const int y = static_cast<int>(*p.graph().findValue("y"));
  const int v = static_cast<int>(*p.graph().findValue("v"));
  {
    std::lock_guard<std::mutex> lock(wire.mu);
    wire.box[{0, 1, y}].push_back(at::tensor(header, at::TensorOptions().dtype(c10::kLong)));
    wire.box[{0, 1, y}].push_back(data);
    // %v's one packed message: 2 strides (16 bytes), then 16 floats.
    const std::vector<int64_t> st = v_strides.value_or(std::vector<int64_t>{4, 1});
    at::Tensor msg = at::zeros({16 + 64}, at::TensorOptions().dtype(c10::kByte));
    std::memcpy(msg.data_ptr(), st.data(), 16);
    wire.box[{0, 1, v}].push_back(msg);
  }
  try {
    ex.run({IValue(), IValue()});
  } catch (const PeerError& e) {
    return std::string("PeerError: ") + e.what();
  } catch (const ExecutionError& e) {
    return e.what();
  } catch (const std::exception& e) {
    return std::string("not an ExecutionError: ") + e.what();
  }
  return "";
}

TEST(RankExecutor, AWellFormedFramedReceiveIsAccepted) {
  EXPECT_EQ(receiveForged({3, 4, 4, 1}, at::randn({3, 4})), "");
}

// Note [Peer headers are checked]: a header that does not describe a value
// of the IR type is an ExecutionError naming the sender, the value and the
// fault, before anything is allocated from it.
TEST(RankExecutor, AForgedFrameHeaderIsAnExecutionErrorNamingTheSenderAndTheValue) {
  const at::Tensor data = at::randn({3, 4});
  std::string m = receiveForged({-3, 4, 4, 1}, data);
  EXPECT_HAS(m, "modelpar rank 1, instruction 0 (recv %y <- 0): rank 0 sent a header for %y (f32[B, 4])");
  EXPECT_HAS(m, "size -3 in dim 0");
  EXPECT_HAS(receiveForged({3, 5, 5, 1}, data), "size 5 in dim 1 where the IR type has 4");
  EXPECT_HAS(receiveForged({int64_t{1} << 40, 4, 4, 1}, data), "more than the 68719476736 bytes");
  EXPECT_HAS(receiveForged({int64_t{1} << 62, 4, 4, 1}, data), "overflows");
  EXPECT_HAS(receiveForged({3, 4, -4, 1}, data), "stride -4 in dim 0");
  EXPECT_HAS(receiveForged({3, 4, 1, 1}, data), "strides (1, 1) overlap");
}

// A packed message (a value whose IR type fixes its size) carries strides
// only: strides that reach past the message are refused the same way.
TEST(RankExecutor, ForgedStridesOfAPackedMessageAreAnExecutionError) {
  std::string m = receiveForged({3, 4, 4, 1}, at::randn({3, 4}), std::vector<int64_t>{400, 1});
  EXPECT_HAS(m, "modelpar rank 1, instruction 1 (recv %v <- 0): rank 0 sent strides for %v (f32[4, 4])");
  EXPECT_HAS(m, "reach element 1203 of the 16 the message holds");
  EXPECT_HAS(receiveForged({3, 4, 4, 1}, at::randn({3, 4}), std::vector<int64_t>{1, 1}),
             "strides (1, 1) overlap");
}

}  // namespace
}  // namespace modelpar::runtime
