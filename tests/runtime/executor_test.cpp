// Executor on CPU workers: per-device threads give exactly the reference
// interpreter's results; devices really run concurrently; errors stop every
// device and name the device and instruction; steps repeat deterministically.
#include "runtime/executor.h"

#include <gtest/gtest.h>

#include "tests/support/expect_error.h"
#include "tests/support/read_file.h"

#include <ATen/Context.h>
#include <ATen/Parallel.h>
#include <ATen/core/Tensor.h>
#include <ATen/ops/allclose.h>
#include <ATen/ops/equal.h>
#include <ATen/ops/mm.h>
#include <ATen/ops/ones.h>
#include <ATen/ops/randn.h>
#include <ATen/ops/relu.h>
#include <c10/core/GradMode.h>
#include <torch/library.h>

#include <chrono>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <string>
#include <thread>

#include "ir/error.h"
#include "ir/parser.h"
#include "ir/verifier.h"
#include "runtime/program_interpreter.h"
#include "runtime/threads.h"

namespace {

// Test operators: a sleep (so that overlap shows in timestamps, not speed),
// an injected failure, and a probe of the worker's intra-op thread count.
at::Tensor sleepMs(const at::Tensor& x, int64_t ms) {
  std::this_thread::sleep_for(std::chrono::milliseconds(ms));
  return x.clone();
}
at::Tensor failAfterMs(const at::Tensor& x, int64_t ms) {
  std::this_thread::sleep_for(std::chrono::milliseconds(ms));
  TORCH_CHECK(false, "injected failure after ", ms, " ms");
  return x;
}
at::Tensor failIfNegative(const at::Tensor& x) {
  TORCH_CHECK(x.sum().item<float>() >= 0, "injected failure: negative sum");
  return x.clone();
}
int64_t numThreads(const at::Tensor&) { return at::get_num_threads(); }

TORCH_LIBRARY(modelpar_test, m) {
  m.def("sleep_ms(Tensor x, int ms) -> Tensor", &sleepMs);
  m.def("fail_after_ms(Tensor x, int ms) -> Tensor", &failAfterMs);
  m.def("fail_if_negative(Tensor x) -> Tensor", &failIfNegative);
  m.def("num_threads(Tensor x) -> int", &numThreads);
}

}  // namespace

