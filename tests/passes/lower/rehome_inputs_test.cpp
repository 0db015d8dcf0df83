// Pass `rehome-inputs`: forwarding through a third device, a home that frees
// and fetches again, what it leaves alone, errors. The two-device rewrites
// are golden files (tests/passes/golden/rehome_inputs_*.txt).
#include "passes/lower/rehome_inputs.h"

#include <gtest/gtest.h>

#include "ir/error.h"
#include "ir/parser.h"
#include "ir/printer.h"
#include "passes/cost/device_model.h"
#include "passes/lower/simulate.h"

namespace modelpar::passes {
namespace {

constexpr const char* kGraph = R"(
graph @g(%w: f32[8] param {device=0}, %x: f32[8] input {device=0}) {
  %a: f32[8] = aten::mul.Tensor(%w, %x) {device=0, cost={time_us=1.0, out=32, temp=0, persist=0}}
  %b: f32[8] = aten::relu(%w) {device=1, cost={time_us=1.0, out=32, temp=0, persist=0}}
  %c: f32[8] = aten::add.Tensor(%w, %a) {device=2, cost={time_us=1.0, out=32, temp=0, persist=0}}
  return %b, %c
}
)";

// %w bound on 0, which reads it and sends it to 1 and to 2.
constexpr const char* kFanOut = R"(
device 0 {
  send %w -> 1
  run %a
  send %w -> 2
  send %a -> 2
}
device 1 {
  recv %w <- 0
  run %b
}
device 2 {
  recv %w <- 0
  recv %a <- 0
  run %c
}
)";

ir::Program program(const char* schedules) {
  return ir::parseProgram(std::string("program devices=3\n") + kGraph + schedules);
}

std::string schedules(const ir::Program& p) {
  std::string text = ir::print(p);
  return text.substr(text.find("device 0 {"));
}

TEST(RehomeInputs, AHomeThatReceivedFromTheBoundDeviceSendsInsteadAndTheOthersStillGetIt) {
  ir::Program p = rehomeInputs(program(kFanOut), {{"w", 2}});
  EXPECT_EQ(p.graph().inputs()[0].device, 2);
  EXPECT_EQ(schedules(p),
            "device 0 {\n  recv %w <- 2\n  send %w -> 1\n  run %a\n  send %a -> 2\n}\n"
            "device 1 {\n  recv %w <- 0\n  run %b\n}\n"
            "device 2 {\n  send %w -> 0\n  recv %a <- 0\n  run %c\n}\n");
}

TEST(RehomeInputs, TheRewrittenProgramRunsAsHandComputed) {
  // Links of 10 us latency, which a transfer does not hold (Note [A link's
  // latency does not hold it]), runs of 1 us; a send waits for the runs and
  // receives before it (Note [In-order issue]). Before: device 0 sends w to
  // 1 at 0 (it arrives at 10), runs a 0-1, then sends w and a to 2 at 1
  // (both arrive at 11); c runs 11-12. After (w at home on 2): 2 sends w to
  // 0 at 0-10; 0 forwards it to 1 at 10-20, runs a 10-11, sends a at 11-21;
  // b runs 20-21, c 21-22: the fan-out now waits for w to come from home.
  DeviceModel m = DeviceModel::uniform(3, DeviceSpec{}, LinkSpec{10.0, 1e18});
  SimulationReport before = simulate(program(kFanOut), m, {.record_timeline = true});
  SimulationReport after = simulate(rehomeInputs(program(kFanOut), {{"w", 2}}), m,
                                    {.record_timeline = true});
  EXPECT_NEAR(before.step_time_us, 12.0, 1e-9);
  EXPECT_NEAR(after.step_time_us, 22.0, 1e-9);
  EXPECT_NEAR(after.start_us[0][2], 10.0, 1e-9);  // run a waits for w from its home
  EXPECT_NEAR(after.start_us[1][1], 20.0, 1e-9);  // run b: w forwarded by device 0
}

TEST(RehomeInputs, AReceiveAfterTheHomeFreedTheValueStays) {
  // Device 2 receives w, frees it, and fetches it again from device 1: at
  // home only the first receive (and device 0's send for it) goes.
  ir::Program p = rehomeInputs(program(R"(
device 0 {
  send %w -> 1
  send %w -> 2
  run %a
  send %a -> 2
}
device 1 {
  recv %w <- 0
  run %b
  send %w -> 2
}
device 2 {
  recv %w <- 0
  free %w
  recv %a <- 0
  recv %w <- 1
  run %c
}
)"), {{"w", 2}});
  EXPECT_EQ(schedules(p),
            "device 0 {\n  recv %w <- 2\n  send %w -> 1\n  run %a\n  send %a -> 2\n}\n"
            "device 1 {\n  recv %w <- 0\n  run %b\n  send %w -> 2\n}\n"
            "device 2 {\n  send %w -> 0\n  free %w\n  recv %a <- 0\n  recv %w <- 1\n  run %c\n}\n");
}

TEST(RehomeInputs, InputsAtHomeAndEmptyHomesChangeNothing) {
  ir::Program p = program(kFanOut);
  EXPECT_EQ(rehomeInputs(p, {{"w", 0}, {"x", 0}}), p);
  EXPECT_EQ(rehomeInputs(p, {}), p);
}

TEST(RehomeInputs, BadHomesAreConfigErrorsNamingThem) {
  ir::Program p = program(kFanOut);
  EXPECT_THROW(
      {
        try {
          rehomeInputs(p, {{"w", 1}, {"b", 1}});
        } catch (const ConfigError& e) {
          EXPECT_NE(std::string(e.what()).find("%b is not an input of graph @g"), std::string::npos)
              << e.what();
          throw;
        }
      },
      ConfigError);
  EXPECT_THROW(
      {
        try {
          rehomeInputs(p, {{"w", 3}});
        } catch (const ConfigError& e) {
          EXPECT_NE(std::string(e.what()).find("%w has home device 3, but the program has devices 0 to 2"),
                    std::string::npos) << e.what();
          throw;
        }
      },
      ConfigError);
}

TEST(RehomeInputs, ParsesNameAtDeviceItems) {
  EXPECT_EQ(parseInputHomes("fc1.weight@1+%fc1.bias@0"),
            (InputHomes{{"fc1.weight", 1}, {"fc1.bias", 0}}));
  EXPECT_EQ(parseInputHomes(""), InputHomes{});
  for (const char* bad : {"w", "@1", "w@", "w@x", "w@1+", "w@1x"}) {
    EXPECT_THROW(parseInputHomes(bad), ConfigError) << bad;
  }
}

}  // namespace
}  // namespace modelpar::passes
