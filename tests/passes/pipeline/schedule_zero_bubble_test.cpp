// Pass `schedule` with kind "zb-h1" (Note [ZB-H1] in
// passes/pipeline/schedule_zero_bubble.cpp) on uniform chains whose backward
// has a B node and a W node per (stage, micro-batch): the stage orders of the
// Note, the simulated step against the closed form and against 1F1B's, every
// (devices, micro-batches) of a grid schedules, lowers, verifies and
// simulates, peak memory against 1F1B's, and the placement error.
#include <fmt/format.h>
#include <gtest/gtest.h>

#include <algorithm>
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

// The uniform chain of testing::zeroBubbleChain, one layer per stage: per
// (stage s, micro-batch k) f<s>_<k>, b<s>_<k> (B for s >= 1, W on stage 0)
// and w<s>_<k> (W), every node 1 us and 4 bytes. Under 1F1B the backward
// task is b and w together (2 us), b first (the default) or, with w_first,
// w first (the paper's 1F1B, whose backward is one piece).
using Chain = testing::StagedGraph;

Chain zbChain(int n, int m, bool w_first = false) { return testing::zeroBubbleChain(n, m, w_first); }

PipelineScheduleOptions options(const Chain& c, const std::string& kind) {
  PipelineScheduleOptions o;
  o.kind = kind;
  o.stage_of_node = c.stage_of_node;
  return o;
}

// Free transfers: zero latency, a huge bandwidth.
DeviceModel freeLinks(int p) { return testing::machine(p, int64_t{1} << 40, 0.0, 1e24); }

// Scheduled, lowered, verified (matched transfers, no deadlock), simulated.
SimulationReport run(const std::string& kind, int p, int m, bool w_first = false) {
  const Chain c = zbChain(p, m, w_first);
  ir::Program prog = lower(c.g, schedulePipeline(c.g, options(c, kind)));
  ir::verify(prog);
  return simulate(prog, freeLinks(p));
}

// Note [ZB-H1]'s example, n = 3, m = 4, with the B and W of each task
// written out: stage 0's b0_k is W (nothing is sent back from stage 0), so
// it runs with w0_k where the Note has W; stage s defers its W's by s steps.
TEST(ZeroBubbleH1, ThreeStagesFourMicroBatchesRunTheNotesOrders) {
  const Chain c = zbChain(3, 4);
  const Placement p = schedulePipeline(c.g, options(c, "zb-h1"));
  EXPECT_EQ(orderText(c.g, p, 0),
            "f0_0 f0_1 f0_2 b0_0 w0_0 f0_3 b0_1 w0_1 b0_2 w0_2 b0_3 w0_3");
  EXPECT_EQ(orderText(c.g, p, 1),
            "f1_0 f1_1 b1_0 f1_2 b1_1 w1_0 f1_3 b1_2 w1_1 b1_3 w1_2 w1_3");
  EXPECT_EQ(orderText(c.g, p, 2),
            "f2_0 b2_0 f2_1 b2_1 f2_2 b2_2 w2_0 f2_3 b2_3 w2_1 w2_2 w2_3");
}

// The bubble with T_F = T_B = T_W = 1 us and free transfers, p = 2..8
// stages on as many devices, every device busy 3m us. ZB-H1's step, by Note
// [ZB-H1]'s order: 3m + (p-1) for m >= p, the paper's (p-1)(T_F + T_B -
// T_W) = p-1 idle us per device (asserted exactly; the bar was 2 %); for
// m < p, 2(m + p-1) + 1: micro-batch m-1's forward crosses p stages after
// m-1 others, its B comes back over p stages, and one W follows. Either node
// order in the task gives the same. 1F1B, backward in one piece (w first):
// 3(m + p-1), the paper's (p-1)(T_F + T_B + T_W), three times ZB-H1's idle
// time; 1F1B with b first in the task already sends the gradient after b:
// 3m + 2(p-1), twice ZB-H1's idle time.
// E.g. p = 4, m = 8: ZB-H1 27 us, 1F1B 33 us (b first 30 us); bubble 3/27 =
// 11 % against 9/33 = 27 % (6/30 = 20 %).
TEST(ZeroBubbleH1, StepIsThreeMPlusPMinusOneAThirdOfOneFOneBsBubble) {
  for (int p = 2; p <= 8; ++p) {
    for (int m = 1; m <= 32; ++m) {
      SCOPED_TRACE(fmt::format("p={} m={}", p, m));
      const double expected = m >= p ? 3.0 * m + (p - 1) : 2.0 * (m + p - 1) + 1;
      for (bool w_first : {false, true}) {
        const double zb = run("zb-h1", p, m, w_first).step_time_us;
        EXPECT_NEAR(zb, expected, 1e-9) << (w_first ? "w first" : "b first");
        EXPECT_NEAR(zb, expected, 0.02 * expected);
      }
      const double one = run("1f1b", p, m, /*w_first=*/true).step_time_us;
      const double one_b_first = run("1f1b", p, m).step_time_us;
      EXPECT_NEAR(one, 3.0 * (m + p - 1), 1e-9);
      EXPECT_NEAR(one_b_first, 3.0 * m + 2 * (p - 1), 1e-9);
      if (m >= p) {
        const double idle = expected - 3.0 * m;
        EXPECT_NEAR(idle, (one - 3.0 * m) / 3, 1e-9);
        EXPECT_NEAR(idle, (one_b_first - 3.0 * m) / 2, 1e-9);
      }
    }
  }
}

