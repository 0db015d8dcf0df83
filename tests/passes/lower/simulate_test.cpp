// Pass `simulate`: hand-computed timelines for the channel model, memory,
// critical path, errors, and the Chrome trace.
#include "passes/lower/simulate.h"

#include <string>

#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include "ir/error.h"
#include "ir/parser.h"
#include "ir/verifier.h"
#include "passes/lower/chrome_trace.h"
#include "passes/lower/lower.h"
#include "passes/place/place_metf.h"
#include "tests/passes/test_graphs.h"

namespace modelpar::passes {
namespace {

using testing::machine;
using testing::kDiamondNoLayers;
using Kind = ir::Instruction::Kind;

// Device 0: run a 0..10, send a 10..13, run b 10..30, send b 30..33.
// Device 1: recv a (10..13), run c 13..33, recv b (30..33), run d 33..38.
TEST(Simulate, ReproducesThePlacersDiamondTimeline) {
  ir::Graph g = ir::parseGraph(kDiamondNoLayers);
  Placement pl = placeMEtf(g, machine(2));
  ir::Program p = lower(g, pl);
  SimulationReport r = simulate(p, machine(2));
  EXPECT_DOUBLE_EQ(r.step_time_us, 38.0);
  EXPECT_DOUBLE_EQ(r.step_time_us, pl.makespan_us);
  ASSERT_EQ(r.devices.size(), 2u);
  EXPECT_DOUBLE_EQ(r.devices[0].compute_busy_us, 30.0);
  EXPECT_DOUBLE_EQ(r.devices[0].idle_us, 8.0);
  EXPECT_DOUBLE_EQ(r.devices[1].compute_busy_us, 25.0);
  // The channels are held for the bytes (1 us a transfer), not the latency.
  EXPECT_DOUBLE_EQ(r.devices[0].send_busy_us, 2.0);
  EXPECT_DOUBLE_EQ(r.devices[1].recv_busy_us, 2.0);
  // Memory in program order: device 0 peaks at %x + %a = 2 KiB (then %x is
  // freed, and %a once %b has read it); device 1 at the copy of %b + %c + %d
  // = 3 KiB while %d runs.
  EXPECT_EQ(r.devices[0].peak_bytes, 2048);
  EXPECT_EQ(r.devices[1].peak_bytes, 3072);
  EXPECT_LE(r.devices[0].peak_bytes, pl.peak_bytes[0]);
  EXPECT_LE(r.devices[1].peak_bytes, pl.peak_bytes[1]);
  // Critical path: a, its transfer, c (which waited for it), d (after c).
  ASSERT_EQ(r.critical_path.size(), 4u);
  EXPECT_EQ(r.critical_path[0].device, 0);
  EXPECT_EQ(r.critical_path[0].kind, Kind::Run);
  EXPECT_EQ(r.critical_path[1].kind, Kind::Recv);
  EXPECT_DOUBLE_EQ(r.critical_path[1].end_us, 13.0);
  EXPECT_EQ(r.critical_path[2].index, 1);  // run %c
  EXPECT_EQ(r.critical_path[3].index, 4);  // run %d (after recv %b and free %a)
  EXPECT_DOUBLE_EQ(r.critical_path[3].end_us, 38.0);
  EXPECT_EQ(r.num_instructions, 14);
  EXPECT_EQ(r.num_transfers, 2);
}

// Two devices send 1 KiB to device 2 at t=10: its receive channel takes
// their bytes one after the other (lower source first), 10..11 and 11..12,
// and each arrives the 2 us latency later (Note [A link's latency does not
// hold it]): recv a 10..13, recv b 11..14; c 14..19.
constexpr const char* kFanIn = R"(
program devices=3
graph @fanin(%x: f32[256] input {device=0}, %y: f32[256] input {device=1}) {
  %a: f32[256] = aten::relu(%x) {device=0, cost={time_us=10.0, out=1024, temp=0, persist=0}}
  %b: f32[256] = aten::relu(%y) {device=1, cost={time_us=10.0, out=1024, temp=0, persist=0}}
  %c: f32[256] = aten::add.Tensor(%a, %b) {device=2, cost={time_us=5.0, out=1024, temp=256, persist=4096}}
  return %c
}
device 0 {
  run %a
  send %a -> 2
}
device 1 {
  run %b
  send %b -> 2
}
device 2 {
  recv %a <- 0
  recv %b <- 1
  run %c
}
)";

// The machine's fixed cost per step (waking the workers) is added once:
// 38 us of the diamond + 20 us.
TEST(Simulate, AddsTheMachinesStepOverheadOnce) {
  ir::Graph g = ir::parseGraph(kDiamondNoLayers);
  DeviceModel m = machine(2);
  Placement pl = placeMEtf(g, m);
  ir::Program p = lower(g, pl);
  m.setStepOverheadUs(20.0);
  SimulationReport r = simulate(p, m);
  EXPECT_DOUBLE_EQ(r.step_time_us, 38.0 + 20.0);
  EXPECT_DOUBLE_EQ(r.devices[0].idle_us, 8.0 + 20.0);
  // Each device beyond the first adds the worker overhead: 38 + 20 + 1 * 3.
  m.setWorkerOverheadUs(3.0);
  EXPECT_DOUBLE_EQ(simulate(p, m).step_time_us, 61.0);
}

// Note [Shared host cores]: the diamond's devices compute 30 + 25 us
// (device 0: a 0..10, b 10..30; device 1: c 13..33, d 33..38), both at once
// during 13..30 (17 us). On one core the step is their sum, 55 us (the
// 38-us timeline stretched by (2/1 - 1) * 17 = 17, and the bound 55 / 1),
// plus the step overhead; on 1.25 cores 38 + (2/1.25 - 1) * 17 = 48.2 us
// (above the bound 55 / 1.25 = 44); on 1.5 cores 38 + 17/3 us; on two the
// timeline's 38 us stands. The timeline itself is unchanged.
TEST(Simulate, SharedHostCoresStretchWhatOverlapsAndBoundTheStep) {
  ir::Graph g = ir::parseGraph(kDiamondNoLayers);
  DeviceModel m = machine(2);
  ir::Program p = lower(g, placeMEtf(g, m));
  m.setHostCores(1.0);
  m.setStepOverheadUs(20.0);
  SimulationReport one = simulate(p, m, SimulateOptions{true});
  EXPECT_DOUBLE_EQ(one.step_time_us, 55.0 + 20.0);
  EXPECT_DOUBLE_EQ(one.devices[0].idle_us, 75.0 - 30.0);
  EXPECT_DOUBLE_EQ(one.end_us[1].back(), 38.0);  // run %d ends where it did
  m.setStepOverheadUs(0.0);
  m.setHostCores(1.25);
  EXPECT_NEAR(simulate(p, m).step_time_us, 48.2, 1e-9);
  m.setHostCores(1.5);
  EXPECT_NEAR(simulate(p, m).step_time_us, 38.0 + 17.0 / 3.0, 1e-9);
  m.setHostCores(2.0);
  EXPECT_DOUBLE_EQ(simulate(p, m).step_time_us, 38.0);
}

// A send's host cost lengthens the run before it: device 0 runs a 0..12
// (10 + 2), sends a 12..15, runs b 12..34, sends b 34..37; device 1 runs c
// 15..35 (no send after it), d 37..42.
TEST(Simulate, ChargesTheSendOverheadToTheRunBeforeEachSend) {
  ir::Graph g = ir::parseGraph(kDiamondNoLayers);
  DeviceModel m = machine(2);
  ir::Program p = lower(g, placeMEtf(g, m));
  m.setSendOverheadUs(2.0);
  SimulationReport r = simulate(p, m);
  EXPECT_DOUBLE_EQ(r.step_time_us, 42.0);
  EXPECT_DOUBLE_EQ(r.devices[0].compute_busy_us, 34.0);
  EXPECT_DOUBLE_EQ(r.devices[1].compute_busy_us, 25.0);
}

TEST(Simulate, SerialisesReceivesAtADevice) {
  ir::Program p = ir::parseProgram(kFanIn);
  SimulationReport r = simulate(p, machine(3), SimulateOptions{true});
  EXPECT_DOUBLE_EQ(r.step_time_us, 19.0);
  EXPECT_DOUBLE_EQ(r.start_us[2][1], 11.0);  // recv %b waits for recv %a's bytes
  EXPECT_DOUBLE_EQ(r.end_us[2][1], 14.0);
  EXPECT_DOUBLE_EQ(r.devices[2].recv_busy_us, 2.0);
  // Critical path: a, recv a, recv b (queued behind it), c.
  ASSERT_EQ(r.critical_path.size(), 4u);
  EXPECT_EQ(r.critical_path[2].kind, Kind::Recv);
  EXPECT_EQ(r.critical_path[2].index, 1);
  // Device 2: 4 KiB persistent + two 1 KiB copies + %c and 256 B workspace.
  EXPECT_EQ(r.devices[2].persistent_bytes, 4096);
  EXPECT_EQ(r.devices[2].peak_bytes, 4096 + 3 * 1024 + 256);
}

// A reduced mse_loss holds its input's bytes until its free (Note [Reduced
// losses keep their element-wise buffer]); its received copy is 4 bytes.
// Device 0, from p and y (128 B each): l 128 B -> 384 after run l (peak),
// 256 after free l. Device 1: the 4-byte copy.
TEST(Simulate, AReducedLossHoldsItsInputsBytesButItsCopyDoesNot) {
  ir::Program p = ir::parseProgram(R"(
    program devices=2
    graph @loss(%p: f32[8, 4] input {device=0}, %y: f32[8, 4] input {device=0}) {
      %l: f32[] = aten::mse_loss(%p, %y, 1) {device=0, cost={time_us=1.0, out=4, temp=0, persist=0}}
      %m: f32[] = aten::mul.Scalar(%l, 2.0) {device=1, cost={time_us=1.0, out=4, temp=0, persist=0}}
      return %m
    }
    device 0 { run %l  send %l -> 1  free %l }
    device 1 { recv %l <- 0  run %m  free %l }
  )");
  SimulationReport r = simulate(p, machine(2));
  EXPECT_EQ(r.devices[0].peak_bytes, 128 + 128 + 128);
  EXPECT_EQ(r.devices[1].peak_bytes, 4 + 4);
}

// Note [Memory model]: a parameter counts through its reader's persistent
// bytes, and also where it is bound but no node reads it (a training rank
// holding what an inference graph reads elsewhere: Note [One home per
// parameter]). %w (64 B) is bound on device 0 and read on device 1: device 0
// holds it for the step; device 1 its received copy (64 B) plus %y's
// persistent bytes (64 B, its first user) and %y (32 B). %v, bound and read
// on device 0, counts only through %z's persistent bytes (16 B).
TEST(Simulate, AParameterHeldWhereNoNodeReadsItCountsThere) {
  ir::Program p = ir::parseProgram(R"(
    program devices=2
    graph @held(%w: f32[4, 4] param {device=0}, %v: f32[4] param {device=0}, %x: f32[2, 4] input {device=1}) {
      %z: f32[4] = aten::relu(%v) {device=0, cost={time_us=1.0, out=16, temp=0, persist=16}}
      %y: f32[2, 4] = aten::mm(%x, %w) {device=1, cost={time_us=1.0, out=32, temp=0, persist=64}}
      return %y, %z
    }
    device 0 { send %w -> 1  run %z }
    device 1 { recv %w <- 0  run %y  free %w }
  )");
  SimulationReport r = simulate(p, machine(2));
  EXPECT_EQ(r.devices[0].peak_bytes, 64 + 16 + 16);
  EXPECT_EQ(r.devices[1].peak_bytes, 32 + 64 + 64 + 32);
}

TEST(Simulate, SerialisesSendsAndOverlapsThemWithCompute) {
  // Device 0 sends %a to 1 and 2 (10..13, and 11..14 once the first's byte
  // time has passed) while it runs %b (10..30).
  ir::Program p = ir::parseProgram(R"(
program devices=3
graph @fanout(%x: f32[256] input {device=0}) {
  %a: f32[256] = aten::relu(%x) {device=0, cost={time_us=10.0, out=1024, temp=0, persist=0}}
  %b: f32[256] = aten::relu(%a) {device=0, cost={time_us=20.0, out=1024, temp=0, persist=0}}
  %c: f32[256] = aten::relu(%a) {device=1, cost={time_us=1.0, out=1024, temp=0, persist=0}}
  %d: f32[256] = aten::relu(%a) {device=2, cost={time_us=1.0, out=1024, temp=0, persist=0}}
  return %b, %c, %d
}
device 0 {
  run %a
  send %a -> 1
  send %a -> 2
  run %b
}
device 1 {
  recv %a <- 0
  run %c
}
device 2 {
  recv %a <- 0
  run %d
}
)");
  SimulationReport r = simulate(p, machine(3), SimulateOptions{true});
  EXPECT_DOUBLE_EQ(r.end_us[1][1], 14.0);
  EXPECT_DOUBLE_EQ(r.end_us[2][1], 15.0);
  EXPECT_DOUBLE_EQ(r.step_time_us, 30.0);
  EXPECT_DOUBLE_EQ(r.devices[0].send_busy_us, 2.0);
}

TEST(Simulate, SendWaitsForTheRunsIssuedBeforeIt) {
  // The send of %a comes after run %b in program order: it waits for %b (the
  // compute-stream event it is issued behind), 30..33.
  ir::Program p = ir::parseProgram(R"(
program devices=2
graph @late(%x: f32[256] input {device=0}) {
  %a: f32[256] = aten::relu(%x) {device=0, cost={time_us=10.0, out=1024, temp=0, persist=0}}
  %b: f32[256] = aten::relu(%a) {device=0, cost={time_us=20.0, out=1024, temp=0, persist=0}}
  %c: f32[256] = aten::relu(%a) {device=1, cost={time_us=1.0, out=1024, temp=0, persist=0}}
  return %b, %c
}
device 0 {
  run %a
  run %b
  send %a -> 1
}
device 1 {
  recv %a <- 0
  run %c
}
)");
  SimulationReport r = simulate(p, machine(2));
  EXPECT_DOUBLE_EQ(r.step_time_us, 34.0);
}

// Note [In-order issue]: device 1 receives %b (sent last) before %a; its
// worker holds at recv %b until 30..33, so run %c, which reads only %a
// (arrived 10..13), runs 33..38 and %d 38..43, not 13..18 and 33..38.
// Each received just before its first use, the step is 38.
TEST(Simulate, RunsWaitForEveryReceiveBeforeThemInProgramOrder) {
  auto program = [](const char* device1) {
    return ir::parseProgram(std::string(R"(
program devices=2
graph @order(%x: f32[256] input {device=0}) {
  %a: f32[256] = aten::relu(%x) {device=0, cost={time_us=10.0, out=1024, temp=0, persist=0}}
  %b: f32[256] = aten::relu(%a) {device=0, cost={time_us=20.0, out=1024, temp=0, persist=0}}
  %c: f32[256] = aten::relu(%a) {device=1, cost={time_us=5.0, out=1024, temp=0, persist=0}}
  %d: f32[256] = aten::relu(%b) {device=1, cost={time_us=5.0, out=1024, temp=0, persist=0}}
  return %c, %d
}
device 0 {
  run %a
  send %a -> 1
  run %b
  send %b -> 1
}
device 1 {
)") + device1 + R"(
}
)");
  };
  SimulationReport late = simulate(
      program("  recv %b <- 0\n  recv %a <- 0\n  run %c\n  run %d"), machine(2),
      SimulateOptions{true});
  EXPECT_DOUBLE_EQ(late.end_us[1][2], 38.0);  // run %c
  EXPECT_DOUBLE_EQ(late.step_time_us, 43.0);
  SimulationReport at_use = simulate(
      program("  recv %a <- 0\n  run %c\n  recv %b <- 0\n  run %d"), machine(2),
      SimulateOptions{true});
  EXPECT_DOUBLE_EQ(at_use.end_us[1][1], 18.0);
  EXPECT_DOUBLE_EQ(at_use.step_time_us, 38.0);
}

TEST(Simulate, ReportsADeadlockWithTheBlockedInstruction) {
  ir::Program p = ir::parseProgram(R"(
program devices=2
graph @stuck(%x: f32[4] input {device=0}, %y: f32[4] input {device=1}) {
  %a: f32[4] = aten::relu(%x) {device=0, cost={time_us=1.0, out=16, temp=0, persist=0}}
  %b: f32[4] = aten::relu(%y) {device=1, cost={time_us=1.0, out=16, temp=0, persist=0}}
  %c: f32[4] = aten::relu(%b) {device=0, cost={time_us=1.0, out=16, temp=0, persist=0}}
  %e: f32[4] = aten::relu(%a) {device=1, cost={time_us=1.0, out=16, temp=0, persist=0}}
  return %c, %e
}
device 0 {
  recv %b <- 1
  run %c
  run %a
  send %a -> 1
}
device 1 {
  recv %a <- 0
  run %e
  run %b
  send %b -> 0
}
)");
  EXPECT_THROW(ir::verify(p), InvalidIrError);
  try {
    simulate(p, machine(2));
    FAIL();
  } catch (const InvalidIrError& e) {
    EXPECT_NE(std::string(e.what()).find("deadlocks: device 0"), std::string::npos) << e.what();
    EXPECT_NE(std::string(e.what()).find("run %c"), std::string::npos) << e.what();
  }
}

TEST(Simulate, RejectsUnmatchedSendsAndValuesNotOnTheDevice) {
  ir::Program p = ir::parseProgram(kFanIn);
  p.schedule(2).erase(p.schedule(2).begin());  // drop recv %a <- 0
  try {
    simulate(p, machine(3));
    FAIL();
  } catch (const InvalidIrError& e) {
    EXPECT_NE(std::string(e.what()).find("send %a -> 2"), std::string::npos) << e.what();
    EXPECT_NE(std::string(e.what()).find("no matching recv"), std::string::npos) << e.what();
  }
  p = ir::parseProgram(kFanIn);
  p.schedule(0).erase(p.schedule(0).begin());  // drop run %a: the send reads nothing
  try {
    simulate(p, machine(3));
    FAIL();
  } catch (const InvalidIrError& e) {
    EXPECT_NE(std::string(e.what()).find("uses %a which is not on the device"), std::string::npos)
        << e.what();
  }
}

TEST(Simulate, RejectsMissingCostsAndTooSmallMachines) {
  ir::Program p = ir::parseProgram(kFanIn);
  try {
    simulate(p, machine(2));
    FAIL();
  } catch (const ConfigError& e) {
    EXPECT_NE(std::string(e.what()).find("uses 3 devices but the machine has 2"), std::string::npos);
  }
  p.graph().node(2).cost.reset();
  try {
    simulate(p, machine(3));
    FAIL();
  } catch (const ConfigError& e) {
    EXPECT_NE(std::string(e.what()).find("%c"), std::string::npos) << e.what();
    EXPECT_NE(std::string(e.what()).find("run the cost pass first"), std::string::npos);
  }
}

TEST(ChromeTrace, HasOneProcessPerDeviceWithComputeAndTransferTracks) {
  ir::Program p = ir::parseProgram(kFanIn);
  SimulationReport r = simulate(p, machine(3), SimulateOptions{true});
  nlohmann::json trace = nlohmann::json::parse(toChromeTrace(p, r));
  int runs = 0, sends = 0, recvs = 0, processes = 0, counters = 0;
  for (const nlohmann::json& e : trace.at("traceEvents")) {
    std::string ph = e.at("ph").get<std::string>();
    if (ph == "M" && e.at("name").get<std::string>() == "process_name") ++processes;
    if (ph == "C") ++counters;
    if (ph != "X") continue;
    std::string cat = e.at("cat").get<std::string>();
    if (cat == "run") ++runs;
    if (cat == "send") {
      ++sends;
      EXPECT_EQ(e.at("tid").get<int64_t>(), 1);
    }
    if (cat == "recv") {
      ++recvs;
      EXPECT_EQ(e.at("pid").get<int64_t>(), 2);
      EXPECT_EQ(e.at("tid").get<int64_t>(), 2);
    }
    if (e.at("name").get<std::string>() == "aten::add.Tensor") {
      EXPECT_DOUBLE_EQ(e.at("ts").get<double>(), 14.0);
      EXPECT_DOUBLE_EQ(e.at("dur").get<double>(), 5.0);
    }
  }
  EXPECT_EQ(processes, 3);
  EXPECT_EQ(runs, 3);
  EXPECT_EQ(sends, 2);
  EXPECT_EQ(recvs, 2);
  EXPECT_EQ(counters, 3);
  EXPECT_THROW(toChromeTrace(p, simulate(p, machine(3))), ConfigError);
  try {
    writeChromeTrace("/nonexistent/dir/trace.json", p, r);
    FAIL();
  } catch (const ConfigError& e) {
    EXPECT_NE(std::string(e.what()).find("cannot write '/nonexistent/dir/trace.json'"), std::string::npos);
  }
}

}  // namespace
}  // namespace modelpar::passes
