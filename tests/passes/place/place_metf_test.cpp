// Pass `place-metf`: hand-computed schedules, memory limits, colocation,
// and the PlanDoesNotFitError message.
#include "passes/place/place_metf.h"

#include <gtest/gtest.h>

#include "ir/error.h"
#include "ir/parser.h"
#include "tests/passes/test_graphs.h"

namespace modelpar::passes {
namespace {

using testing::machine;
using testing::kDiamond;

TEST(PlaceMEtf, SplitsDiamondAtHandComputedMakespan) {
  ir::Graph g = ir::parseGraph(kDiamond);
  Placement p = placeMEtf(g, machine(2));
  // t=0:  a on 0 (tie -> device 0), 0..10.
  // t=10: b and c ready; b (first in BFS order) on 0 at 10, ends 30; c on 1 at
  //       13 after a's transfer 10..13, ends 33.
  // t=33: d on 1 needs b: transfer 30..33 -> starts 33; on 0 it would need c
  //       33..36. d on 1, 33..38.
  EXPECT_EQ(p.placer, "place-metf");
  EXPECT_EQ(p.node_device, (std::vector<int32_t>{0, 0, 1, 1}));
  EXPECT_EQ(p.order, (std::vector<std::vector<ir::NodeId>>{{0, 1}, {2, 3}}));
  EXPECT_EQ(p.input_device, (std::vector<int32_t>{0}));
  EXPECT_EQ(p.start_us, (std::vector<double>{0, 10, 13, 33}));
  EXPECT_DOUBLE_EQ(p.makespan_us, 38.0);
  // Memory bound: device 0 holds %x (1 KiB, whole step) + %a + %b;
  // device 1 holds the copies of %a then %b, %c and %d (at most three at once).
  EXPECT_EQ(p.peak_bytes, (std::vector<int64_t>{3072, 3072}));
  EXPECT_NO_THROW(checkPlacement(g, p));
}

TEST(PlaceMEtf, KeepsEverythingOnOneDeviceWhenTransfersAreSlow) {
  ir::Graph g = ir::parseGraph(kDiamond);
  // 1 KiB at 1 B/us: 1026 us per transfer, more than the 55 us of work.
  Placement p = placeMEtf(g, machine(2, int64_t{1} << 40, 2.0, 1.0));
  EXPECT_EQ(p.node_device, (std::vector<int32_t>{0, 0, 0, 0}));
  EXPECT_DOUBLE_EQ(p.makespan_us, 55.0);
}

TEST(PlaceMEtf, FitsExactlyAtCapacity) {
  ir::Graph g = ir::parseGraph(kDiamond);
  Placement p = placeMEtf(g, machine(2, 3072));
  EXPECT_DOUBLE_EQ(p.makespan_us, 38.0);
  EXPECT_EQ(p.peak_bytes, (std::vector<int64_t>{3072, 3072}));
}

TEST(PlaceMEtf, RespectsEachDevicesOwnCapacity) {
  ir::Graph g = ir::parseGraph(kDiamond);
  // Device 0 holds 1.5 KiB: a alone needs %x + %a = 2 KiB, and b or c a copy
  // of %a + their output = 2 KiB. Everything runs on device 1: 10+20+20+5.
  DeviceSpec small, big;
  small.memory_bytes = 1536;
  big.memory_bytes = int64_t{1} << 20;
  DeviceModel m = DeviceModel::fromDevices({small, big}, LinkSpec{2.0, 1.024e9});
  Placement p = placeMEtf(g, m);
  EXPECT_EQ(p.node_device, (std::vector<int32_t>{1, 1, 1, 1}));
  EXPECT_DOUBLE_EQ(p.makespan_us, 55.0);
  EXPECT_EQ(p.peak_bytes[0], 0);
}

TEST(PlaceMEtf, ReportsTheLayerDeviceAndBytesWhenNothingFits) {
  ir::Graph g = ir::parseGraph(kDiamond);
  // 2.5 KiB per device: a on 0 (%x + %a = 2 KiB); b must go to 1 (copy of %a +
  // %b); then c fits nowhere: 1 KiB more on device 0 (512 B left) or 1 (512 B left).
  try {
    placeMEtf(g, machine(2, 2560));
    FAIL();
  } catch (const PlanDoesNotFitError& e) {
    EXPECT_STREQ(e.what(),
                 "modelpar place-metf: layer 'c' needs 1.0 KiB on device 0, which has 512 B "
                 "available of 2.5 KiB; use more devices or enable checkpointing");
  }
}

TEST(PlaceMEtf, PlacesAWholeLayerWhereItsFirstNodeRuns) {
  // fwd and bwd of layer "L" share a device even though bwd could start
  // earlier elsewhere.
  ir::Graph g = ir::parseGraph(R"(
graph @fb(%x: f32[256] input, %y: f32[256] input) {
  %f: f32[256] = aten::relu(%x) {layer="L", phase=fwd, cost={time_us=10.0, out=1024, temp=0, persist=4096}}
  %o: f32[256] = aten::relu(%y) {layer="other", cost={time_us=30.0, out=1024, temp=0, persist=0}}
  %b: f32[256] = aten::relu(%o) {layer="L", phase=bwd, cost={time_us=10.0, out=1024, temp=0, persist=0}}
  return %f, %b
}
)");
  Placement p = placeMEtf(g, machine(2));
  EXPECT_EQ(p.node_device[0], p.node_device[2]);
  EXPECT_NE(p.node_device[0], p.node_device[1]);
}

TEST(PlaceMEtf, RejectsMoreThanSixtyFourDevices) {
  ir::Graph g = ir::parseGraph(kDiamond);
  EXPECT_THROW(placeMEtf(g, machine(65)), ConfigError);
}

}  // namespace
}  // namespace modelpar::passes
