// verify(const Program&): placement, send/recv matching, liveness and deadlock
// (Note [Program semantics] in ir/program_verifier.cpp). Programs are written
// as IR text; ids the parser cannot express are broken through the API.
#include "ir/verifier.h"

#include <initializer_list>
#include <string>
#include <string_view>

#include <fmt/format.h>
#include <gtest/gtest.h>

#include "ir/error.h"
#include "ir/parser.h"

namespace modelpar::ir {
namespace {

// The message of the InvalidIrError that verify(p) throws, or a test failure.
std::string verifyError(const Program& p) {
  try {
    verify(p);
  } catch (const InvalidIrError& e) {
    return e.what();
  }
  ADD_FAILURE() << "expected InvalidIrError";
  return {};
}

std::string verifyError(std::string_view text) { return verifyError(parseProgram(text)); }

void expectContains(const std::string& msg, std::initializer_list<std::string_view> parts) {
  for (std::string_view part : parts) {
    EXPECT_NE(msg.find(part), std::string::npos) << "missing '" << part << "' in: " << msg;
  }
}

// Two stages, no device attributes on nodes, so the tests below can place them:
//
//   device 0: %x -> relu -> %h ---send---> device 1: mm(%h, %w) -> %y
constexpr std::string_view kTwoStage = R"(
program devices=2
graph @pp(%x: f32[4, 8] input {device=0}, %w: f32[8, 8] param {device=1}) {
  %h: f32[4, 8] = aten::relu(%x)
  %y: f32[4, 8] = aten::mm(%h, %w)
  return %y
}
)";
std::string twoStage(std::string_view blocks) {
  return std::string(kTwoStage) + std::string(blocks);
}

constexpr std::string_view kGoodBlocks = R"(
device 0 { run %h  send %h -> 1 }
device 1 { recv %h <- 0  run %y }
)";

// --- programs that verify ---------------------------------------------------

TEST(ProgramVerifier, AcceptsTwoStageProgram) {
  EXPECT_NO_THROW(verify(parseProgram(twoStage(kGoodBlocks))));
}

