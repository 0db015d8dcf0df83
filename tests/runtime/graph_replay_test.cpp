// Graph replay without a GPU: the graph segments and their launch order, the
// capturability analysis (asked with CUDA device maps, which need no GPU), the
// inputs a step writes in place, and the Executor's Replay::Graphs twin on CPU
// workers (static buffers, copy in, copy back, clone out) against Streams.
#include <gtest/gtest.h>

#include <ATen/core/Tensor.h>
#include <ATen/ops/equal.h>
#include <ATen/ops/randn.h>
#include <ATen/ops/zeros.h>
#include <ATen/ops/add.h>
#include <ATen/ops/mul.h>

#include <fstream>
#include <map>
#include <sstream>
#include <string>
#include <tuple>

#include "ir/error.h"
#include "ir/parser.h"
#include "runtime/capture_check.h"
#include "runtime/executor.h"
#include "runtime/graph_segments.h"
#include "tests/support/expect_error.h"
#include "tests/support/read_file.h"

namespace modelpar::runtime {
namespace {

using c10::IValue;
using modelpar::testing::messageOf;

using modelpar::testing::readFile;

ir::Program mlpPipeline() {
  return ir::parseProgram(readFile(MODELPAR_SOURCE_DIR "/examples/ir/mlp_pipeline_2dev.txt"));
}

// Every device's segments cover its list in order, and every recv's segment
// comes after the segment of its send in the launch order.
void expectValidLaunchOrder(const ir::Program& p, const std::vector<GraphSegment>& order) {
  std::map<std::tuple<ir::ValueId, int, int>, size_t> send_at;
  std::vector<size_t> covered(static_cast<size_t>(p.numDevices()), 0);
  for (size_t k = 0; k < order.size(); ++k) {
    const GraphSegment& s = order[k];
    EXPECT_EQ(s.begin, covered[static_cast<size_t>(s.device)]) << toString(order);
    EXPECT_LT(s.begin, s.end);
    covered[static_cast<size_t>(s.device)] = s.end;
    for (size_t i = s.begin; i < s.end; ++i) {
      const ir::Instruction& inst = p.schedule(s.device)[i];
      if (inst.kind == ir::Instruction::Kind::Send) send_at[{inst.value, s.device, inst.peer}] = k;
      if (inst.kind == ir::Instruction::Kind::Recv) {
        auto it = send_at.find({inst.value, inst.peer, s.device});
        ASSERT_NE(it, send_at.end()) << "recv at " << s.device << ":" << i << " before its send; "
                                     << toString(order);
        EXPECT_LT(it->second, k) << "a recv shares its send's segment: " << toString(order);
      }
    }
  }
  for (int d = 0; d < p.numDevices(); ++d) EXPECT_EQ(covered[static_cast<size_t>(d)], p.schedule(d).size());
}

// mlp_pipeline_2dev.txt: device 0 sends a_0, a_1 (instructions 3, 6) and
// receives da_0, da_1 (9, 15); device 1 receives a_0, a_1 (2, 9) and sends
// da_0, da_1. Cut before recvs: 0 = [0,9) [9,15) [15,21), 1 = [0,2) [2,9)
// [9,26). [0,9) and [9,15) stay apart (the path 0:[0,9) -> 1 -> 0:[9,15));
// everything else merges, so device 1 is one graph between device 0's two.
TEST(GraphSegments, ForwardBackwardPipelineSplitsTheSenderAroundThePeer) {
  ir::Program p = mlpPipeline();
  std::vector<GraphSegment> order = graphSegments(p);
  EXPECT_EQ(toString(order), "[0:0..9) [1:0..26) [0:9..21)");
  expectValidLaunchOrder(p, order);
}

TEST(GraphSegments, ForwardOnlyPipelineIsOneSegmentPerDevice) {
  ir::Program p = ir::parseProgram(R"(
    program devices=3
    graph @g(%x: f32[4] input {device=0}) {
      %a: f32[4] = aten::relu(%x) {device=0}
      %b: f32[4] = aten::neg(%a) {device=1}
      %c: f32[4] = aten::neg(%b) {device=2}
      %d: f32[4] = aten::relu(%a) {device=0}
      return %c, %d
    }
    device 0 {
      run %a
      send %a -> 1
      run %d
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
  EXPECT_EQ(toString(graphSegments(p)), "[0:0..3) [1:0..3) [2:0..2)");
}

// A ring 0 -> 1 -> 2 -> 0 and then 0 -> 1 again: neither device 0 nor device 1
// can be one graph (each is split around the ring), device 2 is one.
TEST(GraphSegments, RingSplitsEveryDeviceTheRingReturnsTo) {
  ir::Program p = ir::parseProgram(R"(
    program devices=3
    graph @g(%x: f32[4] input {device=0}) {
      %a: f32[4] = aten::relu(%x) {device=0}
      %b: f32[4] = aten::neg(%a) {device=1}
      %c: f32[4] = aten::neg(%b) {device=2}
      %d: f32[4] = aten::add.Tensor(%a, %c) {device=0}
      %e: f32[4] = aten::add.Tensor(%b, %d) {device=1}
      return %e
    }
    device 0 {
      run %a
      send %a -> 1
      recv %c <- 2
      run %d
      send %d -> 1
    }
    device 1 {
      recv %a <- 0
      run %b
      send %b -> 2
      recv %d <- 0
      run %e
    }
    device 2 {
      recv %b <- 1
      run %c
      send %c -> 0
    }
  )");
  std::vector<GraphSegment> order = graphSegments(p);
  EXPECT_EQ(toString(order), "[0:0..2) [1:0..3) [2:0..3) [0:2..5) [1:3..5)");
  expectValidLaunchOrder(p, order);
}

TEST(GraphSegments, CycleOfRecvsIsRejected) {
  ir::Program p = ir::parseProgram(R"(
    program devices=2
    graph @g(%x: f32[4] input {device=0}, %y: f32[4] input {device=1}) {
      %a: f32[4] = aten::relu(%x) {device=0}
      %b: f32[4] = aten::relu(%y) {device=1}
      return %a, %b
    }
    device 0 {
      recv %b <- 1
      run %a
      send %a -> 1
    }
    device 1 {
      recv %a <- 0
      run %b
      send %b -> 0
    }
  )");
  std::string msg = messageOf<InvalidIrError>([&] { graphSegments(p); });
  EXPECT_HAS(msg, "cycle");
}

// --- capturability ---------------------------------------------------------

ir::Program oneOp(const std::string& body, const std::string& ret, const std::string& inputs =
                                                                      "%x: f32[8] input") {
  return ir::parseProgram("program devices=1\ngraph @g(" + inputs + ") {\n" + body + "\n  return %" +
                          ret + "\n}\ndevice 0 {\n  run %" + ret + "\n}\n");
}

TEST(CaptureCheck, MlpPipelineOnOneGpuIsCapturable) {
  EXPECT_TRUE(captureIssues(mlpPipeline(), DeviceMap::parse("cuda:0", 2)).empty())
      << describe(captureIssues(mlpPipeline(), DeviceMap::parse("cuda:0", 2)));
}

TEST(CaptureCheck, CpuWorkersAreNotCapturedAndSaySo) {
  std::vector<CaptureIssue> issues = captureIssues(mlpPipeline(), DeviceMap::cpuWorkers(2, 1));
  ASSERT_EQ(issues.size(), 1u);
  EXPECT_EQ(issues[0].device, -1);
  EXPECT_HAS(issues[0].what, "CPU worker devices run the stream path");
}

TEST(CaptureCheck, NonzeroHasADataDependentShape) {
  ir::Program p = oneOp("  %n: i64[N, 1] = aten::nonzero(%x)", "n");
  std::vector<CaptureIssue> issues = captureIssues(p, DeviceMap::parse("cuda:0", 1));
  ASSERT_GE(issues.size(), 1u);
  EXPECT_EQ(issues[0].device, 0);
  EXPECT_EQ(issues[0].instruction, 0);
  EXPECT_HAS(issues[0].what, "device 0, instruction 0 (run %n, aten::nonzero)");
  EXPECT_HAS(issues[0].what, "dynamic_output_shape");
}

TEST(CaptureCheck, LocalScalarDenseSynchronisesWithTheHost) {
  ir::Program p = oneOp("  %s: float = aten::_local_scalar_dense(%x)", "s", "%x: f32[] input");
  std::vector<CaptureIssue> issues = captureIssues(p, DeviceMap::parse("cuda:0", 1));
  ASSERT_EQ(issues.size(), 1u);
  EXPECT_HAS(issues[0].what, "aten::_local_scalar_dense");
  EXPECT_HAS(issues[0].what, "data_dependent_output");
}

// Ops whose CUDA kernels call .item() without PyTorch's data_dependent_output
// tag: refused up front, not discovered by a failing capture.
TEST(CaptureCheck, UntaggedHostSyncsAreReported) {
  for (const char* body : {"  %e: bool = aten::equal(%x, %x)",
                           "  %e: f32[4] = aten::histc(%x, 4, 0.0, 0.0)"}) {
    ir::Program p = oneOp(body, "e");
    std::vector<CaptureIssue> issues = captureIssues(p, DeviceMap::parse("cuda:0", 1));
    ASSERT_EQ(issues.size(), 1u) << body;
    EXPECT_HAS(issues[0].what, "reads device data on the host");
  }
}

TEST(CaptureCheck, BoolMaskIndexIsDataDependentButIntegerIndexIsNot) {
  ir::Program mask = oneOp("  %y: f32[M] = aten::index.Tensor(%x, [%m])", "y",
                           "%x: f32[8] input, %m: bool[8] input");
  std::vector<CaptureIssue> issues = captureIssues(mask, DeviceMap::parse("cuda:0", 1));
  bool found = false;
  for (const CaptureIssue& i : issues) found = found || i.what.find("bool mask") != std::string::npos;
  EXPECT_TRUE(found) << describe(issues, 10);
  ir::Program gather = oneOp("  %y: f32[3] = aten::index.Tensor(%x, [%i])", "y",
                             "%x: f32[8] input, %i: i64[3] input");
  EXPECT_TRUE(captureIssues(gather, DeviceMap::parse("cuda:0", 1)).empty())
      << describe(captureIssues(gather, DeviceMap::parse("cuda:0", 1)));
}

// A device("cpu") constant is no issue: on a GPU the executor makes the
// tensor on the node's device (Note [Factory ops follow their device]).
TEST(CaptureCheck, SymbolicShapesAreReportedAndCpuFactoriesAreNot) {
  ir::Program p = ir::parseProgram(R"(
    program devices=1
    graph @g(%x: f32[B, 4] input) {
      %z: f32[4] = aten::zeros([4], device=device("cpu"))
      %y: f32[B, 4] = aten::add.Tensor(%x, %z)
      return %y
    }
    device 0 {
      run %z
      run %y
    }
  )");
  std::vector<CaptureIssue> issues = captureIssues(p, DeviceMap::parse("cuda:0", 1));
  ASSERT_EQ(issues.size(), 2u) << describe(issues, 10);
  EXPECT_HAS(issues[0].what, "input %x has the symbolic shape f32[B, 4]");
  EXPECT_HAS(issues[1].what, "%y has the symbolic shape");
  EXPECT_HAS(describe(issues, 1), "(+1 more)");
}

TEST(CaptureCheck, SendsBetweenGpusAreReported) {
  std::vector<CaptureIssue> issues = captureIssues(mlpPipeline(), DeviceMap::parse("cuda", 2));
  ASSERT_EQ(issues.size(), 4u) << describe(issues, 10);  // a_0, a_1 and da_0, da_1
  EXPECT_HAS(issues[0].what, "device 0, instruction 3 (send %a_0 -> 1)");
  EXPECT_HAS(issues[0].what, "sends from cuda:0 to cuda:1");
}

TEST(CaptureCheck, InputsWrittenInPlaceDirectlyOrThroughAViewAreFound) {
  ir::Program p = ir::parseProgram(R"(
    program devices=1
    graph @g(%x: f32[4] input, %w: f32[2, 4] param, %b: f32[4] param) {
      %v: f32[4] = aten::select.int(%w, 0, 1)
      %v2: f32[4] = aten::mul_.Tensor(%v, %x)
      %y: f32[4] = aten::add.Tensor(%x, %b)
      return %y
    }
    device 0 {
      run %v
      run %v2
      run %y
    }
  )");
  EXPECT_EQ(inputsWrittenInPlace(p), std::vector<size_t>{1});  // %w, through the view %v
  EXPECT_TRUE(inputsWrittenInPlace(mlpPipeline()).empty());
}

// --- the Executor's twin on CPU workers ------------------------------------

std::vector<IValue> mlpInputs() {
  return {at::randn({8, 16}), at::randn({8, 4}), at::randn({16, 32}), at::randn({32, 4})};
}

ExecutorOptions graphs(int warmup = 1) {
  ExecutorOptions o;
  o.replay = Replay::Graphs;
  o.warmup_steps = warmup;
  return o;
}

// New input values every step: a static buffer that is not refreshed, or a
// result computed from the previous step's inputs, shows as a mismatch.
TEST(GraphReplay, CpuTwinEqualsStreamReplayOverStepsWithChangingInputs) {
  ir::Program p = mlpPipeline();
  Executor streams(p, DeviceMap::cpuWorkers(2, 1));
  Executor twin(p, DeviceMap::cpuWorkers(2, 1), graphs(/*warmup=*/2));
  EXPECT_HAS(twin.replayStatus().summary, "warming up (0 of 2");
  for (int step = 0; step < 5; ++step) {
    std::vector<IValue> in = mlpInputs();
    std::vector<IValue> want = streams.run(in);
    std::vector<IValue> got = twin.run(in);
    ASSERT_EQ(got.size(), want.size());
    for (size_t i = 0; i < got.size(); ++i) {
      EXPECT_TRUE(at::equal(got[i].toTensor(), want[i].toTensor())) << "step " << step << " output " << i;
    }
    ReplayStatus st = twin.replayStatus();
    EXPECT_EQ(st.steps, step + 1);
    EXPECT_EQ(st.static_buffers, step >= 2) << step;
    EXPECT_FALSE(st.captured);
  }
  ReplayStatus st = twin.replayStatus();
  EXPECT_EQ(st.requested, Replay::Graphs);
  EXPECT_HAS(st.summary, "graph replay: not captured: CPU worker devices run the stream path");
  EXPECT_HAS(st.summary, "static input buffers on the stream path");
  EXPECT_EQ(streams.replayStatus().summary, "stream replay");
}

// Graph replay runs on static copies; an input the step writes in place (a
// data input, as a static KV cache is: parameters and buffers are read at
// their own addresses instead, tested below) must still change the caller's
// tensor, as it does with stream replay.
TEST(GraphReplay, InputsWrittenInPlaceAreCopiedBackToTheCaller) {
  ir::Program p = ir::parseProgram(R"(
    program devices=2
    graph @g(%x: f32[4] input {device=0}, %w: f32[4] input {device=1}) {
      %h: f32[4] = aten::relu(%x) {device=0}
      %y: f32[4] = aten::mul.Tensor(%h, %w) {device=1}
      %w2: f32[4] = aten::add_.Tensor(%w, %h) {device=1}
      return %y
    }
    device 0 {
      run %h
      send %h -> 1
    }
    device 1 {
      recv %h <- 0
      run %y
      run %w2
    }
  )");
  at::Tensor w_streams = at::randn({4});
  at::Tensor w_twin = w_streams.clone();
  Executor streams(p, DeviceMap::cpuWorkers(2, 1));
  Executor twin(p, DeviceMap::cpuWorkers(2, 1), graphs());
  for (int step = 0; step < 4; ++step) {
    at::Tensor x = at::randn({4});
    std::vector<IValue> want = streams.run({x, w_streams});
    std::vector<IValue> got = twin.run({x, w_twin});
    EXPECT_TRUE(at::equal(got[0].toTensor(), want[0].toTensor())) << step;
    EXPECT_TRUE(at::equal(w_twin, w_streams)) << "step " << step << ": the update was lost";
  }
  EXPECT_EQ(twin.replayStatus().own_address_inputs, 0u);  // %w went through its static copy
}

// Note [Parameters at their own addresses]: a parameter or buffer already on
// its device is its own static buffer: not copied in, not copied back, and
// the caller's updates between steps are what the next step reads. Inputs
// (the batch) still get static copies.
const char* kParamStep = R"(
    program devices=2
    graph @g(%x: f32[4] input {device=0}, %w: f32[4] param {device=1}, %s: f32[4] buffer {device=1}) {
      %h: f32[4] = aten::relu(%x) {device=0}
      %y: f32[4] = aten::mul.Tensor(%h, %w) {device=1}
      %z: f32[4] = aten::add.Tensor(%y, %s) {device=1}
      %s2: f32[4] = aten::add_.Tensor(%s, %h) {device=1}
      return %z
    }
    device 0 {
      run %h
      send %h -> 1
    }
    device 1 {
      recv %h <- 0
      run %y
      run %z
      run %s2
    }
  )";

TEST(GraphReplay, ParametersAndBuffersAreReadAtTheirOwnAddresses) {
  ir::Program p = ir::parseProgram(kParamStep);
  at::Tensor w = at::randn({4}), s = at::randn({4});
  at::Tensor w_ref = w.clone(), s_ref = s.clone();
  Executor streams(p, DeviceMap::cpuWorkers(2, 1));
  Executor twin(p, DeviceMap::cpuWorkers(2, 1), graphs());
  for (int step = 0; step < 5; ++step) {
    at::Tensor x = at::randn({4});
    std::vector<IValue> want = streams.run({x, w_ref, s_ref});
    std::vector<IValue> got = twin.run({x, w, s});
    EXPECT_TRUE(at::equal(got[0].toTensor(), want[0].toTensor())) << step;
    EXPECT_TRUE(at::equal(s, s_ref)) << "step " << step << ": the buffer's in-place write was lost";
    w.mul_(0.5);  // an optimizer's update between steps, in place
    w_ref.mul_(0.5);
  }
  ReplayStatus st = twin.replayStatus();
  EXPECT_EQ(st.own_address_inputs, 2u);  // %w and %s; %x is copied
  EXPECT_EQ(st.recaptures, 0);
  EXPECT_HAS(st.summary, "static input buffers on the stream path, 2 parameters/buffers at their own addresses");
}

// A parameter passed at another address after the capture (`p.data = ...`)
// must not be read at the old one: the capture is dropped and made again,
// once; from then on that input gets a static copy, so moving it every step
// costs no more captures.
TEST(GraphReplay, AParameterThatMovesIsCapturedAgainOnceThenCopied) {
  ir::Program p = ir::parseProgram(kParamStep);
  Executor streams(p, DeviceMap::cpuWorkers(2, 1));
  Executor twin(p, DeviceMap::cpuWorkers(2, 1), graphs());
  at::Tensor s = at::zeros({4}), s_ref = at::zeros({4});
  for (int step = 0; step < 6; ++step) {
    at::Tensor x = at::randn({4});
    at::Tensor w = at::randn({4});  // a new tensor, a new address, every step
    std::vector<IValue> want = streams.run({x, w, s_ref});
    std::vector<IValue> got = twin.run({x, w, s});
    EXPECT_TRUE(at::equal(got[0].toTensor(), want[0].toTensor())) << step;
    ReplayStatus st = twin.replayStatus();
    EXPECT_EQ(st.recaptures, step >= 2 ? 1 : 0) << step;  // step 1 captured; step 2 moved
    EXPECT_EQ(st.own_address_inputs, step >= 2 ? 1u : step == 1 ? 2u : 0u) << step;
  }
  ReplayStatus st = twin.replayStatus();
  EXPECT_EQ(st.last_recapture, "input %w (param) moved to another address after the capture");
  EXPECT_HAS(st.summary, "1 parameters/buffers at their own addresses; re-captured 1 time (input %w (param) moved");
}

// Two parameters viewing one storage would be captured as one address and
// could be passed apart later: both get static copies. So does a parameter
// not on its device (it is copied there every step).
TEST(GraphReplay, ParametersSharingStorageGetStaticCopies) {
  ir::Program p = ir::parseProgram(R"(
    program devices=1
    graph @g(%x: f32[4] input, %a: f32[4] param, %b: f32[4] param) {
      %y: f32[4] = aten::mul.Tensor(%x, %a)
      %z: f32[4] = aten::add.Tensor(%y, %b)
      return %z
    }
    device 0 {
      run %y
      run %z
    }
  )");
  at::Tensor both = at::randn({8});
  at::Tensor a = both.slice(0, 0, 4), b = both.slice(0, 4, 8);
  Executor twin(p, DeviceMap::cpuWorkers(1, 1), graphs());
  for (int step = 0; step < 3; ++step) {
    at::Tensor x = at::randn({4});
    EXPECT_TRUE(at::equal(twin.run({x, a, b})[0].toTensor(), at::add(at::mul(x, a), b))) << step;
  }
  EXPECT_EQ(twin.replayStatus().own_address_inputs, 0u);
  EXPECT_TRUE(twin.replayStatus().static_buffers);
  // Passed apart now: the static copies take each its own values.
  at::Tensor a2 = at::randn({4}), b2 = at::randn({4}), x = at::randn({4});
  EXPECT_TRUE(at::equal(twin.run({x, a2, b2})[0].toTensor(), at::add(at::mul(x, a2), b2)));
  EXPECT_EQ(twin.replayStatus().recaptures, 0);
}

// The outputs are clones: the next step overwrites the static tensors, not
// what an earlier step returned.
TEST(GraphReplay, ReturnedOutputsDoNotAliasStaticBuffers) {
  ir::Program p = ir::parseProgram(R"(
    program devices=1
    graph @g(%x: f32[4] input) {
      %y: f32[4] = aten::relu(%x)
      return %x, %y
    }
    device 0 {
      run %y
    }
  )");
  Executor ex(p, DeviceMap::cpuWorkers(1, 1), graphs());
  ex.run({at::randn({4})});  // warm-up
  at::Tensor x2 = at::randn({4});
  std::vector<IValue> out2 = ex.run({x2});
  ex.run({at::randn({4})});
  EXPECT_TRUE(at::equal(out2[0].toTensor(), x2));
}

TEST(GraphReplay, InputShapeChangeAfterCaptureIsAnErrorNamingTheInput) {
  ir::Program p = ir::parseProgram(R"(
    program devices=1
    graph @g(%x: f32[B, 4] input) {
      %y: f32[B, 4] = aten::relu(%x)
      return %y
    }
    device 0 {
      run %y
    }
  )");
  Executor ex(p, DeviceMap::cpuWorkers(1, 1), graphs());
  ex.run({at::randn({2, 4})});  // warm-up: any B
  ex.run({at::randn({3, 4})});  // capture: B = 3
  ex.run({at::randn({3, 4})});
  std::string msg = messageOf<ExecutionError>([&] { ex.run({at::randn({5, 4})}); });
  EXPECT_HAS(msg, "input %x is Float[5, 4] but was Float[3, 4] at capture");
  // The stream path takes any B, and the executor stays usable.
  EXPECT_EQ(ex.run({at::randn({3, 4})})[0].toTensor().size(0), 3);
  Executor streams(p, DeviceMap::cpuWorkers(1, 1));
  EXPECT_EQ(streams.run({at::randn({5, 4})})[0].toTensor().size(0), 5);
}

TEST(GraphReplay, ZeroWarmupStepsIsAConfigError) {
  std::string msg = messageOf<ConfigError>(
      [&] { Executor ex(mlpPipeline(), DeviceMap::cpuWorkers(2, 1), graphs(/*warmup=*/0)); });
  EXPECT_HAS(msg, "warmup_steps must be >= 1");
}

}  // namespace
}  // namespace modelpar::runtime