namespace modelpar::runtime {
namespace {

using c10::IValue;

using modelpar::testing::messageOf;

using modelpar::testing::readFile;

void expectSame(const std::vector<IValue>& a, const std::vector<IValue>& b) {
  ASSERT_EQ(a.size(), b.size());
  for (size_t i = 0; i < a.size(); ++i) {
    EXPECT_TRUE(at::equal(a[i].toTensor(), b[i].toTensor())) << "output " << i;
  }
}

std::vector<IValue> mlpInputs() {
  return {at::randn({8, 16}), at::randn({8, 4}), at::randn({16, 32}), at::randn({32, 4})};
}

// The hand-written 2-device pipeline (2 micro-batches, forward, backward,
// update) on 2 CPU workers gives bit for bit what the reference gives.
TEST(Executor, MlpPipelineOnTwoWorkersEqualsReferenceInterpreter) {
  ir::Program p = ir::parseProgram(readFile(MODELPAR_SOURCE_DIR "/examples/ir/mlp_pipeline_2dev.txt"));
  std::vector<IValue> in = mlpInputs();
  std::vector<IValue> want = ProgramInterpreter(p).run(in);
  Executor ex(p, DeviceMap::cpuWorkers(2, 1));
  expectSame(ex.run(in), want);
}

// A chain of `stages * layers` linear+relu layers, stage s on device s,
// pipelined fill-drain (GPipe) over `mbs` micro-batches:
//
//   device 0: split x -> [mb0: L L] send, [mb1: L L] send, ...
//   device 1:        recv [mb0: L L] send, recv [mb1: L L] send, ...
//   ...
//   device S-1:      recv [mb0: L L] -> %y_0, ...
std::string pipelinedChain(int stages, int layers, int mbs) {
  std::string text = c10::str("program devices=", stages, "\ngraph @chain(%x: f32[", 4 * mbs,
                              ", 16] input {device=0}");
  for (int s = 0; s < stages; ++s) {
    for (int l = 0; l < layers; ++l) text += c10::str(", %w", s, "_", l, ": f32[16, 16] param {device=", s, "}");
  }
  text += ") {\n  ";
  for (int m = 0; m < mbs; ++m) text += c10::str(m ? ", " : "", "%a0_0_", m, ": f32[4, 16]");
  text += c10::str(" = aten::split.Tensor(%x, 4) {device=0}\n");
  std::vector<std::string> dev(static_cast<size_t>(stages));
  dev[0] += "  run %a0_0_0\n";
  std::string outputs;
  for (int m = 0; m < mbs; ++m) {
    for (int s = 0; s < stages; ++s) {
      std::string& d = dev[static_cast<size_t>(s)];
      std::string in = c10::str("%a", s, "_0_", m);
      if (s > 0) d += c10::str("  recv ", in, " <- ", s - 1, "\n");
      for (int l = 0; l < layers; ++l) {
        const std::string h = c10::str("%h", s, "_", l, "_", m);
        const std::string out = l + 1 < layers ? c10::str("%a", s, "_", l + 1, "_", m)
                                : s + 1 < stages ? c10::str("%a", s + 1, "_0_", m)
                                                 : c10::str("%y_", m);
        text += c10::str("  ", h, ": f32[4, 16] = aten::mm(", in, ", %w", s, "_", l, ") {device=", s, "}\n");
        text += c10::str("  ", out, ": f32[4, 16] = aten::relu(", h, ") {device=", s, "}\n");
        d += c10::str("  run ", h, "\n  run ", out, "\n  free ", h, "\n  free ", in, "\n");
        in = out;
      }
      if (s + 1 < stages) d += c10::str("  send ", in, " -> ", s + 1, "\n  free ", in, "\n");
      else outputs += c10::str(outputs.empty() ? "" : ", ", in);
    }
  }
  text += "  return " + outputs + "\n}\n";
  for (int s = 0; s < stages; ++s) text += c10::str("device ", s, " {\n", dev[static_cast<size_t>(s)], "}\n");
  return text;
}

std::vector<IValue> chainInputs(int stages, int layers, int mbs) {
  std::vector<IValue> in{at::randn({4 * mbs, 16})};
  for (int i = 0; i < stages * layers; ++i) in.emplace_back(at::randn({16, 16}).mul(0.3));
  return in;
}

TEST(Executor, FourDevicePipelinedChainEqualsReferenceAndEager) {
  ir::Program p = ir::parseProgram(pipelinedChain(4, 2, 3));
  ASSERT_NO_THROW(ir::verify(p));
  std::vector<IValue> in = chainInputs(4, 2, 3);
  Executor ex(p, DeviceMap::cpuWorkers(4, 1));
  std::vector<IValue> out = ex.run(in);
  expectSame(out, ProgramInterpreter(p).run(in));
  for (int m = 0; m < 3; ++m) {
    at::Tensor a = in[0].toTensor().narrow(0, 4 * m, 4);
    for (int i = 0; i < 8; ++i) a = at::relu(at::mm(a, in[static_cast<size_t>(i + 1)].toTensor()));
    EXPECT_TRUE(at::allclose(out[static_cast<size_t>(m)].toTensor(), a)) << "micro-batch " << m;
  }
}

TEST(Executor, RepeatedStepsAreDeterministic) {
  ir::Program p = ir::parseProgram(pipelinedChain(4, 2, 4));
  std::vector<IValue> in = chainInputs(4, 2, 4);
  Executor ex(p, DeviceMap::cpuWorkers(4, 1));
  std::vector<IValue> first = ex.run(in);
  for (int k = 0; k < 10; ++k) expectSame(ex.run(in), first);
}

// Note [Reproducible random ops over workers]: two dropouts on two workers
// that may run in either order draw what their step and node decide, not
// what the other left in the shared generator. Sleeps before them make each
// run first in turn: the outputs are the same both ways (they differed: the
// first to run took the generator's first numbers), the same again after
// manual_seed, and the next step draws other masks.
TEST(Executor, RandomOpsDrawTheSameWhicheverWorkerRunsFirst) {
  auto program = [](int sleep0, int sleep1) {
    return ir::parseProgram(c10::str(R"(
      program devices=2
      graph @g(%x: f32[4096] input {device=0}, %y: f32[4096] input {device=1}) {
        %sx: f32[4096] = modelpar_test::sleep_ms(%x, )", sleep0, R"() {device=0}
        %a: f32[4096], %ma: bool[4096] = aten::native_dropout(%sx, 0.5, true) {device=0}
        %sy: f32[4096] = modelpar_test::sleep_ms(%y, )", sleep1, R"() {device=1}
        %b: f32[4096], %mb: bool[4096] = aten::native_dropout(%sy, 0.5, true) {device=1}
        return %a, %b
      }
      device 0 { run %sx
        run %a }
      device 1 { run %sy
        run %b }
    )"));
  };
  const std::vector<IValue> in{at::ones({4096}), at::ones({4096})};
  Executor first0(program(0, 40), DeviceMap::cpuWorkers(2, 1));
  Executor first1(program(40, 0), DeviceMap::cpuWorkers(2, 1));
  at::manual_seed(0);
  std::vector<IValue> a = first0.run(in);
  std::vector<IValue> a_next = first0.run(in);
  at::manual_seed(0);
  std::vector<IValue> b = first1.run(in);
  expectSame(a, b);
  at::manual_seed(0);
  expectSame(first0.run(in), a);
  EXPECT_FALSE(at::equal(a_next[0].toTensor(), a[0].toTensor()));
  // Each dropout draws its own mask: the two devices' differ.
  EXPECT_FALSE(at::equal(a[0].toTensor(), a[1].toTensor()));
}

// Two devices with nothing to exchange: each sleeps 150 ms. The measured
// spans must overlap in time (what concurrency means), whatever the speed.
TEST(Executor, IndependentDevicesOverlapInTime) {
  ir::Program p = ir::parseProgram(R"(
    program devices=2
    graph @two(%x: f32[4] input {device=0}, %y: f32[4] input {device=1}) {
      %a: f32[4] = modelpar_test::sleep_ms(%x, 150) {device=0}
      %b: f32[4] = modelpar_test::sleep_ms(%y, 150) {device=1}
      return %a, %b
    }
    device 0 { run %a }
    device 1 { run %b }
  )");
  Executor ex(p, DeviceMap::cpuWorkers(2, 1), ExecutorOptions{.record_trace = true});
  ex.run({at::randn({4}), at::randn({4})});
  const ExecutionTrace& t = ex.lastTrace();
  const Span a = t.host[0][0], b = t.host[1][0];
  EXPECT_GE(a.end_ns - a.start_ns, 140'000'000);
  EXPECT_LT(a.start_ns, b.end_ns);
  EXPECT_LT(b.start_ns, a.end_ns);
}

// The sender goes on computing while its transfer is in flight, and the
// trace shows runs, transfers and receive waits on their tracks.
TEST(Executor, TraceHasComputeSendAndRecvTracks) {
  ir::Program p = ir::parseProgram(readFile(MODELPAR_SOURCE_DIR "/examples/ir/mlp_pipeline_2dev.txt"));
  Executor ex(p, DeviceMap::cpuWorkers(2, 1), ExecutorOptions{.record_trace = true});
  ex.run(mlpInputs());
  const ExecutionTrace& t = ex.lastTrace();
  ASSERT_EQ(t.host.size(), 2u);
  for (int d = 0; d < 2; ++d) {
    const auto& sched = p.schedule(d);
    for (size_t i = 0; i < sched.size(); ++i) {
      const Span s = sched[i].kind == ir::Instruction::Kind::Send ? t.transfer[static_cast<size_t>(d)][i]
                                                                  : t.host[static_cast<size_t>(d)][i];
      EXPECT_LE(s.start_ns, s.end_ns);
      EXPECT_LE(s.end_ns, t.step_ns);
      if (sched[i].kind != ir::Instruction::Kind::Free) EXPECT_GT(s.end_ns, 0) << d << ":" << i;
    }
  }
  const std::string json = toChromeTrace(p, t);
  EXPECT_HAS(json, R"("traceEvents")");
  EXPECT_HAS(json, R"x("name":"device 1 (measured)")x");
  EXPECT_HAS(json, R"("name":"send %a_0 -> 1","cat":"send")");
  EXPECT_HAS(json, R"("name":"recv %da_1 <- 1","cat":"recv")");
  EXPECT_HAS(json, R"("name":"aten::mse_loss","cat":"run")");
}

TEST(Executor, TraceWithoutRecordingIsAConfigError) {
  ir::Program p = ir::parseProgram(pipelinedChain(2, 1, 1));
  Executor ex(p, DeviceMap::cpuWorkers(2, 1));
  ex.run(chainInputs(2, 1, 1));
  EXPECT_TRUE(ex.lastTrace().empty());
  EXPECT_HAS(messageOf<ConfigError>([&] { toChromeTrace(p, ex.lastTrace()); }), "record_trace");
}

//   device 0: (nothing)
//   device 1: %w = relu(%y), %z = relu(%x), %f = fail(%z)   <- fails at instruction 2
TEST(Executor, FailingOpIsReportedWithDeviceAndInstruction) {
  ir::Program p = ir::parseProgram(R"(
    program devices=2
    graph @g(%x: f32[4] input {device=1}, %y: f32[4] input {device=1}) {
      %w: f32[4] = aten::relu(%y) {device=1}
      %z: f32[4] = aten::relu(%x) {device=1}
      %f: f32[4] = modelpar_test::fail_after_ms(%z, 0) {device=1}
      return %w, %f
    }
    device 0 { }
    device 1 {
      run %w
      run %z
      run %f
    }
  )");
  Executor ex(p, DeviceMap::cpuWorkers(2, 1));
  try {
    ex.run({at::randn({4}), at::randn({4})});
    ADD_FAILURE() << "did not throw";
  } catch (const InstructionError& e) {
    EXPECT_EQ(e.device(), 1);
    EXPECT_EQ(e.instruction(), 2u);
    EXPECT_HAS(std::string(e.what()),
               "device 1, instruction 2 (run %f, modelpar_test::fail_after_ms): ");
    EXPECT_HAS(std::string(e.what()), "injected failure after 0 ms");
  }
}

// Device 1 blocks in a recv whose send comes after device 0's failing op;
// device 2 blocks on device 1. The failure must wake both, not hang.
TEST(Executor, FailureWakesPeersBlockedInRecv) {
  ir::Program p = ir::parseProgram(R"(
    program devices=3
    graph @g(%x: f32[4] input {device=0}) {
      %a: f32[4] = modelpar_test::fail_after_ms(%x, 100) {device=0}
      %b: f32[4] = aten::relu(%a) {device=1}
      %c: f32[4] = aten::relu(%b) {device=2}
      return %c
    }
    device 0 {
      run %a
      send %a -> 1
    }
    device 1 {
      recv %a <- 0
      run %b
      send %b -> 2
    }
    device 2 {
      recv %b <- 1
      run %c
    }
  )");
  Executor ex(p, DeviceMap::cpuWorkers(3, 1));
  const auto start = std::chrono::steady_clock::now();
  const std::string msg = messageOf<InstructionError>([&] { ex.run({at::randn({4})}); });
  EXPECT_HAS(msg, "device 0, instruction 0 (run %a, modelpar_test::fail_after_ms)");
  EXPECT_LT(std::chrono::steady_clock::now() - start, std::chrono::seconds(10));
}

// A failure in one step leaves the executor ready for the next.
TEST(Executor, StepAfterAFailedStepSucceeds) {
  ir::Program p = ir::parseProgram(R"(
    program devices=2
    graph @g(%x: f32[4] input {device=0}) {
      %a: f32[4] = modelpar_test::fail_if_negative(%x) {device=0}
      %b: f32[4] = aten::relu(%a) {device=1}
      return %b
    }
    device 0 {
      run %a
      send %a -> 1
    }
    device 1 {
      recv %a <- 0
      run %b
    }
  )");
  Executor ex(p, DeviceMap::cpuWorkers(2, 1));
  at::Tensor x = at::randn({4}).abs();
  std::vector<IValue> first = ex.run({x});
  EXPECT_HAS(messageOf<InstructionError>([&] { ex.run({-x}); }), "negative sum");
  expectSame(ex.run({x}), first);
}

// Device 0 zeroes %h in place right after sending it; the fence before a
// writing op keeps the (large, slow) copy from seeing the zeros.
TEST(Executor, InPlaceOpAfterSendWaitsForTheCopy) {
  ir::Program p = ir::parseProgram(R"(
    program devices=2
    graph @g(%x: f32[2048, 1024] input {device=0}) {
      %h: f32[2048, 1024] = aten::relu(%x) {device=0}
      %z: f32[2048, 1024] = aten::zero_(%h) {device=0}
      %y: f32[2048, 1024] = aten::neg(%h) {device=1}
      return %y, %z
    }
    device 0 {
      run %h
      send %h -> 1
      run %z
    }
    device 1 {
      recv %h <- 0
      run %y
    }
  )");
  at::Tensor x = at::randn({2048, 1024});
  Executor ex(p, DeviceMap::cpuWorkers(2, 1));
  for (int k = 0; k < 3; ++k) {
    std::vector<IValue> out = ex.run({x});
    EXPECT_TRUE(at::equal(out[0].toTensor(), -at::relu(x)));
    EXPECT_EQ(out[1].toTensor().abs().sum().item<float>(), 0.0f);
  }
}

TEST(Executor, DeadlockAtRunTimeIsReportedNotHung) {
  ir::Program p = ir::parseProgram(readFile(MODELPAR_SOURCE_DIR "/examples/ir/mlp_pipeline_2dev_deadlock.txt"));
  Executor ex(p, DeviceMap::cpuWorkers(2, 1), ExecutorOptions{.verify = false});
  const std::string msg = messageOf<ExecutionError>([&] { ex.run(mlpInputs()); });
  EXPECT_HAS(msg, "deadlock at run time: device 0 waits at instruction");
  EXPECT_HAS(msg, "device 1 waits at instruction");
}

TEST(Executor, UnmatchedRecvIsADeadlock) {
  ir::Program p = ir::parseProgram(readFile(MODELPAR_SOURCE_DIR "/examples/ir/mlp_pipeline_2dev_missing_send.txt"));
  Executor ex(p, DeviceMap::cpuWorkers(2, 1), ExecutorOptions{.verify = false});
  EXPECT_HAS(messageOf<ExecutionError>([&] { ex.run(mlpInputs()); }), "deadlock at run time");
}

TEST(Executor, SendOfValueNotOnDeviceIsReported) {
  ir::Program p = ir::parseProgram(R"(
    program devices=2
    graph @g(%x: f32[4] input {device=0}) {
      %h: f32[4] = aten::relu(%x) {device=0}
      return %h
    }
    device 0 {
      send %h -> 1
      run %h
    }
    device 1 { recv %h <- 0 }
  )");
  Executor ex(p, DeviceMap::cpuWorkers(2, 1), ExecutorOptions{.verify = false});
  EXPECT_HAS(messageOf<InstructionError>([&] { ex.run({at::randn({4})}); }),
             "device 0, instruction 0 (send %h -> 1): %h is not on device 0");
}

TEST(Executor, FreeOfValueNotOnDeviceIsReported) {
  ir::Program p = ir::parseProgram(R"(
    program devices=2
    graph @g(%x: f32[4] input {device=0}) {
      %h: f32[4] = aten::relu(%x) {device=0}
      return %h
    }
    device 0 { run %h }
    device 1 { free %h }
  )");
  Executor ex(p, DeviceMap::cpuWorkers(2, 1), ExecutorOptions{.verify = false});
  EXPECT_HAS(messageOf<InstructionError>([&] { ex.run({at::randn({4})}); }),
             "device 1, instruction 0 (free %h): %h is not on device 1");
}

// Even unverified, a program may send a (value, from, to) only once: the
// executor has one mailbox slot per send.
TEST(Executor, SendingTheSameValueTwiceToOnePeerIsRejected) {
  ir::Program p = ir::parseProgram(R"(
    program devices=2
    graph @g(%x: f32[4] input {device=0}) {
      %h: f32[4] = aten::relu(%x) {device=0}
      return %h
    }
    device 0 {
      run %h
      send %h -> 1
      send %h -> 1
    }
    device 1 {
      recv %h <- 0
    }
  )");
  EXPECT_HAS(messageOf<InvalidIrError>([&] {
               Executor(p, DeviceMap::cpuWorkers(2, 1), ExecutorOptions{.verify = false});
             }),
             "device 0, instruction 2 (send %h -> 1): %h is sent from device 0 to device 1 twice");
}

TEST(Executor, BadInputIsRejectedBeforeRunning) {
  ir::Program p = ir::parseProgram(pipelinedChain(2, 1, 1));
  Executor ex(p, DeviceMap::cpuWorkers(2, 1));
  std::vector<IValue> in = chainInputs(2, 1, 1);
  in[0] = at::randn({5, 16});  // f32[4, 16] declared
  EXPECT_HAS(messageOf<ExecutionError>([&] { ex.run(in); }), "f32[4, 16]");
}

TEST(Executor, DeviceMapMustFitTheProgram) {
  ir::Program p = ir::parseProgram(pipelinedChain(2, 1, 1));
  EXPECT_HAS(messageOf<ConfigError>([&] { Executor(p, DeviceMap::cpuWorkers(3)); }),
             "the program has 2 devices but the device map 3 cpu-workers");
}

// Threads of this process, as the kernel counts them (Linux), once the count
// stops changing: a joined thread can linger in /proc for a moment.
int osThreads() {
  auto count = [] {
    int n = 0;
    for (const auto& e : std::filesystem::directory_iterator("/proc/self/task")) n += e.exists();
    return n;
  };
  int n = count();
  for (int i = 0; i < 200; ++i) {
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
    const int m = count();
    if (m == n) return n;
    n = m;
  }
  return n;
}

// Thread creation failing half-way through the constructor: the threads
// already started (copy streams, then workers) are stopped and joined, and
// the failure is a typed ExecutionError naming the thread. pipelinedChain(4,
// ...) starts 3 copy streams (resolve) and then 4 workers: starts 1..3 fail
// among the copy streams, 4..7 among the workers.
TEST(Executor, ThreadStartFailingHalfWayLeaksNoThreadAndIsAnExecutionError) {
  ir::Program p = ir::parseProgram(pipelinedChain(4, 1, 1));
  std::vector<IValue> in = chainInputs(4, 1, 1);
  { Executor warm(p, DeviceMap::cpuWorkers(4, 1)); warm.run(in); }  // lazy ATen / OpenMP state
  const int live = liveThreads();
  const int os = osThreads();
  for (int k = 1; k <= 7; ++k) {
    failThreadStartForTesting(k);
    const std::string m = messageOf<ExecutionError>([&] { Executor(p, DeviceMap::cpuWorkers(4, 1)); });
    failThreadStartForTesting(0);
    EXPECT_HAS(m, "modelpar: cannot start the thread of ");
    EXPECT_HAS(m, "Resource temporarily unavailable");
    if (k <= 3) {
      EXPECT_HAS(m, c10::str("logical device ", k - 1, " (cpu worker) copy stream tx->", k));
    } else {
      EXPECT_HAS(m, c10::str("modelpar executor: started ", k - 4, " of 4 workers of 4 cpu-workers"));
      EXPECT_HAS(m, c10::str("the executor worker of logical device ", k - 4, " (cpu worker)"));
      EXPECT_HAS(m, "(the started workers were stopped and joined)");
    }
    EXPECT_EQ(liveThreads(), live) << "start " << k << " failed: " << m;
    EXPECT_EQ(osThreads(), os) << "start " << k << " failed: " << m;
  }
  // Disarmed, the same program builds and runs.
  Executor ex(p, DeviceMap::cpuWorkers(4, 1));
  expectSame(ex.run(in), ProgramInterpreter(p).run(in));
  EXPECT_EQ(liveThreads(), live + 7);
}

TEST(DeviceMap, ParsesSpecs) {
  EXPECT_EQ(DeviceMap::parse("cpu-workers", 3).devices.size(), 3u);
  EXPECT_EQ(DeviceMap::parse("cuda", 2).devices[1], c10::Device("cuda:1"));
  EXPECT_EQ(DeviceMap::parse("cuda:0", 3).devices[2], c10::Device("cuda:0"));
  EXPECT_EQ(DeviceMap::parse("cuda:0, cuda:1", 2).toString(), "cuda:0,cuda:1");
  EXPECT_HAS(messageOf<ConfigError>([] { DeviceMap::parse("cuda:0,cuda:1", 3); }),
             "names 2 devices but the program has 3");
  EXPECT_HAS(messageOf<ConfigError>([] { DeviceMap::parse("gpu", 2); }), "'gpu' is not a device");
}

TEST(DeviceMap, CudaMapWithoutCudaIsAConfigError) {
  if (cudaDevicesBuilt()) GTEST_SKIP() << "this build has CUDA devices";
  EXPECT_HAS(messageOf<ConfigError>([] { createDevices(DeviceMap::parse("cuda:0", 2)); }),
             "no CUDA support");
}

TEST(Executor, WorkersUseTheirIntraOpThreadCountAndLeaveTheCallersAlone) {
  ir::Program p = ir::parseProgram(R"(
    program devices=2
    graph @g(%x: f32[4] input {device=0}, %y: f32[4] input {device=1}) {
      %n: int = modelpar_test::num_threads(%x) {device=0}
      %m: int = modelpar_test::num_threads(%y) {device=1}
      return %n, %m
    }
    device 0 { run %n }
    device 1 { run %m }
  )");
  const int caller = at::get_num_threads();
  for (int k : {1, 2, 3}) {
    Executor ex(p, DeviceMap::cpuWorkers(2, k));
    std::vector<IValue> out = ex.run({at::randn({4}), at::randn({4})});
    EXPECT_EQ(out[0].toInt(), k);
    EXPECT_EQ(out[1].toInt(), k);
    EXPECT_EQ(at::get_num_threads(), caller);
  }
}

// The caller's grad mode applies on the workers, as it would on its thread.
TEST(Executor, CallersGradModeAppliesOnWorkers) {
  ir::Program p = ir::parseProgram(pipelinedChain(2, 1, 1));
  std::vector<IValue> in = chainInputs(2, 1, 1);
  in[1].toTensor().requires_grad_();
  Executor ex(p, DeviceMap::cpuWorkers(2, 1));
  {
    c10::AutoGradMode no_grad(false);
    EXPECT_FALSE(ex.run(in)[0].toTensor().requires_grad());
  }
  EXPECT_TRUE(ex.run(in)[0].toTensor().requires_grad());
}

}  // namespace
}  // namespace modelpar::runtime
