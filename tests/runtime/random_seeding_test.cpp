// randomOpsOrdered (Note [Reproducible random ops over workers]): which
// programs' random ops run in one order whatever the workers' timing.
#include "runtime/random_seeding.h"

#include <gtest/gtest.h>

#include "ir/parser.h"

namespace modelpar::runtime {
namespace {

// Two dropouts, one per device; `device1` is device 1's instruction list.
ir::Program twoDropouts(const std::string& device1) {
  return ir::parseProgram(R"(
    program devices=2
    graph @g(%x: f32[8] input {device=0}, %y: f32[8] input {device=1}) {
      %a: f32[8], %ma: bool[8] = aten::native_dropout(%x, 0.5, true) {device=0}
      %b: f32[8], %mb: bool[8] = aten::native_dropout(%y, 0.5, true) {device=1}
      %c: f32[8] = aten::add.Tensor(%a, %b) {device=1}
      return %c
    }
    device 0 { run %a
      send %a -> 1 }
    device 1 { )" + device1 + R"( }
  )");
}

TEST(RandomOpsOrdered, ADropoutAfterTheOtherDevicesSendsIsOrdered) {
  EXPECT_TRUE(randomOpsOrdered(twoDropouts("recv %a <- 0\n run %b\n run %c")));
}

TEST(RandomOpsOrdered, DropoutsOnTwoDevicesWithNoPathBetweenThemAreNot) {
  EXPECT_FALSE(randomOpsOrdered(twoDropouts("run %b\n recv %a <- 0\n run %c")));
}

// What the workers must reseed is known by the schema too: the functional
// aten::uniform and a node marked random (whatever its op) on two devices
// with no path between them are not ordered.
TEST(RandomOpsOrdered, FunctionalSamplersAndNodesMarkedRandomCount) {
  EXPECT_FALSE(randomOpsOrdered(ir::parseProgram(R"(
    program devices=2
    graph @g(%x: f32[8] input {device=0}, %y: f32[8] input {device=1}) {
      %a: f32[8] = aten::uniform(%x, 0.0, 1.0) {device=0}
      %b: f32[8] = aten::relu(%y) {device=1, random=true}
      return %a, %b
    }
    device 0 { run %a }
    device 1 { run %b }
  )")));
}

TEST(RandomOpsOrdered, OneDeviceOrOneRandomOpIsOrdered) {
  EXPECT_TRUE(randomOpsOrdered(ir::parseProgram(R"(
    program devices=2
    graph @g(%x: f32[8] input {device=0}) {
      %a: f32[8], %ma: bool[8] = aten::native_dropout(%x, 0.5, true) {device=0}
      %b: f32[8], %mb: bool[8] = aten::native_dropout(%a, 0.5, true) {device=0}
      %c: f32[8] = aten::relu(%b) {device=1}
      return %c
    }
    device 0 { run %a
      run %b
      send %b -> 1 }
    device 1 { recv %b <- 0
      run %c }
  )")));
  EXPECT_TRUE(randomOpsOrdered(ir::parseProgram(R"(
    program devices=2
    graph @g(%x: f32[8] input {device=0}, %y: f32[8] input {device=1}) {
      %a: f32[8], %ma: bool[8] = aten::native_dropout(%x, 0.5, true) {device=0}
      %b: f32[8] = aten::relu(%y) {device=1}
      return %a, %b
    }
    device 0 { run %a }
    device 1 { run %b }
  )")));
}

TEST(RandomOpsOrdered, AChainThroughAThirdDeviceIsOrdered) {
  // dropout on 0 -> relu on 1 -> dropout on 2: ordered through device 1.
  EXPECT_TRUE(randomOpsOrdered(ir::parseProgram(R"(
    program devices=3
    graph @g(%x: f32[8] input {device=0}) {
      %a: f32[8], %ma: bool[8] = aten::native_dropout(%x, 0.5, true) {device=0}
      %b: f32[8] = aten::relu(%a) {device=1}
      %c: f32[8], %mc: bool[8] = aten::native_dropout(%b, 0.5, true) {device=2}
      return %c
    }
    device 0 { run %a
      send %a -> 1 }
    device 1 { recv %a <- 0
      run %b
      send %b -> 2 }
    device 2 { recv %b <- 1
      run %c }
  )")));
}

}  // namespace
}  // namespace modelpar::runtime
