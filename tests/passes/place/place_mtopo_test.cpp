// Pass `place-mtopo`: contiguous memory-balanced splits, the non-uniform
// variant, colocation, and the error for plans that do not fit.
#include "passes/place/place_mtopo.h"

#include <gtest/gtest.h>

#include "ir/error.h"
#include "ir/parser.h"
#include "tests/passes/test_graphs.h"

namespace modelpar::passes {
namespace {

using testing::machine;

// %x -> a -> b -> c -> d, every value 1 KiB, every node 10 us.
constexpr const char* kChain = R"(
graph @chain(%x: f32[256] input) {
  %a: f32[256] = aten::relu(%x) {layer="l0", cost={time_us=10.0, out=1024, temp=0, persist=0}}
  %b: f32[256] = aten::relu(%a) {layer="l1", cost={time_us=10.0, out=1024, temp=0, persist=0}}
  %c: f32[256] = aten::relu(%b) {layer="l2", cost={time_us=10.0, out=1024, temp=0, persist=0}}
  %d: f32[256] = aten::relu(%c) {layer="l3", cost={time_us=10.0, out=1024, temp=0, persist=0}}
  return %d
}
)";

TEST(PlaceMTopo, BalancesMemoryAlongTopologicalOrder) {
  ir::Graph g = ir::parseGraph(kChain);
  Placement p = placeMTopo(g, machine(2));
  // Uniform cap = 4 KiB / 2 + 1 KiB = 3 KiB.
  // Device 0: a (1 KiB + %x homed, 1 KiB) = 2 KiB, b -> 3 KiB; c would be 5 KiB.
  // Device 1: c (1 KiB + copy of %b) = 2 KiB, d -> 3 KiB.
  EXPECT_EQ(p.node_device, (std::vector<int32_t>{0, 0, 1, 1}));
  // a 0..10, b 10..20, %b to device 1 20..23 (2 + 1 us), c 23..33, d 33..43.
  EXPECT_DOUBLE_EQ(p.makespan_us, 43.0);
  EXPECT_EQ(p.order, (std::vector<std::vector<ir::NodeId>>{{0, 1}, {2, 3}}));
}

TEST(PlaceMTopo, NonUniformFillsTheFirstDevice) {
  ir::Graph g = ir::parseGraph(kChain);
  MTopoOptions o;
  o.uniform = false;
  Placement p = placeMTopo(g, machine(2, 8192), o);
  EXPECT_EQ(p.node_device, (std::vector<int32_t>{0, 0, 0, 0}));
  EXPECT_DOUBLE_EQ(p.makespan_us, 40.0);
  // 2.5 KiB each: a = 2 KiB, b would make 3 KiB -> device 1 (b + copy of %a =
  // 2 KiB), c -> 3 KiB > 2.5: no device left.
  try {
    placeMTopo(g, machine(2, 2560), o);
    FAIL();
  } catch (const PlanDoesNotFitError& e) {
    std::string m = e.what();
    EXPECT_NE(m.find("modelpar place-mtopo: layer 'l2' needs 1.0 KiB on device 1"), std::string::npos) << m;
    EXPECT_NE(m.find("512 B available of 2.5 KiB"), std::string::npos) << m;
    EXPECT_NE(m.find("use more devices or enable checkpointing"), std::string::npos) << m;
  }
}

TEST(PlaceMTopo, ChargesAWholeLayerWhenItsFirstNodeIsMet) {
  // Layer "big" (fwd + bwd: 6 KiB persistent + two 1 KiB outputs) goes where
  // its fwd lands, with %x: 9 KiB of device 0's 10 KiB. "mid" (1 KiB out +
  // 2 KiB workspace) no longer fits there and opens device 1; big's bwd
  // still follows its fwd, receiving %m (9 + 1 = 10 KiB).
  ir::Graph g = ir::parseGraph(R"(
graph @fb(%x: f32[256] input) {
  %f: f32[256] = aten::relu(%x) {layer="big", phase=fwd, cost={time_us=10.0, out=1024, temp=0, persist=6144}}
  %m: f32[256] = aten::relu(%f) {layer="mid", cost={time_us=10.0, out=1024, temp=2048, persist=0}}
  %b: f32[256] = aten::relu(%m) {layer="big", phase=bwd, cost={time_us=10.0, out=1024, temp=0, persist=0}}
  return %b
}
)");
  MTopoOptions o;
  o.uniform = false;
  Placement p = placeMTopo(g, machine(2, 10240), o);
  EXPECT_EQ(p.node_device[0], 0);
  EXPECT_EQ(p.node_device[1], 1);
  EXPECT_EQ(p.node_device[2], 0);
}

TEST(PlaceMTopo, FailsWhenTheFirstLayerFitsNowhere) {
  ir::Graph g = ir::parseGraph(kChain);
  EXPECT_THROW(placeMTopo(g, machine(2, 1536)), PlanDoesNotFitError);
}

}  // namespace
}  // namespace modelpar::passes
