// Pass `schedule` with kind "interleaved" (Note [Interleaved 1F1B] in
// passes/pipeline/schedule_interleaved.cpp), beside GPipe and 1F1B on the
// same uniform chains: every (schedule, devices, micro-batches) of a grid
// schedules, lowers to a Program that verifies and simulates; the bubble
// fractions of 1F1B and interleaved 1F1B against their closed forms; device
// orders written out; the warm-up raised when an order cannot run; the
// placement errors.
#include <fmt/format.h>
#include <gtest/gtest.h>

#include <functional>
#include <map>
#include <random>
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

// A uniform chain of n stages over m micro-batches: per (stage s,
// micro-batch k) a forward f<s>_<k> (1 us) and a backward b<s>_<k> (2 us),
// 4-byte values, built with the IR builder:
//
//   %x -> f0_k -> f1_k -> .. -> f(n-1)_k
//          |       |              |
//         b0_k <- b1_k <- .. <- b(n-1)_k      (b_s reads f_s and b_(s+1))
//
// Every forward is built before every backward, and backwards from the last
// micro-batch to the first, so that `extra` (reader -> read, by name) may
// add an edge from any forward or from a later micro-batch's backward.
// `time_us`, when given, sets each node's time instead.
struct UniformChain {
  ir::Graph g{"uniform_chain"};
  std::vector<int32_t> stage_of_node;
};

UniformChain uniformChain(int n, int m, const std::multimap<std::string, std::string>& extra = {},
                          const std::function<double()>& time_us = nullptr) {
  UniformChain c;
  ir::Graph& g = c.g;
  std::map<std::string, ir::ValueId> value;
  auto add = [&](const std::string& name, std::vector<ir::ValueId> ins, double us, int s, int k,
                 ir::Phase phase) {
    for (auto [e, end] = extra.equal_range(name); e != end; ++e) ins.push_back(value.at(e->second));
    if (time_us) us = time_us();
    const ir::NodeId id = testing::addTask(g, name, ins, 4, us);
    g.node(id).microbatch = k;
    g.node(id).phase = phase;
    c.stage_of_node.push_back(s);
    return value[name] = g.node(id).outputs[0];
  };
  const ir::ValueId x = g.addInput("x", testing::f32(1), ir::InputRole::Input);
  for (int k = 0; k < m; ++k) {
    for (int s = 0; s < n; ++s) {
      add(fmt::format("f{}_{}", s, k), {s == 0 ? x : value.at(fmt::format("f{}_{}", s - 1, k))}, 1.0,
          s, k, ir::Phase::Forward);
    }
  }
  for (int k = m - 1; k >= 0; --k) {
    for (int s = n - 1; s >= 0; --s) {
      std::vector<ir::ValueId> ins{value.at(fmt::format("f{}_{}", s, k))};
      if (s + 1 < n) ins.insert(ins.begin(), value.at(fmt::format("b{}_{}", s + 1, k)));
      add(fmt::format("b{}_{}", s, k), ins, 2.0, s, k, ir::Phase::Backward);
    }
  }
  return c;
}

// A schedule over p devices: one stage per device, or for "interleaved" v
// stages per device placed looping (stage s on device s % p), or for "zb-v"
// 2 placed in a V (stage s on device s for s < p, 2p-1-s after).
struct Kind {
  const char* kind;
  int v;
  std::string label() const { return v > 1 ? fmt::format("{} v={}", kind, v) : kind; }
};
constexpr Kind kGPipe{"gpipe", 1}, kOneFOneB{"1f1b", 1};

PipelineScheduleOptions scheduleOptions(const UniformChain& c, const Kind& k, int p) {
  PipelineScheduleOptions o;
  o.kind = k.kind;
  o.stage_of_node = c.stage_of_node;
  const bool vee = std::string(k.kind) == "zb-v";
  for (int s = 0; s < p * k.v; ++s) o.device_of_stage.push_back(!vee ? s % p : s < p ? s : 2 * p - 1 - s);
  return o;
}

// Free transfers: zero latency, a huge bandwidth.
DeviceModel freeLinks(int p) { return testing::machine(p, int64_t{1} << 40, 0.0, 1e24); }

// PipelinePlan::bubbleFraction: 1 - busy / (devices x step).
double bubble(const SimulationReport& r) {
  double busy = 0;
  for (const DeviceReport& d : r.devices) busy += d.compute_busy_us;
  return 1.0 - busy / (static_cast<double>(r.devices.size()) * r.step_time_us);
}

