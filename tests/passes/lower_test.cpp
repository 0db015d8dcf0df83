// Pass `lower`: golden programs, verification, input homes, frees, views.
#include "passes/lower.h"

#include <gtest/gtest.h>

#include <random>

#include "ir/error.h"
#include "ir/parser.h"
#include "ir/printer.h"
#include "ir/verifier.h"
#include "passes/place_metf.h"
#include "test_graphs.h"

namespace modelpar::passes {
namespace {

using testing::machine;

constexpr const char* kDiamond = R"(
graph @diamond(%x: f32[256] input) {
  %a: f32[256] = aten::relu(%x) {cost={time_us=10.0, out=1024, temp=0, persist=0}}
  %b: f32[256] = aten::relu(%a) {cost={time_us=20.0, out=1024, temp=0, persist=0}}
  %c: f32[256] = aten::sigmoid(%a) {cost={time_us=20.0, out=1024, temp=0, persist=0}}
  %d: f32[256] = aten::add.Tensor(%b, %c) {cost={time_us=5.0, out=1024, temp=0, persist=0}}
  return %d
}
)";

// a, b on device 0; c, d on device 1 (m-ETF's plan, place_metf_test).
Placement diamondPlacement() {
  Placement p;
  p.placer = "test";
  p.num_devices = 2;
  p.node_device = {0, 0, 1, 1};
  p.order = {{0, 1}, {2, 3}};
  return p;
}

TEST(Lower, EmitsSendsAfterProducersRecvsBeforeUsesAndFrees) {
  ir::Graph g = ir::parseGraph(kDiamond);
  ir::Program p = lower(g, diamondPlacement());
  ir::Program expected = ir::parseProgram(R"(
program devices=2
graph @diamond(%x: f32[256] input {device=0}) {
  %a: f32[256] = aten::relu(%x) {device=0, cost={time_us=10.0, out=1024, temp=0, persist=0}}
  %b: f32[256] = aten::relu(%a) {device=0, cost={time_us=20.0, out=1024, temp=0, persist=0}}
  %c: f32[256] = aten::sigmoid(%a) {device=1, cost={time_us=20.0, out=1024, temp=0, persist=0}}
  %d: f32[256] = aten::add.Tensor(%b, %c) {device=1, cost={time_us=5.0, out=1024, temp=0, persist=0}}
  return %d
}
device 0 {
  run %a
  free %x
  send %a -> 1
  run %b
  free %a
  send %b -> 1
  free %b
}
device 1 {
  recv %a <- 0
  run %c
  free %a
  recv %b <- 0
  run %d
  free %b
  free %c
}
)");
  EXPECT_EQ(ir::print(p), ir::print(expected));
  EXPECT_NO_THROW(ir::verify(p));
  EXPECT_TRUE(g.node(0).device == std::nullopt);  // the caller's graph is untouched
}

TEST(Lower, WithoutFreesKeepsEverything) {
  ir::Graph g = ir::parseGraph(kDiamond);
  LowerOptions o;
  o.emit_frees = false;
  ir::Program p = lower(g, diamondPlacement(), o);
  EXPECT_EQ(p.schedule(0).size(), 4u);
  EXPECT_EQ(p.schedule(1).size(), 4u);
  EXPECT_NO_THROW(ir::verify(p));
}

TEST(Lower, SendsAnInputOnceToEachReadingDevice) {
  // %w lives on device 1 (the placement says so); devices 0 and 2 read it,
  // device 2 twice.
  ir::Graph g = ir::parseGraph(R"(
graph @fan(%w: f32[8] param) {
  %a: f32[8] = aten::relu(%w) {cost={time_us=1.0, out=32, temp=0, persist=0}}
  %b: f32[8] = aten::relu(%w) {cost={time_us=1.0, out=32, temp=0, persist=0}}
  %c: f32[8] = aten::add.Tensor(%w, %b) {cost={time_us=1.0, out=32, temp=0, persist=0}}
  return %a, %c
}
)");
  Placement pl;
  pl.num_devices = 3;
  pl.node_device = {0, 2, 2};
  pl.order = {{0}, {}, {1, 2}};
  pl.input_device = {1};
  ir::Program p = lower(g, pl);
  EXPECT_EQ(ir::print(p).substr(ir::print(p).find("device 0 {")), R"(device 0 {
  recv %w <- 1
  run %a
  free %w
}
device 1 {
  send %w -> 0
  send %w -> 2
}
device 2 {
  recv %w <- 1
  run %b
  run %c
  free %w
  free %b
}
)");
  EXPECT_NO_THROW(ir::verify(p));
}

TEST(Lower, KeepsAViewsBaseAliveUntilTheViewIsDone) {
  // %v views %h; %h may only be freed after %v's last use.
  ir::Graph g = ir::parseGraph(R"(
graph @views(%x: f32[4, 4] input) {
  %h: f32[4, 4] = aten::relu(%x) {cost={time_us=1.0, out=64, temp=0, persist=0}}
  %v: f32[16] = aten::view(%h, [16]) {cost={time_us=1.0, out=0, temp=0, persist=0}}
  %s: f32[16] = aten::sigmoid(%v) {cost={time_us=1.0, out=64, temp=0, persist=0}}
  %t: f32[16] = aten::exp(%s) {cost={time_us=1.0, out=64, temp=0, persist=0}}
  return %t
}
)");
  Placement pl;
  pl.num_devices = 1;
  pl.node_device = {0, 0, 0, 0};
  pl.order = {{0, 1, 2, 3}};
  ir::Program p = lower(g, pl);
  EXPECT_EQ(ir::print(p).substr(ir::print(p).find("device 0 {")), R"(device 0 {
  run %h
  free %x
  run %v
  run %s
  free %h
  free %v
  run %t
  free %s
}
)");
}

TEST(Lower, RejectsAPlacementThatMissesANode) {
  ir::Graph g = ir::parseGraph(kDiamond);
  Placement pl = diamondPlacement();
  pl.order[1].pop_back();
  try {
    lower(g, pl);
    FAIL();
  } catch (const ConfigError& e) {
    EXPECT_NE(std::string(e.what()).find("%d is not placed"), std::string::npos) << e.what();
  }
  pl = diamondPlacement();
  pl.order[0] = {1, 0};
  try {
    lower(g, pl);
    FAIL();
  } catch (const ConfigError& e) {
    EXPECT_NE(std::string(e.what()).find("runs %b before %a"), std::string::npos) << e.what();
  }
}

TEST(Lower, RandomPlacementsVerify) {
  std::mt19937 rng(5);
  for (int trial = 0; trial < 40; ++trial) {
    ir::Graph g = testing::randomDag(rng, 30, 0.2, 256);
    Placement p = placeMEtf(g, machine(1 + trial % 4, int64_t{1} << 40, 1.0, 64.0));
    for (bool frees : {false, true}) {
      LowerOptions o;
      o.emit_frees = frees;
      ir::Program prog = lower(g, p, o);
      EXPECT_NO_THROW(ir::verify(prog)) << ir::print(prog);
    }
  }
}

}  // namespace
}  // namespace modelpar::passes
