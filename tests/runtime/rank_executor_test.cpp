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
#include <map>
#include <mutex>
#include <set>
#include <thread>
#include <tuple>

#include <ATen/core/Tensor.h>
#include <ATen/ops/equal.h>
#include <ATen/ops/randn.h>
#include <torch/csrc/distributed/c10d/Backend.hpp>
#include <torch/csrc/distributed/c10d/ProcessGroup.hpp>
#include <torch/csrc/distributed/c10d/Work.hpp>

#include "ir/parser.h"
#include "runtime/program_interpreter.h"
#include "tests/support/expect_error.h"
#include "tests/support/read_file.h"

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

}  // namespace
}  // namespace modelpar::runtime