// Schedules, lowers, verifies (no deadlock) and simulates kind k on the
// uniform chain of p·v stages.
SimulationReport simulateKind(const Kind& k, int p, int m) {
  const UniformChain c = uniformChain(p * k.v, m);
  ir::Program prog = lower(c.g, schedulePipeline(c.g, scheduleOptions(c, k, p)));
  ir::verify(prog);
  return simulate(prog, freeLinks(p));
}

// Every schedule on p = 2..8 devices with m = 1..32 micro-batches (m < p
// too): scheduled (the clock finds no task waiting forever), lowered,
// verified (matched transfers, no deadlock) and simulated, every device busy
// v·m·(1 + 2) us; interleaved's and ZB-V's bubble never above 1F1B's (ZB-V's
// B/W split leaves this chain's backwards whole, but stage 0's, all W).
// 1120 cases, about a second here.
TEST(InterleavedSchedule, EveryKindOnTwoToEightDevicesAndOneToThirtyTwoMicroBatchesRuns) {
  for (int p = 2; p <= 8; ++p) {
    for (int m = 1; m <= 32; ++m) {
      double one_f_one_b = 1;
      for (const Kind& k :
           {kGPipe, kOneFOneB, Kind{"interleaved", 2}, Kind{"interleaved", 3}, Kind{"zb-v", 2}}) {
        SCOPED_TRACE(fmt::format("{} p={} m={}", k.label(), p, m));
        SimulationReport r;
        ASSERT_NO_THROW(r = simulateKind(k, p, m));
        ASSERT_EQ(r.devices.size(), static_cast<size_t>(p));
        for (const DeviceReport& d : r.devices) EXPECT_DOUBLE_EQ(d.compute_busy_us, 3.0 * k.v * m);
        if (k.kind == kOneFOneB.kind) one_f_one_b = bubble(r);
        if (k.v > 1) EXPECT_LE(bubble(r), one_f_one_b + 1e-12);
      }
    }
  }
}

// 1F1B with free transfers: (m + p - 1)(F + B) per step, the bubble
// (p-1)/(m+p-1). E.g. p = 4, m = 8: 11 x 3 = 33 us, bubble 3/11.
TEST(InterleavedSchedule, OneFOneBBubbleIsPMinusOneOverMPlusPMinusOne) {
  for (int p = 2; p <= 8; ++p) {
    for (int m = 1; m <= 32; ++m) {
      SCOPED_TRACE(fmt::format("p={} m={}", p, m));
      const double expected = (p - 1.0) / (m + p - 1.0);
      EXPECT_NEAR(bubble(simulateKind(kOneFOneB, p, m)), expected, 0.02 * expected);
    }
  }
}

// Interleaved, v chunks of 1 us forward and 2 us backward per device (a
// device does v·3 us per micro-batch, 1F1B's stage with v times the layers):
// (m + (p-1)/v)·v·3 per step, the bubble (p-1)/(v·m + p-1) for m a multiple
// of p (Megatron's case), and with this schedule's rounds for every m >= p.
// E.g. p = 4, v = 2, m = 8: 19 x 3 = 57 us, bubble 3/19 (1F1B: 3/11).
TEST(InterleavedSchedule, InterleavedBubbleIsPMinusOneOverVMPlusPMinusOne) {
  for (int v : {2, 3}) {
    for (int p = 2; p <= 8; ++p) {
      for (int m = p; m <= 32; ++m) {
        SCOPED_TRACE(fmt::format("v={} p={} m={}", v, p, m));
        const double expected = (p - 1.0) / (v * m + p - 1.0);
        const double b = bubble(simulateKind(Kind{"interleaved", v}, p, m));
        EXPECT_NEAR(b, expected, 0.02 * expected);
        if (m % p == 0) EXPECT_NEAR(b, expected, 1e-9);  // to rounding
      }
    }
  }
  const SimulationReport r = simulateKind(Kind{"interleaved", 2}, 4, 8);
  EXPECT_NEAR(r.step_time_us, 57.0, 1e-9);
}