// The deadlock-free grid: p = 2..8 devices x m = 1..32 micro-batches (m < p
// included) schedule (the clock finds no task waiting forever), lower to a
// Program that verifies (matched transfers, no deadlock) and simulate, every
// device busy 3m us. 224 cases.
TEST(ZeroBubbleH1, EveryDeviceCountAndMicroBatchCountRuns) {
  for (int p = 2; p <= 8; ++p) {
    for (int m = 1; m <= 32; ++m) {
      SCOPED_TRACE(fmt::format("p={} m={}", p, m));
      SimulationReport r;
      ASSERT_NO_THROW(r = run("zb-h1", p, m));
      ASSERT_EQ(r.devices.size(), static_cast<size_t>(p));
      for (const DeviceReport& d : r.devices) EXPECT_DOUBLE_EQ(d.compute_busy_us, 3.0 * m);
    }
  }
}

// Memory, measured (simulated peak bytes per device). Stage s keeps up to
// n micro-batches whose W has not run (Note [ZB-H1]), 1F1B's count on stage
// 0, where 1F1B keeps n - s; a deferred W also holds what it reads from its
// B's time on, here the incoming gradient (4 bytes, as large as the
// activation f). Stage 0 defers nothing: its peak is 1F1B's. For m >= 2p,
// stage s >= 1 peaks at 1F1B's stage-0 peak + 4(s-1) bytes: p = 4, m = 8:
// ZB-H1 {32, 32, 36, 40} against 1F1B {32, 24, 20, 16}; p = 8, m = 16:
// {48, 48, 52, .., 72} against {48, 40, .., 16}. The largest peak over the
// devices is thus 1 + 4(p-2)/peak_0 times 1F1B's (1.5 at p = 8, m >= 16),
// not equal
// to it: the paper's "same peak memory" (§3.1) counts a deferred W as
// holding less than a micro-batch's activations (M_W < M_B), which this
// chain, whose gradients are as large as its activations, does not have.
TEST(ZeroBubbleH1, PeakMemoryIsOneFOneBsOnStageZeroAndGrowsByTheDeferredWs) {
  for (int p = 2; p <= 8; ++p) {
    for (int m : {p, 2 * p, 32}) {
      SCOPED_TRACE(fmt::format("p={} m={}", p, m));
      const SimulationReport zb = run("zb-h1", p, m);
      const SimulationReport one = run("1f1b", p, m);
      const int64_t peak0 = one.devices[0].peak_bytes;
      EXPECT_EQ(zb.devices[0].peak_bytes, peak0);
      int64_t zb_max = 0;
      for (int s = 1; s < p; ++s) {
        const int64_t peak = zb.devices[static_cast<size_t>(s)].peak_bytes;
        EXPECT_GE(peak, one.devices[static_cast<size_t>(s)].peak_bytes);
        if (m >= 2 * p) EXPECT_EQ(peak, peak0 + 4 * (s - 1)) << "stage " << s;
        zb_max = std::max(zb_max, peak);
      }
      // At most p-1 deferred gradients above 1F1B's largest peak (m = p: p = 8
      // peaks at 68 bytes against 40, 1.7 times).
      EXPECT_LE(zb_max, peak0 + 4 * (p - 1));
    }
  }
}

// ZB-H1 runs one stage per device.
TEST(ZeroBubbleH1, RefusesTwoStagesOnOneDevice) {
  const Chain c = zbChain(3, 2);
  PipelineScheduleOptions o = options(c, "zb-h1");
  o.device_of_stage = {0, 1, 0};
  const std::string msg = messageOf<ConfigError>([&] { schedulePipeline(c.g, o); });
  EXPECT_HAS(msg, "schedule 'zb-h1' runs one stage per device");
  EXPECT_HAS(msg, "stages 0 and 2 are both on device 0");
}

// An unknown kind names zb-h1 among the valid ones.
TEST(ZeroBubbleH1, UnknownScheduleListsZbH1) {
  const Chain c = zbChain(2, 2);
  const std::string msg = messageOf<ConfigError>([&] { schedulePipeline(c.g, options(c, "zb-h2")); });
  EXPECT_HAS(msg, "\"zb-h1\"");
}

}  // namespace
}  // namespace modelpar::passes
