// Pass `schedule` with kind "zb-v" (Note [ZB-V] in
// passes/pipeline/schedule_zbv.cpp) on the uniform chains of
// testing::zeroBubbleChain, 2p layers over p devices: the device orders of
// the Note, every (devices, micro-batches) of a grid schedules, lowers,
// verifies and simulates, the simulated step against the closed form and
// against ZB-H1's and 1F1B's on the same layers, peak memory against
// 1F1B's, and the errors (placement, an order the graph contradicts).
#include <fmt/format.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <map>
#include <string>
#include <vector>

#include "ir/error.h"
#include "ir/verifier.h"
#include "passes/lower/lower.h"
#include "passes/lower/simulate.h"
#include "passes/pipeline/schedule.h"
#include "tests/passes/test_graphs.h"
#include "tests/support/expect_error.h"

namespace modelpar::passes {
namespace {

using testing::orderText;

using modelpar::testing::messageOf;
using testing::StagedGraph;
using testing::zeroBubbleChain;

// The V over p devices: stage s on device s for s < p, 2p-1-s after.
std::vector<int32_t> vPlacement(int p) {
  std::vector<int32_t> d;
  for (int s = 0; s < 2 * p; ++s) d.push_back(s < p ? s : 2 * p - 1 - s);
  return d;
}

// ZB-V over p devices: the chain of 2p layers, one per stage, in a V.
PipelineScheduleOptions zbvOptions(const StagedGraph& c, int p) {
  PipelineScheduleOptions o;
  o.kind = "zb-v";
  o.stage_of_node = c.stage_of_node;
  o.device_of_stage = vPlacement(p);
  return o;
}

// Free transfers: zero latency, a huge bandwidth.
DeviceModel freeLinks(int p) { return testing::machine(p, int64_t{1} << 40, 0.0, 1e24); }

SimulationReport lowerAndSimulate(const StagedGraph& c, const PipelineScheduleOptions& o, int p) {
  ir::Program prog = lower(c.g, schedulePipeline(c.g, o));
  ir::verify(prog);  // matched transfers, no deadlock
  return simulate(prog, freeLinks(p));
}

// ZB-V on p devices (2p stages of one layer).
SimulationReport runZbv(int p, int m, bool w_first = false) {
  const StagedGraph c = zeroBubbleChain(2 * p, m, w_first);
  return lowerAndSimulate(c, zbvOptions(c, p), p);
}

// `kind` ("zb-h1", "1f1b") on the same 2p layers cut into p stages of two,
// one per device.
SimulationReport runTwoLayerStages(const std::string& kind, int p, int m, bool w_first = false) {
  const StagedGraph c = zeroBubbleChain(2 * p, m, w_first, /*layers_per_stage=*/2);
  PipelineScheduleOptions o;
  o.kind = kind;
  o.stage_of_node = c.stage_of_node;
  return lowerAndSimulate(c, o, p);
}

// Note [ZB-V]'s example, p = 2, m = 4: device 0 holds stages 0 and 3,
// device 1 stages 1 and 2. Each task's nodes written out: stage 0 sends
// nothing back, so its b0_k is W and its B tasks are empty (B0.k is
// dropped; W0.k is b0_k w0_k); on stages 1..3 b is B and w is W.
//   device 0: F0.0 F0.1 F0.2 | F3.0 B3.0 W3.0 F3.1 B3.1 W3.1 |
//             F0.3 (B0.0) W0.0 F3.2 B3.2 W3.2 (B0.1) W0.1 F3.3 B3.3 W3.3 | (B0.2) W0.2 (B0.3) W0.3
//   device 1: F1.0 | F2.0 F1.1 | F2.1 B2.0 W2.0 |
//             F1.2 B1.0 W1.0 F2.2 B2.1 W2.1 F1.3 B1.1 W1.1 F2.3 B2.2 W2.2 | B1.2 B2.3 B1.3 W1.2 | W2.3 | W1.3
TEST(ZeroBubbleV, TwoDevicesFourMicroBatchesRunTheNotesOrders) {
  const StagedGraph c = zeroBubbleChain(4, 4);
  const Placement p = schedulePipeline(c.g, zbvOptions(c, 2));
  ASSERT_EQ(p.num_devices, 2);
  EXPECT_EQ(orderText(c.g, p, 0),
            "f0_0 f0_1 f0_2 "                                           // 2(p-d)-1 = 3 F0
            "f3_0 b3_0 w3_0 f3_1 b3_1 w3_1 "                            // p-d = 2 x F1 B1 W1
            "f0_3 b0_0 w0_0 f3_2 b3_2 w3_2 b0_1 w0_1 f3_3 b3_3 w3_3 "  // steady
            "b0_2 w0_2 b0_3 w0_3");                                     // p-d = 2 x B0 W0
  EXPECT_EQ(orderText(c.g, p, 1),
            "f1_0 "                                                     // 2(p-d)-1 = 1 F0
            "f2_0 f1_1 "                                                // d = 1 x F1 F0
            "f2_1 b2_0 w2_0 "                                           // p-d = 1 x F1 B1 W1
            "f1_2 b1_0 w1_0 f2_2 b2_1 w2_1 f1_3 b1_1 w1_1 f2_3 b2_2 w2_2 "
            "b1_2 b2_3 "                                                // d = 1 x B0 B1
            "b1_3 w1_2 "                                                // p-d = 1 x B0 W0
            "w2_3 w1_3");                                               // the W1's, the W0's left
}

// m = 1 < p = 2: the order of m' = 2p-1 = 3 micro-batches with the tasks of
// micro-batches 1 and 2 dropped.
TEST(ZeroBubbleV, FewerMicroBatchesThanDevicesDropTheMissingOnesTasks) {
  const StagedGraph c = zeroBubbleChain(4, 1);
  const Placement p = schedulePipeline(c.g, zbvOptions(c, 2));
  EXPECT_EQ(orderText(c.g, p, 0), "f0_0 f3_0 b3_0 w3_0 b0_0 w0_0");
  EXPECT_EQ(orderText(c.g, p, 1), "f1_0 f2_0 b2_0 w2_0 b1_0 w1_0");
}

// The deadlock-free grid: p = 1..8 devices (2..16 stages) x m = 1..32
// micro-batches (m < p and m < 2p-1 included) schedule (the clock finds no
// task waiting forever), lower to a Program that verifies (matched
// transfers, no deadlock) and simulate, every device busy 6m us (two
// layers of F, B and W per micro-batch). 256 cases.
TEST(ZeroBubbleV, EveryDeviceCountAndMicroBatchCountRuns) {
  for (int p = 1; p <= 8; ++p) {
    for (int m = 1; m <= 32; ++m) {
      SCOPED_TRACE(fmt::format("p={} m={}", p, m));
      SimulationReport r;
      ASSERT_NO_THROW(r = runZbv(p, m));
      ASSERT_EQ(r.devices.size(), static_cast<size_t>(p));
      for (const DeviceReport& d : r.devices) EXPECT_DOUBLE_EQ(d.compute_busy_us, 6.0 * m);
    }
  }
}

// Note [ZB-V]'s closed form, F = B = W = 1 us per layer, free transfers:
// max(6m + p-1, 4(m + p) - 2), i.e. 6m + p-1 for m >= (3p-1)/2 (so for
// every m >= 2p-1): p-1 idle us per device, the bubble (p-1)/(6m + p-1).
// E.g. p = 4, m = 8: 51 us, bubble 3/51 = 5.9 %; m = 2: 22 us. Either node
// order in the backward gives the same.
TEST(ZeroBubbleV, StepIsSixMPlusPMinusOne) {
  for (int p = 1; p <= 8; ++p) {
    for (int m = 1; m <= 32; ++m) {
      SCOPED_TRACE(fmt::format("p={} m={}", p, m));
      const double expected = std::max(6.0 * m + p - 1, 4.0 * (m + p) - 2);
      if (m >= 2 * p - 1) EXPECT_EQ(expected, 6.0 * m + p - 1);
      for (bool w_first : {false, true}) {
        EXPECT_NEAR(runZbv(p, m, w_first).step_time_us, expected, 1e-9)
            << (w_first ? "w first" : "b first");
      }
    }
  }
  EXPECT_NEAR(runZbv(4, 8).step_time_us, 51.0, 1e-9);
  EXPECT_NEAR(runZbv(4, 2).step_time_us, 22.0, 1e-9);
}

// The same 2p layers on p devices as p stages of two layers (F = B = W = 2
// us per stage). ZB-H1: 6m + 2(p-1) for m >= p (Note [ZB-H1]'s 3m + (p-1)
// at twice the time), 4(m + p) - 2 for m < p; 1F1B with its backward in
// one piece (w first): 6(m + p-1). ZB-V is strictly faster than 1F1B for p
// >= 2 and than ZB-H1 for m > p (p-1 idle us per device against 2(p-1));
// for m <= p both are 4(m + p) - 2, the last micro-batch's way through the
// model. E.g. p = 4, m = 8: ZB-V 51 us, ZB-H1 54 us, 1F1B 66 us.
TEST(ZeroBubbleV, FasterThanZeroBubbleH1AndOneFOneBOnTheSameLayers) {
  for (int p = 2; p <= 8; ++p) {
    for (int m = 1; m <= 32; ++m) {
      SCOPED_TRACE(fmt::format("p={} m={}", p, m));
      const double zbv = runZbv(p, m).step_time_us;
      const double zbh1 = runTwoLayerStages("zb-h1", p, m).step_time_us;
      const double one = runTwoLayerStages("1f1b", p, m, /*w_first=*/true).step_time_us;
      EXPECT_NEAR(zbh1, m >= p ? 6.0 * m + 2 * (p - 1) : 4.0 * (m + p) - 2, 1e-9);
      EXPECT_NEAR(one, 6.0 * (m + p - 1), 1e-9);
      EXPECT_LT(zbv, one - 0.5);
      if (m > p) {
        EXPECT_LT(zbv, zbh1 - 0.5);
      } else {
        EXPECT_NEAR(zbv, zbh1, 1e-9);
      }
    }
  }
  EXPECT_NEAR(runZbv(4, 8).step_time_us, 51.0, 1e-9);
  EXPECT_NEAR(runTwoLayerStages("zb-h1", 4, 8).step_time_us, 54.0, 1e-9);
  EXPECT_NEAR(runTwoLayerStages("1f1b", 4, 8, true).step_time_us, 66.0, 1e-9);
}

// The most (layer, micro-batch) pairs device d holds between their forward
// and their W: +1 at each f<l>_<k> of its order, -1 at each w<l>_<k>.
int mostLayersInFlight(const StagedGraph& c, const Placement& p, int d) {
  int now = 0, most = 0;
  for (ir::NodeId n : p.order[static_cast<size_t>(d)]) {
    const char kind = c.g.nodeRef(n)[1];
    now += kind == 'f' ? 1 : kind == 'w' ? -1 : 0;
    most = std::max(most, now);
  }
  return most;
}

// Memory. Counted as the paper counts it, in layers of micro-batches whose
// forward ran and whose W has not: every device of ZB-V holds at most 2p,
// exactly 2p for m >= 2p-1 (Note [ZB-V]: chunk 0's 2p-d forwards and chunk
// 1's d after its W's), the count 1F1B keeps on its first device (p
// micro-batches of two layers) and ZB-V on every device.
// In bytes (simulated peaks; every value 4 bytes): on this chain a B frees
// nothing (W reads all that B reads) and creates the gradient that the
// previous layer's W reads, so each W the cool-down defers holds a
// gradient as large as an activation. Device 0 defers none and peaks at
// most at 1F1B's device 0; device p-1 defers 2(p-1) and peaks highest,
// 16p + 4 bytes for m >= 2p-1, against 1F1B's largest 8p + 24 (m >= 2p, p
// >= 2): 0.9 times at p = 2, 1.21 at p = 4, 1.5 at p = 8, under 2 times
// for any p. ZB-H1 on the same layers peaks as high or higher (equal for p
// >= 3 and m >= 2p-1). E.g. p = 4, m = 8: ZB-V {48, 48, 56, 68}, 1F1B {56,
// 44, 36, 24}, ZB-H1 {56, 60, 68, 60}.
TEST(ZeroBubbleV, PeakMemoryIsOneFOneBsLayerCountAndUnderTwiceItsBytes) {
  for (int p = 1; p <= 8; ++p) {
    for (int m : {1, p, 2 * p - 1, 2 * p, 4 * p, 32}) {
      SCOPED_TRACE(fmt::format("p={} m={}", p, m));
      const StagedGraph c = zeroBubbleChain(2 * p, m);
      const Placement placed = schedulePipeline(c.g, zbvOptions(c, p));
      for (int d = 0; d < p; ++d) {
        const int most = mostLayersInFlight(c, placed, d);
        EXPECT_LE(most, 2 * p) << "device " << d;
        if (m >= 2 * p - 1) EXPECT_EQ(most, 2 * p) << "device " << d;
      }
      const SimulationReport zbv = runZbv(p, m);
      const SimulationReport one = runTwoLayerStages("1f1b", p, m);
      const SimulationReport h1 = runTwoLayerStages("zb-h1", p, m);
      auto largest = [](const SimulationReport& r) {
        int64_t most = 0;
        for (const DeviceReport& d : r.devices) most = std::max(most, d.peak_bytes);
        return most;
      };
      EXPECT_LE(zbv.devices[0].peak_bytes, one.devices[0].peak_bytes);
      EXPECT_LT(largest(zbv), 2 * largest(one));
      EXPECT_LE(largest(zbv), largest(h1));
      if (p >= 2 && m >= 2 * p - 1) {  // one device sends nothing: its buffers differ
        EXPECT_EQ(zbv.devices[static_cast<size_t>(p - 1)].peak_bytes, 16 * p + 4);
        EXPECT_EQ(largest(zbv), 16 * p + 4);
        if (p >= 3) EXPECT_EQ(largest(zbv), largest(h1));
      }
      if (p >= 2 && m >= 2 * p) EXPECT_EQ(largest(one), 8 * p + 24);
    }
  }
  std::vector<int64_t> zbv, one;
  for (const DeviceReport& d : runZbv(4, 8).devices) zbv.push_back(d.peak_bytes);
  for (const DeviceReport& d : runTwoLayerStages("1f1b", 4, 8).devices) one.push_back(d.peak_bytes);
  EXPECT_EQ(zbv, (std::vector<int64_t>{48, 48, 56, 68}));
  EXPECT_EQ(one, (std::vector<int64_t>{56, 44, 36, 24}));
}

// A placement that is not the V: every stage named with the device it
// needs, and the placement to give.
TEST(ZeroBubbleV, RefusesAPlacementThatIsNotTheV) {
  const StagedGraph c = zeroBubbleChain(4, 2);
  PipelineScheduleOptions o = zbvOptions(c, 2);
  o.device_of_stage = {0, 1, 0, 1};  // interleaved's looping placement
  EXPECT_HAS(messageOf<ConfigError>([&] { schedulePipeline(c.g, o); }),
             "schedule 'zb-v' places the 4 stages in a V over 2 devices (stage s on device s for "
             "s < 2, on device 3 - s after), but stage 2 is on device 0; give device_of_stage = "
             "[0, 1, 1, 0] (stage 2 on device 1)");
  o.device_of_stage.clear();  // one stage per device
  EXPECT_HAS(messageOf<ConfigError>([&] { schedulePipeline(c.g, o); }),
             "but stage 2 is on device 2; give device_of_stage = [0, 1, 1, 0]");
  const StagedGraph three = zeroBubbleChain(3, 2);
  o = zbvOptions(three, 2);
  o.device_of_stage = {0, 1, 0};
  EXPECT_HAS(messageOf<ConfigError>([&] { schedulePipeline(three.g, o); }),
             "schedule 'zb-v' runs 2 stages per device placed in a V (n = 2p), but there are 3 "
             "stages");
}

// Micro-batch 0's B on stage 3 reads micro-batch 1's forward there, which
// device 0 runs after it (F3.0 B3.0 W3.0 F3.1 ..): the order is fixed, so
// the clock's blocked tasks are the error.
TEST(ZeroBubbleV, RejectsAnEdgeTheOrderContradictsNamingTheBlockedTasks) {
  const StagedGraph c = zeroBubbleChain(4, 2, false, 1, {{"b3_0", "f3_1"}});
  const std::string msg = messageOf<ConfigError>([&] { schedulePipeline(c.g, zbvOptions(c, 2)); });
  EXPECT_HAS(msg, "the device orders of ZB-V contradict the graph's dependencies");
  EXPECT_HAS(msg, "B0 of stage 3 waits (%b3_0 reads %f3_1 of F1 of stage 3)");
}

// An unknown kind names zb-v among the valid ones.
TEST(ZeroBubbleV, UnknownScheduleListsZbV) {
  const StagedGraph c = zeroBubbleChain(2, 2);
  PipelineScheduleOptions o = zbvOptions(c, 1);
  o.kind = "zb-w";
  EXPECT_HAS(messageOf<ConfigError>([&] { schedulePipeline(c.g, o); }), "\"zb-v\"");
}

}  // namespace
}  // namespace modelpar::passes