// m < p: one round of m micro-batches, none waits for a device; the step is
// the chain of n = p·v chunks plus m - 1: (p·v + m - 1)·3 us, the bubble
// 1 - v·m/(p·v + m - 1). E.g. p = 4, v = 2, m = 2: 27 us, 5/9 = 0.556
// (1F1B: (4 + 2 - 1)·6 = 30 us, 3/5); m = 1 gives (p-1)/p, as 1F1B.
TEST(InterleavedSchedule, FewerMicroBatchesThanDevicesGiveTheChainsBubble) {
  for (int v : {2, 3}) {
    for (int p = 2; p <= 8; ++p) {
      for (int m = 1; m < p; ++m) {
        SCOPED_TRACE(fmt::format("v={} p={} m={}", v, p, m));
        const SimulationReport r = simulateKind(Kind{"interleaved", v}, p, m);
        EXPECT_NEAR(r.step_time_us, (p * v + m - 1) * 3.0, 1e-9);
        EXPECT_NEAR(bubble(r), 1.0 - v * m / (p * v + m - 1.0), 1e-9);
      }
    }
  }
  EXPECT_NEAR(bubble(simulateKind(Kind{"interleaved", 2}, 4, 2)), 5.0 / 9.0, 1e-9);
  EXPECT_NEAR(bubble(simulateKind(kOneFOneB, 4, 2)), 3.0 / 5.0, 1e-9);
}

// p = 2, v = 2, m = 4 (one round of 2, then another): device 0 holds stages
// 0 and 2, device 1 stages 1 and 3; warm-ups (v-1)·r + 2(p-1-d) = 4 and 2.
TEST(InterleavedSchedule, TwoDevicesTwoChunksFourMicroBatchesRunInMegatronsOrder) {
  const UniformChain c = uniformChain(4, 4);
  const Placement p = schedulePipeline(c.g, scheduleOptions(c, Kind{"interleaved", 2}, 2));
  ASSERT_EQ(p.num_devices, 2);
  EXPECT_EQ(orderText(c.g, p, 0),
            "f0_0 f0_1 f2_0 f2_1 "                                // warm-up
            "f0_2 b2_0 f0_3 b2_1 f2_2 b0_0 f2_3 b0_1 "            // one forward, one backward
            "b2_2 b2_3 b0_2 b0_3");                               // the backwards left
  EXPECT_EQ(orderText(c.g, p, 1),
            "f1_0 f1_1 "
            "f3_0 b3_0 f3_1 b3_1 f1_2 b1_0 f1_3 b1_1 f3_2 b3_2 f3_3 b3_3 "
            "b1_2 b1_3");
}

// m = 5 on p = 2: floor(5/2) = 2 rounds of 3 and 2 micro-batches (not 2, 2
// and 1); warm-ups (v-1)·3 + 2(p-1-d) = 5 and 3.
TEST(InterleavedSchedule, MicroBatchesNotAMultipleOfTheDevicesSplitIntoEvenRounds) {
  const UniformChain c = uniformChain(4, 5);
  const Placement p = schedulePipeline(c.g, scheduleOptions(c, Kind{"interleaved", 2}, 2));
  EXPECT_EQ(orderText(c.g, p, 0),
            "f0_0 f0_1 f0_2 f2_0 f2_1 "
            "f2_2 b2_0 f0_3 b2_1 f0_4 b2_2 f2_3 b0_0 f2_4 b0_1 "
            "b0_2 b2_3 b2_4 b0_3 b0_4");
  EXPECT_EQ(orderText(c.g, p, 1),
            "f1_0 f1_1 f1_2 "
            "f3_0 b3_0 f3_1 b3_1 f3_2 b3_2 f1_3 b1_0 f1_4 b1_1 f3_3 b1_2 f3_4 b3_3 "
            "b3_4 b1_3 b1_4");
}

// Micro-batch 0's backward on stage 3 reads micro-batch 1's forward there.
// Device 1's order (warm-up 2: f1_0 f1_1 | f3_0 b3_0 f3_1 ..) runs b3_0
// before f3_1: no device can go on. The warm-up is raised by one on both
// devices (device 0's, 4 = m·v, is all forwards already): f3_1 runs first.
TEST(InterleavedSchedule, RaisesTheWarmUpWhenAnEdgeBetweenMicroBatchesNeedsIt) {
  const UniformChain plain = uniformChain(4, 2);
  const Placement before = schedulePipeline(plain.g, scheduleOptions(plain, Kind{"interleaved", 2}, 2));
  EXPECT_EQ(orderText(plain.g, before, 1), "f1_0 f1_1 f3_0 b3_0 f3_1 b3_1 b1_0 b1_1");

  const UniformChain c = uniformChain(4, 2, {{"b3_0", "f3_1"}});
  const Placement p = schedulePipeline(c.g, scheduleOptions(c, Kind{"interleaved", 2}, 2));
  EXPECT_EQ(orderText(c.g, p, 0), "f0_0 f0_1 f2_0 f2_1 b2_0 b2_1 b0_0 b0_1");
  EXPECT_EQ(orderText(c.g, p, 1), "f1_0 f1_1 f3_0 f3_1 b3_0 b3_1 b1_0 b1_1");
  ir::Program prog = lower(c.g, p);
  ir::verify(prog);
  EXPECT_NO_THROW(simulate(prog, freeLinks(2)));
}

