// ProgramInterpreter: per-device schedules run interleaved on one real device
// give the single-device results; transfers copy; frees drop copies; run-time
// deadlocks and failing instructions are reported with device and index.
#include "runtime/program_interpreter.h"

#include <gtest/gtest.h>

#include "tests/support/expect_error.h"

#include <ATen/core/Tensor.h>
#include <ATen/ops/allclose.h>
#include <ATen/ops/equal.h>
#include <ATen/ops/mm.h>
#include <ATen/ops/neg.h>
#include <ATen/ops/randn.h>
#include <ATen/ops/relu.h>

#include <string>

#include "ir/error.h"
#include "ir/parser.h"

namespace modelpar::runtime {
namespace {

using c10::IValue;

using modelpar::testing::messageOf;

ProgramInterpreter unverified(const char* text) {
  return ProgramInterpreter(ir::parseProgram(text), ProgramInterpreterOptions{.verify = false});
}

//   device 0: %x -> relu %h --send--+
//   device 1:                        +--recv--> mm(%h, %w) -> %y
constexpr const char* kTwoDevices = R"(
  program devices=2
  graph @step(%x: f32[4, 8] input {device=0}, %w: f32[8, 3] param {device=1}) {
    %h: f32[4, 8] = aten::relu(%x) {device=0}
    %y: f32[4, 3] = aten::mm(%h, %w) {device=1}
    return %y
  }
  device 0 {
    run %h
    send %h -> 1
    free %h
  }
  device 1 {
    recv %h <- 0
    run %y
  }
)";

TEST(ProgramInterpreter, TwoDeviceChainEqualsEagerOnOneDevice) {
  ProgramInterpreter interp(ir::parseProgram(kTwoDevices));
  at::Tensor x = at::randn({4, 8}), w = at::randn({8, 3});
  auto out = interp.run({x, w});
  ASSERT_EQ(out.size(), 1u);
  EXPECT_TRUE(at::allclose(out[0].toTensor(), at::mm(at::relu(x), w)));
}

// Device 0 mutates %h in place after sending it; device 1 must still see the
// value as it was sent, as it would on another GPU.
TEST(ProgramInterpreter, ReceiverGetsItsOwnCopyOfSentTensor) {
  ProgramInterpreter interp(ir::parseProgram(R"(
    program devices=2
    graph @g(%x: f32[4] input {device=0}) {
      %h: f32[4] = aten::relu(%x) {device=0}
      %k: f32[4] = aten::mul_.Scalar(%h, 0) {device=0}
      %y: f32[4] = aten::neg(%h) {device=1}
      return %y, %k
    }
    device 0 {
      run %h
      send %h -> 1
      run %k
    }
    device 1 {
      recv %h <- 0
      run %y
    }
  )"));
  at::Tensor x = at::randn({4});
  auto out = interp.run({x});
  EXPECT_TRUE(at::equal(out[0].toTensor(), at::neg(at::relu(x))));
  EXPECT_EQ(out[1].toTensor().abs().sum().item().toFloat(), 0.0f);
}

// %y lives only on device 1 at the end (device 0 never had it).
TEST(ProgramInterpreter, FetchesOutputFromTheDeviceHoldingIt) {
  ProgramInterpreter interp(ir::parseProgram(R"(
    program devices=3
    graph @g(%x: f32[2] input {device=2}) {
      %y: f32[2] = aten::neg(%x) {device=2}
      return %y
    }
    device 0 {
    }
    device 1 {
      recv %y <- 2
    }
    device 2 {
      run %y
      send %y -> 1
      free %y
    }
  )"));
  at::Tensor x = at::randn({2});
  EXPECT_TRUE(at::equal(interp.run({x})[0].toTensor(), at::neg(x)));
}

TEST(ProgramInterpreter, RejectsBadInputShapeBeforeRunning) {
  ProgramInterpreter interp(ir::parseProgram(kTwoDevices));
  std::string msg = messageOf<ExecutionError>(
      [&] { interp.run({at::randn({4, 7}), at::randn({8, 3})}); });
  EXPECT_HAS(msg, "input 0 (%x): expected f32[4, 8], got f32[4, 7]");
}

//   device 0: recv %b <- 1 (waits) ... send %a -> 1
//   device 1: recv %a <- 0 (waits) ... send %b -> 0
constexpr const char* kDeadlock = R"(
  program devices=2
  graph @g(%x: f32[2] input {device=0}) {
    %a: f32[2] = aten::relu(%x) {device=0}
    %b: f32[2] = aten::neg(%a) {device=1}
    return %b
  }
  device 0 {
    run %a
    recv %b <- 1
    send %a -> 1
  }
  device 1 {
    recv %a <- 0
    run %b
    send %b -> 0
  }
)";

TEST(ProgramInterpreter, VerifierRejectsDeadlockedProgramAtConstruction) {
  EXPECT_THROW(ProgramInterpreter(ir::parseProgram(kDeadlock)), InvalidIrError);
}

TEST(ProgramInterpreter, DeadlockAtRunTimeListsEveryWaitingDevice) {
  ProgramInterpreter interp = unverified(kDeadlock);
  std::string msg = messageOf<ExecutionError>([&] { interp.run({at::randn({2})}); });
  EXPECT_HAS(msg, "deadlock at run time: device 0 waits at instruction 1 (recv %b <- 1); "
                  "device 1 waits at instruction 0 (recv %a <- 0)");
}

TEST(ProgramInterpreter, FailingOpReportsDeviceAndInstruction) {
  // The IR claims shapes mm cannot multiply; the verifier does not run ops.
  ProgramInterpreter interp(ir::parseProgram(R"(
    program devices=2
    graph @g(%x: f32[4, 8] input {device=0}, %w: f32[3, 2] param {device=1}) {
      %h: f32[4, 8] = aten::relu(%x) {device=0}
      %y: f32[4, 2] = aten::mm(%h, %w) {device=1}
      return %y
    }
    device 0 {
      run %h
      send %h -> 1
    }
    device 1 {
      recv %h <- 0
      run %y
    }
  )"));
  std::string msg = messageOf<ExecutionError>([&] { interp.run({at::randn({4, 8}), at::randn({3, 2})}); });
  EXPECT_EQ(msg.rfind("device 1, instruction 1 (run %y, aten::mm): ", 0), 0u) << msg;
  EXPECT_HAS(msg, "cannot be multiplied");
}

TEST(ProgramInterpreter, SendOfValueNotOnDeviceIsReported) {
  ProgramInterpreter interp = unverified(R"(
    program devices=2
    graph @g(%x: f32[2] input {device=0}) {
      %a: f32[2] = aten::relu(%x) {device=0}
      return %a
    }
    device 0 {
      send %a -> 1
      run %a
    }
    device 1 {
      recv %a <- 0
    }
  )");
  std::string msg = messageOf<ExecutionError>([&] { interp.run({at::randn({2})}); });
  EXPECT_HAS(msg, "device 0, instruction 0 (send %a -> 1): %a is not on device 0");
}

TEST(ProgramInterpreter, OpReadingValueNotOnItsDeviceIsReported) {
  ProgramInterpreter interp = unverified(R"(
    program devices=2
    graph @g(%x: f32[2] input {device=0}) {
      %a: f32[2] = aten::relu(%x) {device=1}
      return %a
    }
    device 0 {
    }
    device 1 {
      run %a
    }
  )");
  std::string msg = messageOf<ExecutionError>([&] { interp.run({at::randn({2})}); });
  EXPECT_HAS(msg, "device 1, instruction 0 (run %a, aten::relu): ");
  EXPECT_HAS(msg, "input %x is not available");
}

TEST(ProgramInterpreter, OutputFreedEverywhereIsReported) {
  ProgramInterpreter interp = unverified(R"(
    program devices=1
    graph @g(%x: f32[2] input) {
      %a: f32[2] = aten::relu(%x)
      return %a
    }
    device 0 {
      run %a
      free %a
    }
  )");
  std::string msg = messageOf<ExecutionError>([&] { interp.run({at::randn({2})}); });
  EXPECT_HAS(msg, "graph output %a is on no device");
}

TEST(ProgramInterpreter, UnknownOperatorFailsAtConstruction) {
  EXPECT_THROW(unverified(R"(
    program devices=1
    graph @g(%x: f32[2] input) {
      %a: f32[2] = aten::nonexistent_op(%x)
      return %a
    }
    device 0 {
      run %a
    }
  )"), UnsupportedOpError);
}

}  // namespace
}  // namespace modelpar::runtime