// GPipe-like forward and backward of two micro-batches over two stages. Time
// runs down; arrows are transfers:
//
//   device 0                 device 1
//   run %h0    ---h0--->     recv %h0
//   run %h1    ---h1--->     run %y0, free %h0
//   (waits)                  recv %h1
//                            run %gh0
//   recv %gh0  <---gh0---    send %gh0
//   run %gx0, free %h0       run %y1, free %h1
//   recv %gh1  <---gh1---    run %gh1, send %gh1
//   run %gx1, free %h1
TEST(ProgramVerifier, AcceptsPipelinedProgramWithTwoMicrobatches) {
  EXPECT_NO_THROW(verify(parseProgram(R"(
program devices=2
graph @pipe(%x0: f32[4, 8] input {device=0}, %x1: f32[4, 8] input {device=0},
            %w: f32[8, 8] param {device=1}) {
  %h0: f32[4, 8] = aten::relu(%x0) {phase=fwd, device=0, mb=0}
  %h1: f32[4, 8] = aten::relu(%x1) {phase=fwd, device=0, mb=1}
  %y0: f32[4, 8] = aten::mm(%h0, %w) {phase=fwd, device=1, mb=0}
  %y1: f32[4, 8] = aten::mm(%h1, %w) {phase=fwd, device=1, mb=1}
  %gh0: f32[4, 8] = aten::mm(%y0, %w) {phase=bwd, device=1, mb=0}
  %gh1: f32[4, 8] = aten::mm(%y1, %w) {phase=bwd, device=1, mb=1}
  %gx0: f32[4, 8] = aten::threshold_backward(%gh0, %h0, 0) {phase=bwd, device=0, mb=0}
  %gx1: f32[4, 8] = aten::threshold_backward(%gh1, %h1, 0) {phase=bwd, device=0, mb=1}
  return %gx0, %gx1
}
device 0 {
  run %h0  send %h0 -> 1
  run %h1  send %h1 -> 1
  recv %gh0 <- 1  run %gx0  free %h0  free %gh0
  recv %gh1 <- 1  run %gx1  free %h1  free %gh1
}
device 1 {
  recv %h0 <- 0  run %y0  free %h0
  recv %h1 <- 0
  run %gh0  send %gh0 -> 0  free %gh0  free %y0
  run %y1  free %h1
  run %gh1  send %gh1 -> 0
}
)")));
}

TEST(ProgramVerifier, AcceptsOneDeviceProgramWithoutInputDevices) {
  EXPECT_NO_THROW(verify(parseProgram(R"(
program devices=1
graph @one(%x: f32[4, 8] input, %w: f32[8, 8] param) {
  %h: f32[4, 8] = aten::relu(%x)
  %y: f32[4, 8] = aten::mm(%h, %w)
  return %y
}
device 0 { run %h  run %y  free %h }
)")));
}

// A chain %v0 -> %v1 -> ... where node k runs on device k % 4, so every
// instruction hands over to the next device: recv the previous value, run,
// free it, send the result on, free the local copy. 4000 nodes, 19996
// instructions; the verifier is linear, so this takes milliseconds.
TEST(ProgramVerifier, AcceptsLongRoundRobinChain) {
  constexpr int kDevices = 4;
  constexpr int kNodes = 4000;
  const Type t = Type::tensor(ScalarType::Float32, std::vector<int64_t>{8});
  Graph g("chain");
  ValueId prev = g.addInput("x", t, InputRole::Input, 0);
  std::vector<ValueId> vals;
  for (int k = 0; k < kNodes; ++k) {
    NodeId n = g.addNode("aten::relu", {Arg::value(prev)}, {{fmt::format("v{}", k), t}});
    g.node(n).device = k % kDevices;
    vals.push_back(prev = g.node(n).outputs[0]);
  }
  g.setOutputs({vals.back()});
  Program p(std::move(g), kDevices);
  for (int k = 0; k < kNodes; ++k) {
    const int d = k % kDevices;
    if (k > 0) p.append(d, Instruction::recv(vals[k - 1], (k - 1) % kDevices));
    p.append(d, Instruction::run(static_cast<NodeId>(k)));
    if (k > 0) p.append(d, Instruction::free(vals[k - 1]));
    if (k + 1 < kNodes) {
      p.append(d, Instruction::send(vals[k], (k + 1) % kDevices));
      p.append(d, Instruction::free(vals[k]));
    }
  }
  size_t total = 0;
  for (int d = 0; d < kDevices; ++d) total += p.schedule(d).size();
  EXPECT_GE(total, 19990u);
  EXPECT_NO_THROW(verify(p));
}

// --- placement --------------------------------------------------------------

TEST(ProgramVerifier, RejectsInputWithoutDeviceInMultiDeviceProgram) {
  expectContains(verifyError(R"(
program devices=2
graph @nodev(%x: f32[4] input) {
  %y: f32[4] = aten::relu(%x)
  return %y
}
device 0 { run %y }
)"), {"modelpar verify: graph @nodev: ",
      "graph input %x has no device; a program with more than one device needs one on every "
      "input"});
}

TEST(ProgramVerifier, RejectsInputDeviceOutOfRange) {
  Program p = parseProgram(twoStage(kGoodBlocks));
  p.graph().inputs()[1].device = 2;
  expectContains(verifyError(p), {"graph input %w has device=2 but the program has 2 devices"});
}

TEST(ProgramVerifier, RejectsNodeDeviceOutOfRange) {
  Program p = parseProgram(twoStage(kGoodBlocks));
  p.graph().node(1).device = 3;
  expectContains(verifyError(p), {"node %y (aten::mm) has device=3 but the program has 2"});
}

TEST(ProgramVerifier, RejectsNodeRunOnOtherDeviceThanItsAttribute) {
  Program p = parseProgram(twoStage(kGoodBlocks));
  p.graph().node(0).device = 1;
  expectContains(verifyError(p), {"node %h (aten::relu) has device=1 but runs on device 0",
                                  "move `run %h` to device 1"});
}

// --- instruction operands ---------------------------------------------------

TEST(ProgramVerifier, RejectsRunOfMissingNode) {
  Program p = parseProgram(twoStage(kGoodBlocks));
  p.append(1, Instruction::run(9));
  expectContains(verifyError(p), {"device 1, instruction 2 (run node id 9): node id 9 does not "
                                  "exist (the graph has 2 nodes)"});
}

TEST(ProgramVerifier, RejectsMissingValueId) {
  Program p = parseProgram(twoStage(kGoodBlocks));
  p.append(0, Instruction::free(17));
  expectContains(verifyError(p), {"device 0, instruction 2 (free value id 17): value id 17 does "
                                  "not exist"});
}

TEST(ProgramVerifier, RejectsPeerOutOfRange) {
  expectContains(verifyError(twoStage(R"(
device 0 { run %h  send %h -> 5 }
device 1 { recv %h <- 0  run %y }
)")), {"device 0, instruction 1 (send %h -> 5): device 5 does not exist (the program has 2 "
       "devices)"});
}

TEST(ProgramVerifier, RejectsSendToItself) {
  expectContains(verifyError(twoStage(R"(
device 0 { run %h  send %h -> 0 }
device 1 { recv %h <- 0  run %y }
)")), {"device 0, instruction 1 (send %h -> 0): a device cannot send to or receive from itself"});
}

// --- every node run exactly once --------------------------------------------

TEST(ProgramVerifier, RejectsNodeNeverRun) {
  expectContains(verifyError(R"(
program devices=1
graph @g(%x: f32[4] input) {
  %y: f32[4] = aten::relu(%x)
  %z: f32[4] = aten::relu(%y) {device=0}
  return %y
}
device 0 { run %y }
)"), {"node %z (aten::relu) is never run; add `run %z` to device 0"});
}

TEST(ProgramVerifier, RejectsNodeRunTwice) {
  expectContains(verifyError(twoStage(R"(
device 0 { run %h  send %h -> 1 }
device 1 { recv %h <- 0  run %y  run %y }
)")), {"node %y (aten::mm) is run twice (device 1 instruction 1 and device 1 instruction 2)"});
}

// --- send / recv matching ---------------------------------------------------

TEST(ProgramVerifier, RejectsRecvWithoutSend) {
  expectContains(verifyError(twoStage(R"(
device 0 { run %h }
device 1 { recv %h <- 0  run %y }
)")), {"device 1, instruction 0 (recv %h <- 0): no matching send of %h from device 0 to device 1",
       "add `send %h -> 1` to device 0"});
}

TEST(ProgramVerifier, RejectsSendWithoutRecv) {
  expectContains(verifyError(twoStage(R"(
device 0 { run %h  send %h -> 1  send %x -> 1 }
device 1 { recv %h <- 0  run %y }
)")), {"device 0, instruction 2 (send %x -> 1): no matching recv of %x on device 1",
       "add `recv %x <- 0` there or drop this send"});
}

TEST(ProgramVerifier, RejectsValueSentTwiceToSameDevice) {
  expectContains(verifyError(twoStage(R"(
device 0 { run %h  send %h -> 1  send %h -> 1 }
device 1 { recv %h <- 0  run %y }
)")), {"device 0, instruction 2 (send %h -> 1): %h is sent to device 1 twice (also at "
       "instruction 1)"});
}

TEST(ProgramVerifier, RejectsValueReceivedTwiceFromSameDevice) {
  expectContains(verifyError(twoStage(R"(
device 0 { run %h  send %h -> 1 }
device 1 { recv %h <- 0  run %y  recv %h <- 0 }
)")), {"device 1, instruction 2 (recv %h <- 0): %h is received from device 0 twice (also at "
       "instruction 0)"});
}

// --- liveness ---------------------------------------------------------------

TEST(ProgramVerifier, RejectsUseOfValueLivingOnAnotherDevice) {
  expectContains(verifyError(twoStage(R"(
device 0 { run %h }
device 1 { run %y }
)")), {"device 1, instruction 0 (run %y): %h is not on device 1 (it lives on device 0; add "
       "`send %h -> 1` there and `recv %h <- 0` here)"});
}

TEST(ProgramVerifier, RejectsUseBeforeProducerRunsOnSameDevice) {
  expectContains(verifyError(twoStage(R"(
device 0 { send %h -> 1  run %h }
device 1 { recv %h <- 0  run %y }
)")), {"device 0, instruction 0 (send %h -> 1): %h is not on device 0 yet (its producer runs "
       "at instruction 1)"});
}

TEST(ProgramVerifier, RejectsUseAfterFree) {
  expectContains(verifyError(twoStage(R"(
device 0 { run %h  free %h  send %h -> 1 }
device 1 { recv %h <- 0  run %y }
)")), {"device 0, instruction 2 (send %h -> 1): %h was freed at instruction 1"});
}

// %w starts on device 1, goes to device 0 and back.
TEST(ProgramVerifier, RejectsRecvOfValueAlreadyOnDevice) {
  expectContains(verifyError(twoStage(R"(
device 0 { run %h  send %h -> 1  recv %w <- 1  send %w -> 1 }
device 1 { send %w -> 0  recv %h <- 0  recv %w <- 0  run %y }
)")), {"device 1, instruction 2 (recv %w <- 0): %w is already on device 1 (a graph input placed "
       "here); drop this recv"});
}

TEST(ProgramVerifier, RejectsGraphOutputFreedEverywhere) {
  expectContains(verifyError(twoStage(R"(
device 0 { run %h  send %h -> 1 }
device 1 { recv %h <- 0  run %y  free %y }
)")), {"graph output %y is not alive on any device at the end (freed on device 1 at "
       "instruction 2; drop that free)"});
}

// --- deadlock ---------------------------------------------------------------

//   device 0              device 1
//   0: recv %b <- 1 <-.  .-> 0: recv %a <- 0
//   1: send %a -> 1 --+--'   1: send %b -> 0
//                     '---------------'
TEST(ProgramVerifier, RejectsTwoDevicesWaitingForEachOther) {
  const std::string msg = verifyError(R"(
program devices=2
graph @swap(%a: f32[2] input {device=0}, %b: f32[2] input {device=1}) {
  %c: f32[2] = aten::add.Tensor(%a, %b) {device=0}
  %d: f32[2] = aten::mul.Tensor(%a, %b) {device=1}
  return %c, %d
}
device 0 { recv %b <- 1  send %a -> 1  run %c }
device 1 { recv %a <- 0  send %b -> 0  run %d }
)");
  expectContains(msg, {
      "modelpar verify: graph @swap: deadlock: device 0 waits at instruction 0 (recv %b <- 1) "
      "while device 1 waits at instruction 0 (recv %a <- 0): the cycle is device 0 instruction 0 "
      "(recv %b <- 1) waits for device 1 instruction 1 (send %b -> 0), which comes after device 1 "
      "instruction 0 (recv %a <- 0), which waits for device 0 instruction 1 (send %a -> 1), which "
      "comes after device 0 instruction 0; move a send ahead"});
}

// Devices 1 -> 2 -> 3 -> 1 wait in a ring; device 0 waits on device 1 but is
// not on the cycle, so the report lists it as waiting and leaves it out of the
// cycle.
TEST(ProgramVerifier, ReportsOnlyTheCycleAmongStuckDevices) {
  const std::string msg = verifyError(R"(
program devices=4
graph @ring(%a0: f32[2] input {device=0}, %a1: f32[2] input {device=1},
            %a2: f32[2] input {device=2}, %a3: f32[2] input {device=3}) {
  return
}
device 0 { recv %a1 <- 1 }
device 1 { recv %a3 <- 3  send %a1 -> 2  send %a1 -> 0 }
device 2 { recv %a1 <- 1  send %a2 -> 3 }
device 3 { recv %a2 <- 2  send %a3 -> 1 }
)");
  expectContains(msg, {"deadlock: device 0 waits at instruction 0 (recv %a1 <- 1) while device 1 "
                       "waits at instruction 0 (recv %a3 <- 3), device 2 waits",
                       "the cycle is device 1 instruction 0 (recv %a3 <- 3) waits for device 3 "
                       "instruction 1 (send %a3 -> 1)"});
  EXPECT_EQ(msg.find("cycle is device 0"), std::string::npos) << msg;
}

// Six devices in a ring: the cycle has 13 steps and the report stops after 8.
TEST(ProgramVerifier, ShortensLongDeadlockCycle) {
  constexpr int kDevices = 6;
  std::string inputs, blocks;
  for (int d = 0; d < kDevices; ++d) {
    const int prev = (d + kDevices - 1) % kDevices;
    inputs += fmt::format("{}%a{}: f32[2] input {{device={}}}", d ? ", " : "", d, d);
    blocks += fmt::format("device {} {{ recv %a{} <- {}  send %a{} -> {} }}\n", d, prev, prev, d,
                          (d + 1) % kDevices);
  }
  const std::string msg = verifyError(
      fmt::format("program devices={}\ngraph @ring({}) {{\n  return\n}}\n{}", kDevices, inputs,
                  blocks));
  expectContains(msg, {"deadlock: ", "the cycle is device 0 instruction 0 (recv %a5 <- 5)",
                       ", ...; move a send ahead"});
}

}  // namespace
}  // namespace modelpar::ir