// Micro-batch 0's backward on stage 1 reads micro-batch 1's: every order of
// this form runs b1_0 first, whatever the warm-up.
TEST(InterleavedSchedule, RejectsAnEdgeNoWarmUpCanRunNamingTheBlockedTasks) {
  const UniformChain c = uniformChain(4, 2, {{"b1_0", "b1_1"}});
  const std::string msg = messageOf<ConfigError>(
      [&] { schedulePipeline(c.g, scheduleOptions(c, Kind{"interleaved", 2}, 2)); });
  EXPECT_HAS(msg, "the device orders of interleaved 1F1B contradict the graph's dependencies even "
                  "with every forward first");
  EXPECT_HAS(msg, "B0 of stage 1 waits (%b1_0 reads %b1_1 of B1 of stage 1)");
}

// Random chains: skip edges forward (f_a -> f_b, a < b) with their
// gradients back (b_b -> b_a), random times, p = 1..5 devices, v = 1..3,
// m = 1..9, portals or relayed skips: every one schedules, verifies and
// simulates with every node run once; then 30 more under ZB-V (v = 2, the
// V, the B/W split: Note [ZB-V]).
TEST(InterleavedSchedule, RandomChainsWithSkipsVerifyAndSimulate) {
  std::mt19937 rng(35);
  auto pick = [&](int lo, int hi) { return std::uniform_int_distribution<int>(lo, hi)(rng); };
  int64_t relay_copies = 0;
  for (int trial = 0; trial < 90; ++trial) {
    const bool zbv = trial >= 60;  // the last 30: ZB-V, 2 stages per device in a V
    const int p = pick(1, 5);
    const int v = zbv ? 2 : pick(1, 3), m = pick(1, 9), n = p * v;
    std::multimap<std::string, std::string> skips;
    for (int k = 0; k < m; ++k) {
      for (int b = 2; b < n; ++b) {
        if (pick(0, 3) != 0) continue;
        const int a = pick(0, b - 2);
        skips.emplace(fmt::format("f{}_{}", b, k), fmt::format("f{}_{}", a, k));
        skips.emplace(fmt::format("b{}_{}", a, k), fmt::format("b{}_{}", b, k));
      }
    }
    const UniformChain c = uniformChain(n, m, skips, [&] { return pick(1, 20); });
    PipelineScheduleOptions o = scheduleOptions(c, Kind{zbv ? "zb-v" : "interleaved", v}, p);
    o.relay_skips = trial % 3 == 0;
    SCOPED_TRACE(fmt::format("trial {}: {} p={} v={} m={} skips={} relay={}", trial, o.kind, p, v, m,
                             skips.size() / 2, o.relay_skips));
    const PipelineProgram pp = lowerPipeline(c.g, o);
    ASSERT_NO_THROW(ir::verify(pp.program));
    int64_t runs = 0;
    for (int d = 0; d < pp.program.numDevices(); ++d) {
      for (const ir::Instruction& i : pp.program.schedule(d)) runs += i.kind == ir::Instruction::Kind::Run;
    }
    EXPECT_EQ(runs, static_cast<int64_t>(pp.graph.numNodes()));
    EXPECT_GT(simulate(pp.program, testing::machine(p)).step_time_us, 0.0);
    relay_copies += static_cast<int64_t>(pp.graph.numNodes() - c.g.numNodes());
  }
  EXPECT_GT(relay_copies, 0);  // the trials relayed skips
}

TEST(InterleavedSchedule, RejectsAPlacementThatDoesNotLoopOverTheDevices) {
  const UniformChain c = uniformChain(4, 2);
  PipelineScheduleOptions o = scheduleOptions(c, Kind{"interleaved", 2}, 2);
  o.device_of_stage = {0, 1, 1, 0};
  EXPECT_HAS(messageOf<ConfigError>([&] { schedulePipeline(c.g, o); }),
             "schedule 'interleaved' places stage s on device s % p (looping over the 2 devices), "
             "but stage 2 is on device 1; give device_of_stage[2] = 0");
  const UniformChain three = uniformChain(3, 2);
  o = scheduleOptions(three, Kind{"interleaved", 1}, 2);
  o.device_of_stage = {0, 1, 0};
  EXPECT_HAS(messageOf<ConfigError>([&] { schedulePipeline(three.g, o); }),
             "schedule 'interleaved' needs v stages on each of the 2 devices (n = p * v), but "
             "device_of_stage has 3 entries; give a multiple of 2");
}

}  // namespace
}  // namespace modelpar::passes
