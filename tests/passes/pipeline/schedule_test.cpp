// Pass `schedule`: exact per-device orders for GPipe, 1F1B and 1F1B*, the
// bubble fraction and per-stage activation memory in simulation, random
// pipelines that must verify and never deadlock, and the error paths.
#include "passes/pipeline/schedule.h"

#include <fmt/format.h>
#include <gtest/gtest.h>

#include <fstream>
#include <optional>
#include <random>
#include <sstream>
#include <string>

#include "ir/error.h"
#include "ir/parser.h"
#include "ir/verifier.h"
#include "passes/lower/lower.h"
#include "passes/lower/simulate.h"
#include "passes/pipeline/partition.h"
#include "tests/passes/test_graphs.h"
#include "tests/support/expect_error.h"
#include "tests/support/read_file.h"

namespace modelpar::passes {
namespace {

using modelpar::testing::messageOf;
using testing::machine;

// Stage per node from its layer "s<k>"; no layer: -1 (a shared node).
std::vector<int32_t> stagesFromLayers(const ir::Graph& g) {
  std::vector<int32_t> s;
  for (const ir::Node& n : g.nodes()) s.push_back(n.layer.empty() ? -1 : std::stoi(n.layer.substr(1)));
  return s;
}

std::string orderText(const ir::Graph& g, const Placement& p, int d) {
  std::string s;
  for (ir::NodeId n : p.order[static_cast<size_t>(d)]) {
    if (!s.empty()) s += ' ';
    s += g.nodeRef(n).substr(1);
  }
  return s;
}

// Index of the instruction of kind `k` on device `d` that runs node `ref`
// ("%name" or "^label") or moves value "%name"; -1 when there is none.
int instructionAt(const ir::Program& prog, int d, ir::Instruction::Kind k, const std::string& ref) {
  const ir::Graph& g = prog.graph();
  const auto& s = prog.schedule(d);
  for (size_t i = 0; i < s.size(); ++i) {
    const ir::Instruction& in = s[i];
    if (in.kind != k) continue;
    std::string r = k == ir::Instruction::Kind::Run ? g.nodeRef(in.node) : "%" + g.value(in.value).name;
    if (r == ref) return static_cast<int>(i);
  }
  return -1;
}

// A uniform chain: x -> f0 -> f1 -> ... -> f(n-1) per micro-batch, then
// b(n-1) (reads f(n-1)) -> ... -> b0, each b_s also reading f_s (its stashed
// activation). Forward F us and A bytes, backward B us and G bytes; %x is
// 4 bytes. Stage s runs f_s and b_s (layer "s<s>").
std::string chainText(int n, int m, double F, double B, int64_t A, int64_t G) {
  auto cost = [](double t, int64_t out) {
    return fmt::format("cost={{time_us={:.1f}, out={}, temp=0, persist=0}}", t, out);
  };
  std::string s = "graph @chain(%x: f32[1] input) {\n";
  for (int k = 0; k < m; ++k) {
    for (int j = 0; j < n; ++j) {
      std::string in = j == 0 ? "%x" : fmt::format("%f{}_{}", j - 1, k);
      s += fmt::format("  %f{}_{}: f32[{}] = aten::relu({}) {{layer=\"s{}\", phase=fwd, mb={}, {}}}\n", j, k,
                       A / 4, in, j, k, cost(F, A));
    }
    for (int j = n - 1; j >= 0; --j) {
      std::string gin = j == n - 1 ? fmt::format("%f{}_{}", j, k) : fmt::format("%b{}_{}", j + 1, k);
      s += fmt::format(
          "  %b{}_{}: f32[{}] = aten::threshold_backward({}, %f{}_{}, 0) {{layer=\"s{}\", phase=bwd, mb={}, {}}}\n",
          j, k, G / 4, gin, j, k, j, k, cost(B, G));
    }
  }
  return s + "  return\n}\n";
}

PipelineScheduleOptions optionsFor(const ir::Graph& g, std::string kind, std::vector<int> in_flight = {}) {
  PipelineScheduleOptions o;
  o.kind = std::move(kind);
  o.stage_of_node = stagesFromLayers(g);
  o.in_flight = std::move(in_flight);
  return o;
}

// Zero latency and a huge bandwidth: transfers take (almost exactly) 0 us.
DeviceModel freeLinks(int n) { return machine(n, int64_t{1} << 40, 0.0, 1e24); }

TEST(PipelineSchedule, GPipeRunsForwardsInOrderThenBackwardsReversed) {
  ir::Graph g = ir::parseGraph(chainText(3, 4, 10, 20, 1024, 4));
  Placement p = schedulePipeline(g, optionsFor(g, "gpipe"));
  ASSERT_EQ(p.num_devices, 3);
  EXPECT_EQ(orderText(g, p, 0), "f0_0 f0_1 f0_2 f0_3 b0_3 b0_2 b0_1 b0_0");
  EXPECT_EQ(orderText(g, p, 1), "f1_0 f1_1 f1_2 f1_3 b1_3 b1_2 b1_1 b1_0");
  EXPECT_EQ(orderText(g, p, 2), "f2_0 f2_1 f2_2 f2_3 b2_3 b2_2 b2_1 b2_0");
  EXPECT_EQ(p.placer, "schedule");
}

TEST(PipelineSchedule, OneFOneBWarmsUpNMinusSForwardsThenAlternates) {
  ir::Graph g = ir::parseGraph(chainText(3, 4, 10, 20, 1024, 4));
  Placement p = schedulePipeline(g, optionsFor(g, "1f1b"));
  EXPECT_EQ(orderText(g, p, 0), "f0_0 f0_1 f0_2 b0_0 f0_3 b0_1 b0_2 b0_3");
  EXPECT_EQ(orderText(g, p, 1), "f1_0 f1_1 b1_0 f1_2 b1_1 f1_3 b1_2 b1_3");
  EXPECT_EQ(orderText(g, p, 2), "f2_0 b2_0 f2_1 b2_1 f2_2 b2_2 f2_3 b2_3");
}

TEST(PipelineSchedule, OneFOneBStarKeepsInFlightMicroBatchesPerStage) {
  ir::Graph g = ir::parseGraph(chainText(3, 4, 10, 20, 1024, 4));
  Placement p = schedulePipeline(g, optionsFor(g, "1f1b*", {5, 2, 2}));  // 5 is clamped to m = 4
  EXPECT_EQ(orderText(g, p, 0), "f0_0 f0_1 f0_2 f0_3 b0_0 b0_1 b0_2 b0_3");
  EXPECT_EQ(orderText(g, p, 1), "f1_0 f1_1 b1_0 f1_2 b1_1 f1_3 b1_2 b1_3");
  EXPECT_EQ(orderText(g, p, 2), "f2_0 f2_1 b2_0 f2_2 b2_1 f2_3 b2_2 b2_3");
}

// Uniform stages, free links: every schedule takes (m + n - 1)(F + B), so
// the bubble fraction is (n - 1)/(m + n - 1). E.g. n = 4, m = 8, F = 10,
// B = 20: 11 * 30 = 330 us, of which each device computes 8 * 30 = 240.
TEST(PipelineSchedule, UniformStagesGiveTheBubbleFractionExactly) {
  for (auto [n, m] : {std::pair{2, 1}, {2, 4}, {3, 4}, {4, 8}, {5, 3}, {6, 7}}) {
    ir::Graph g = ir::parseGraph(chainText(n, m, 10, 20, 1024, 1024));
    for (const char* kind : {"gpipe", "1f1b"}) {
      ir::Program prog = lower(g, schedulePipeline(g, optionsFor(g, kind)));
      ir::verify(prog);
      SimulationReport r = simulate(prog, freeLinks(n));
      SCOPED_TRACE(fmt::format("{} n={} m={}", kind, n, m));
      EXPECT_DOUBLE_EQ(r.step_time_us, (m + n - 1) * 30.0);
      for (const DeviceReport& d : r.devices) {
        EXPECT_DOUBLE_EQ(d.compute_busy_us, m * 30.0);
        EXPECT_DOUBLE_EQ(d.idle_us / r.step_time_us, (n - 1.0) / (m + n - 1.0));
      }
    }
  }
}

// Peak memory per stage with A = 1024-byte activations, G = 4-byte gradients
// and the 4-byte input %x on stage 0, w micro-batches in flight:
//   stage s >= 1: w stashed activations, then one more being received while
//     the next forward writes its own (the w-th stashed): (w + 1) A;
//   stage 0: w stashed activations plus, during a backward, the received
//     gradient and its own (2 G), plus %x while forwards remain (w < m):
//     w A + 2 G + (w < m ? 4 : 0).
int64_t expectedPeak(int s, int w, int m) {
  const int64_t A = 1024, G = 4;
  return s == 0 ? w * A + 2 * G + (w < m ? 4 : 0) : (w + 1) * A;
}

TEST(PipelineSchedule, ActivationMemoryFollowsTheMicroBatchesInFlight) {
  const int n = 4, m = 6;
  ir::Graph g = ir::parseGraph(chainText(n, m, 10, 20, 1024, 4));
  struct Case {
    const char* kind;
    std::vector<int> in_flight;  // passed to 1f1b*
    std::vector<int> w;          // expected per stage
  };
  for (const Case& c : {Case{"gpipe", {}, {6, 6, 6, 6}}, Case{"1f1b", {}, {4, 3, 2, 1}},
                        Case{"1f1b*", {3, 3, 1, 1}, {3, 3, 1, 1}}, Case{"1f1b*", {6, 2, 2, 2}, {6, 2, 2, 2}}}) {
    SCOPED_TRACE(c.kind);
    ir::Program prog = lower(g, schedulePipeline(g, optionsFor(g, c.kind, c.in_flight)));
    ir::verify(prog);
    SimulationReport r = simulate(prog, machine(n));
    for (int s = 0; s < n; ++s) {
      EXPECT_EQ(r.devices[static_cast<size_t>(s)].peak_bytes, expectedPeak(s, c.w[static_cast<size_t>(s)], m))
          << "stage " << s;
    }
  }
}

// Two stages, two micro-batches, GPipe, with a shared node (%wt, no mb and
// no stage), recomputation on stage 0, a gradient combination and an update:
//
//   %x -> a_k (s0) -> h_k (s1, reads %wt) -> gh_k (s1) -> g_k (s0) -> ga_k (s0)
//                                              r_k (s0, recompute of a_k) ---^
//   gw = gh_0 + gh_1 (s1, no mb), then ^upd (s1).
constexpr const char* kStep = R"(
graph @step(%x: f32[4] input, %w: f32[4] param) {
  %wt: f32[4] = aten::t(%w) {phase=fwd, cost={time_us=1.0, out=16, temp=0, persist=0}}
  %a0: f32[4] = aten::relu(%x) {layer="s0", phase=fwd, mb=0, cost={time_us=1.0, out=16, temp=0, persist=0}}
  %h0: f32[4] = aten::mul.Tensor(%a0, %wt) {layer="s1", phase=fwd, mb=0, cost={time_us=1.0, out=16, temp=0, persist=0}}
  %gh0: f32[4] = aten::mul.Tensor(%h0, %wt) {layer="s1", phase=bwd, mb=0, cost={time_us=1.0, out=16, temp=0, persist=0}}
  %g0: f32[4] = aten::neg(%gh0) {layer="s0", phase=bwd, mb=0, cost={time_us=1.0, out=16, temp=0, persist=0}}
  %r0: f32[4] = aten::relu(%x) {layer="s0", phase=recompute, mb=0, cost={time_us=1.0, out=16, temp=0, persist=0}}
  %ga0: f32[4] = aten::threshold_backward(%g0, %r0, 0) {layer="s0", phase=bwd, mb=0, cost={time_us=1.0, out=16, temp=0, persist=0}}
  %a1: f32[4] = aten::relu(%x) {layer="s0", phase=fwd, mb=1, cost={time_us=1.0, out=16, temp=0, persist=0}}
  %h1: f32[4] = aten::mul.Tensor(%a1, %wt) {layer="s1", phase=fwd, mb=1, cost={time_us=1.0, out=16, temp=0, persist=0}}
  %gh1: f32[4] = aten::mul.Tensor(%h1, %wt) {layer="s1", phase=bwd, mb=1, cost={time_us=1.0, out=16, temp=0, persist=0}}
  %g1: f32[4] = aten::neg(%gh1) {layer="s0", phase=bwd, mb=1, cost={time_us=1.0, out=16, temp=0, persist=0}}
  %r1: f32[4] = aten::relu(%x) {layer="s0", phase=recompute, mb=1, cost={time_us=1.0, out=16, temp=0, persist=0}}
  %ga1: f32[4] = aten::threshold_backward(%g1, %r1, 0) {layer="s0", phase=bwd, mb=1, cost={time_us=1.0, out=16, temp=0, persist=0}}
  %gw: f32[4] = aten::add.Tensor(%gh0, %gh1) {layer="s1", phase=bwd, cost={time_us=1.0, out=16, temp=0, persist=0}}
  ^upd = aten::_foreach_add_([%w], [%gw], alpha=-0.1) {layer="s1", phase=update, cost={time_us=1.0, out=0, temp=0, persist=0}}
  return %ga0, %ga1
}
)";

TEST(PipelineSchedule, PlacesSharedRecomputeAndFinalNodes) {
  ir::Graph g = ir::parseGraph(kStep);
  Placement p = schedulePipeline(g, optionsFor(g, "gpipe"));
  // Recomputation first in each backward task; %wt right before its first
  // reader, on that reader's stage; the combination and update at the end.
  EXPECT_EQ(orderText(g, p, 0), "a0 a1 r1 g1 ga1 r0 g0 ga0");
  EXPECT_EQ(orderText(g, p, 1), "wt h0 h1 gh1 gh0 gw upd");
  ir::Program prog = lower(g, p);
  ir::verify(prog);
  // The gradient's receive comes after the recomputation, which overlaps it.
  auto at = [&](ir::Instruction::Kind k, const std::string& name) {
    return instructionAt(prog, 0, k, name);
  };
  ASSERT_GE(at(ir::Instruction::Kind::Recv, "%gh1"), 0);
  EXPECT_LT(at(ir::Instruction::Kind::Run, "%r1"), at(ir::Instruction::Kind::Recv, "%gh1"));
  EXPECT_NO_THROW(simulate(prog, machine(2)));
}

// Note [In-place writes to graph inputs] in a pipeline: %pos, read on both
// stages, is advanced by a shared copy_ that nobody reads. It runs last on
// the stage of the input's first reader in graph order (%next's, which
// lowering makes the input's home), after the send of %pos to the other stage
// and after every reader of the old value (%h0 and %h1 had read the new
// one: it ran right after %next).
TEST(PipelineSchedule, AnInPlaceWriteToAnInputRunsLastOnTheInputsStage) {
  ir::Graph g = ir::parseGraph(R"(
graph @decode(%x: f32[4] input, %pos: i64[] input) {
  %next: i64[] = aten::add.Tensor(%pos, 1) {phase=fwd, cost={time_us=1.0, out=8, temp=0, persist=0}}
  %at: f32[4] = aten::add.Tensor(%x, %pos) {layer="s0", phase=fwd, cost={time_us=1.0, out=16, temp=0, persist=0}}
  %a0: f32[4] = aten::relu(%at) {layer="s0", phase=fwd, mb=0, cost={time_us=1.0, out=16, temp=0, persist=0}}
  %h0: f32[4] = aten::add.Tensor(%a0, %pos) {layer="s1", phase=fwd, mb=0, cost={time_us=1.0, out=16, temp=0, persist=0}}
  %a1: f32[4] = aten::relu(%at) {layer="s0", phase=fwd, mb=1, cost={time_us=1.0, out=16, temp=0, persist=0}}
  %h1: f32[4] = aten::add.Tensor(%a1, %pos) {layer="s1", phase=fwd, mb=1, cost={time_us=1.0, out=16, temp=0, persist=0}}
  %w: i64[] = aten::copy_(%pos, %next) {layer="s1", phase=fwd, cost={time_us=1.0, out=0, temp=0, persist=0}}
  return %h0, %h1, %w
}
)");
  PipelineScheduleOptions o;
  o.kind = "gpipe";
  o.stage_of_node = stagesFromLayers(g);
  o.device_of_stage = {0, 1};
  Placement p = schedulePipeline(g, o);
  EXPECT_EQ(orderText(g, p, 0), "at a0 a1");
  EXPECT_EQ(orderText(g, p, 1), "next h0 h1 w");
  ir::Program prog = lower(g, p);
  ir::verify(prog);
  const int send = instructionAt(prog, 1, ir::Instruction::Kind::Send, "%pos");
  ASSERT_GE(send, 0);
  EXPECT_LT(send, instructionAt(prog, 1, ir::Instruction::Kind::Run, "%w"));
  EXPECT_NO_THROW(simulate(prog, machine(2)));
}

// Stages 0 and 2 share device 0 (MadPipe's special processor). Ticks
// (Note [Global clock]): F(0,k) at k, F(1,k) at k+1, F(2,k) at k+2; B(2,1)
// at 4, B(2,0) at 5, B(1,1) 5, B(1,0) 6, B(0,1) 6, B(0,0) 7. Device 0 sorts
// its stages' tasks by (tick, stage).
TEST(PipelineSchedule, DeviceHostingTwoStagesInterleavesThemByClock) {
  ir::Graph g = ir::parseGraph(chainText(3, 2, 10, 20, 1024, 4));
  PipelineScheduleOptions o = optionsFor(g, "gpipe");
  o.device_of_stage = {0, 1, 0};
  Placement p = schedulePipeline(g, o);
  ASSERT_EQ(p.num_devices, 2);
  EXPECT_EQ(orderText(g, p, 0), "f0_0 f0_1 f2_0 f2_1 b2_1 b2_0 b0_1 b0_0");
  EXPECT_EQ(orderText(g, p, 1), "f1_0 f1_1 b1_1 b1_0");
  ir::Program prog = lower(g, p);
  ir::verify(prog);
  // One device does 2 stages' work: 2 * 2 * 30 us of compute on device 0.
  SimulationReport r = simulate(prog, freeLinks(2));
  EXPECT_DOUBLE_EQ(r.devices[0].compute_busy_us, 120.0);
}

// A random pipelined step: per micro-batch, forward nodes on non-decreasing
// stages reading the previous node and, sometimes, an earlier one (a skip);
// a backward node per forward node reading its activation and the gradients
// of its readers; shared weights' transposes; a gradient combination per
// stage; sometimes recomputation.
struct RandomStep {
  ir::Graph g{"random_step"};
  std::vector<int32_t> stage;
};

RandomStep randomStep(std::mt19937& rng, int n, int m) {
  RandomStep r;
  ir::Graph& g = r.g;
  std::uniform_int_distribution<int> layers_per_stage(1, 3);
  std::uniform_real_distribution<double> coin(0.0, 1.0);
  std::vector<int> layer_stage;
  for (int s = 0; s < n; ++s) {
    if (s > 0 && coin(rng) < 0.2) continue;  // an empty stage
    for (int k = layers_per_stage(rng); k > 0; --k) layer_stage.push_back(s);
  }
  const int L = static_cast<int>(layer_stage.size());
  std::vector<std::vector<int>> reads(static_cast<size_t>(L));
  for (int j = 1; j < L; ++j) {
    reads[static_cast<size_t>(j)].push_back(j - 1);
    if (j >= 2 && coin(rng) < 0.4) reads[static_cast<size_t>(j)].insert(reads[static_cast<size_t>(j)].begin(), std::uniform_int_distribution<int>(0, j - 2)(rng));
  }
  ir::ValueId x = g.addInput("x", testing::f32(4), ir::InputRole::Input);
  ir::ValueId w = g.addInput("w", testing::f32(4), ir::InputRole::Parameter);
  auto add = [&](const std::string& name, std::vector<ir::ValueId> ins, int s, std::optional<int> mb,
                 ir::Phase ph) {
    ir::NodeId id = testing::addTask(g, name, ins, 64, std::round(1 + 19 * coin(rng)), s >= 0 ? "s" + std::to_string(s) : "");
    g.node(id).microbatch = mb;
    g.node(id).phase = ph;
    r.stage.push_back(s);
    return g.node(id).outputs[0];
  };
  ir::ValueId wt = add("wt", {w}, -1, std::nullopt, ir::Phase::Forward);
  std::vector<std::vector<ir::ValueId>> wgrads(static_cast<size_t>(n));
  for (int k = 0; k < m; ++k) {
    std::vector<ir::ValueId> f(static_cast<size_t>(L)), b(static_cast<size_t>(L), ir::kNoId);
    for (int j = 0; j < L; ++j) {
      std::vector<ir::ValueId> ins;
      for (int i : reads[static_cast<size_t>(j)]) ins.push_back(f[static_cast<size_t>(i)]);
      if (ins.empty()) ins.push_back(x);
      if (j % 2 == 1) ins.push_back(wt);
      f[static_cast<size_t>(j)] = add(fmt::format("f{}_{}", j, k), ins, layer_stage[static_cast<size_t>(j)], k, ir::Phase::Forward);
    }
    for (int j = L - 1; j >= 0; --j) {
      int s = layer_stage[static_cast<size_t>(j)];
      std::vector<ir::ValueId> ins;
      for (int c = j + 1; c < L; ++c) {
        const auto& rc = reads[static_cast<size_t>(c)];
        if (std::find(rc.begin(), rc.end(), j) != rc.end()) ins.push_back(b[static_cast<size_t>(c)]);
      }
      ir::ValueId act = f[static_cast<size_t>(j)];
      if (coin(rng) < 0.3) act = add(fmt::format("r{}_{}", j, k), {act}, s, k, ir::Phase::Recompute);
      ins.push_back(act);
      b[static_cast<size_t>(j)] = add(fmt::format("b{}_{}", j, k), ins, s, k, ir::Phase::Backward);
      wgrads[static_cast<size_t>(s)].push_back(b[static_cast<size_t>(j)]);
    }
  }
  std::vector<ir::ValueId> outs;
  for (int s = 0; s < n; ++s) {
    if (wgrads[static_cast<size_t>(s)].size() < 2) continue;
    outs.push_back(add(fmt::format("gw{}", s), wgrads[static_cast<size_t>(s)], s, std::nullopt, ir::Phase::Backward));
  }
  g.setOutputs(outs);
  return r;
}

// Stage s runs forward fwd[s] us and backward bwd[s] us per micro-batch
// (chainText with per-stage times and no bytes to move).
std::string stagesText(const std::vector<double>& fwd, const std::vector<double>& bwd, int m) {
  auto cost = [](double t) { return fmt::format("cost={{time_us={:.1f}, out=4, temp=0, persist=0}}", t); };
  const int n = static_cast<int>(fwd.size());
  std::string s = "graph @stages(%x: f32[1] input) {\n";
  for (int k = 0; k < m; ++k) {
    for (int j = 0; j < n; ++j) {
      std::string in = j == 0 ? "%x" : fmt::format("%f{}_{}", j - 1, k);
      s += fmt::format("  %f{}_{}: f32[1] = aten::relu({}) {{layer=\"s{}\", phase=fwd, mb={}, {}}}\n",
                       j, k, in, j, k, cost(fwd[static_cast<size_t>(j)]));
    }
    for (int j = n - 1; j >= 0; --j) {
      std::string gin = j == n - 1 ? fmt::format("%f{}_{}", j, k) : fmt::format("%b{}_{}", j + 1, k);
      s += fmt::format(
          "  %b{}_{}: f32[1] = aten::threshold_backward({}, %f{}_{}, 0) {{layer=\"s{}\", phase=bwd, mb={}, {}}}\n",
          j, k, gin, j, k, j, k, cost(bwd[static_cast<size_t>(j)]));
    }
  }
  return s + "  return\n}\n";
}

// MadPipe's phase 2, executed (Note [Lowering the periodic pattern]): the plan
// of partition_test's SchedulesTheSpecialDeviceAndRespectsMemory puts stages
// 0 and 2 on device 0 (F0, B0, F2, B2: 1 us each, 4 us a period) and stage 1
// on device 1 (F 1 us + B 3 us = 4 us). The ILP's pattern has period T = 4
// us: both devices are busy all the time. Lowered with the pattern, the
// simulated step grows by exactly T per micro-batch: its period is the ILP's.
TEST(PipelineSchedule, LoweredPeriodicPatternRunsAtTheIlpsPeriod) {
  const std::vector<double> fwd{1, 1, 1}, bwd{1, 3, 1};
  LayerChain c;
  for (size_t i = 0; i < fwd.size(); ++i) {
    ChainLayer l;
    l.name = fmt::format("s{}", i);
    l.fwd_us = fwd[i];
    l.bwd_us = bwd[i];
    l.stored_bytes = 10;
    c.layers.push_back(l);
  }
  StagePartition plan;
  plan.stage_begin = {0, 1, 2};
  plan.stage_device = {0, 1, 0};
  PartitionOptions po;
  po.devices = 2;
  po.memory_bytes = int64_t{1} << 40;
  po.bandwidth_bytes_per_s = 1e6;
  po.latency_us = 0;
  po.microbatches = 1000;
  std::optional<PeriodicPattern> pat = periodicPatternIlp(c, plan, po, 4.0);
  ASSERT_TRUE(pat.has_value());
  auto stepUs = [&](int m, bool with_pattern) {
    ir::Graph g = ir::parseGraph(stagesText(fwd, bwd, m));
    PipelineScheduleOptions o = optionsFor(g, "1f1b*", pat->stage_activations);
    o.device_of_stage = {0, 1, 0};
    if (with_pattern) {
      o.pattern = PatternTimes{pat->period_us, pat->fwd_start_us, pat->bwd_start_us,
                               pat->fwd_shift, pat->bwd_shift};
    }
    ir::Program prog = lower(g, schedulePipeline(g, o));
    ir::verify(prog);
    return simulate(prog, freeLinks(2)).step_time_us;
  };
  const double period = (stepUs(24, true) - stepUs(12, true)) / 12;
  EXPECT_NEAR(period, pat->period_us, 1e-6);
  EXPECT_NEAR(period, 4.0, 1e-6);
  // Interleaved by the clock instead, device 0's stages do not keep that period.
  const double clock_period = (stepUs(24, false) - stepUs(12, false)) / 12;
  EXPECT_GT(clock_period, 4.0 + 1e-6) << clock_period;
}

TEST(PipelineSchedule, RejectsAPatternForAnotherScheduleOrOfTheWrongSize) {
  ir::Graph g = ir::parseGraph(stagesText({1, 1}, {1, 1}, 2));
  PipelineScheduleOptions o = optionsFor(g, "1f1b", {});
  o.pattern = PatternTimes{4.0, {0, 1}, {2, 3}, {0, 0}, {0, 0}};
  EXPECT_HAS(messageOf<ConfigError>([&] { schedulePipeline(g, o); }),
             "a periodic pattern is MadPipe's 1F1B* schedule");
  o.kind = "1f1b*";
  o.in_flight = {1, 1};
  o.pattern->fwd_shift = {0};
  EXPECT_HAS(messageOf<ConfigError>([&] { schedulePipeline(g, o); }),
             "a start and shift per stage for each of the 2 stages");
  // A stage's backward before its forward: the clock finds the stage blocked.
  o.pattern = PatternTimes{4.0, {0, 3}, {2, 1}, {0, 0}, {0, 0}};
  EXPECT_HAS(messageOf<ConfigError>([&] { schedulePipeline(g, o); }),
             "the stage orders contradict the graph's dependencies");
  // Each stage in order, but stage 1's forward (at 0) before stage 0's (at 2),
  // which it reads: the pattern does not fit the graph.
  o.pattern = PatternTimes{4.0, {2, 0}, {3.5, 1}, {0, 0}, {0, 0}};
  EXPECT_HAS(messageOf<ConfigError>([&] { schedulePipeline(g, o); }),
             "the periodic pattern starts F0 of stage 1 before F0 of stage 0");
}

TEST(PipelineSchedule, RandomPipelinesVerifyAndNeverDeadlock) {
  std::mt19937 rng(7);
  int64_t relay_copies = 0, shared_devices = 0;
  for (int trial = 0; trial < 120; ++trial) {
    int n = std::uniform_int_distribution<int>(1, 6)(rng), m = std::uniform_int_distribution<int>(1, 8)(rng);
    RandomStep st = randomStep(rng, n, m);
    ir::verify(st.g);
    PipelineScheduleOptions o;
    o.kind = std::array{"gpipe", "1f1b", "1f1b*"}[static_cast<size_t>(trial % 3)];
    o.stage_of_node = st.stage;
    o.device_of_stage.resize(static_cast<size_t>(n));
    for (int s = 0; s < n; ++s) o.device_of_stage[static_cast<size_t>(s)] = s;
    if (n >= 3 && trial % 2 == 0) {
      o.device_of_stage[static_cast<size_t>(n - 1)] = 0;  // two stages on device 0
      ++shared_devices;
    }
    int w = m + 1;
    for (int s = 0; s < n; ++s) {  // non-increasing in-flight counts
      w = std::uniform_int_distribution<int>(1, std::max(1, w))(rng);
      o.in_flight.push_back(w);
    }
    o.relay_skips = trial % 4 == 1;
    SCOPED_TRACE(fmt::format("trial {}: {} n={} m={} relay={}", trial, o.kind, n, m, o.relay_skips));
    PipelineProgram pp = lowerPipeline(st.g, o);
    ASSERT_NO_THROW(ir::verify(pp.program));
    int devices = pp.program.numDevices();
    SimulationReport r = simulate(pp.program, machine(devices));
    int64_t runs = 0;
    for (int d = 0; d < devices; ++d) {
      for (const ir::Instruction& i : pp.program.schedule(d)) runs += i.kind == ir::Instruction::Kind::Run;
    }
    EXPECT_EQ(runs, static_cast<int64_t>(pp.graph.numNodes()));
    EXPECT_GT(r.step_time_us, 0.0);
    relay_copies += static_cast<int64_t>(pp.graph.numNodes() - st.g.numNodes());
  }
  // The trials did relay skips and share devices.
  EXPECT_GT(relay_copies, 0);
  EXPECT_GT(shared_devices, 10);
}

// Micro-batch k's backward on stage 0 reads micro-batch k-1's: fine for
// 1F1B (B0 before B1), circular for GPipe (B1 before B0).
constexpr const char* kChained = R"(
graph @chained(%x: f32[4] input) {
  %f0: f32[4] = aten::relu(%x) {layer="s0", phase=fwd, mb=0}
  %b0: f32[4] = aten::neg(%f0) {layer="s0", phase=bwd, mb=0}
  %f1: f32[4] = aten::relu(%x) {layer="s0", phase=fwd, mb=1}
  %b1: f32[4] = aten::add.Tensor(%f1, %b0) {layer="s0", phase=bwd, mb=1}
  return %b1
}
)";

TEST(PipelineSchedule, RejectsCircularTaskOrderNamingTheBlockedTask) {
  ir::Graph g = ir::parseGraph(kChained);
  EXPECT_NO_THROW(schedulePipeline(g, optionsFor(g, "1f1b")));
  std::string msg = messageOf<ConfigError>([&] { schedulePipeline(g, optionsFor(g, "gpipe")); });
  EXPECT_HAS(msg, "B1 of stage 0 waits (%b1 reads %b0 of B0 of stage 0)");
}

TEST(PipelineSchedule, RejectsBadOptionsNamingTheProblem) {
  ir::Graph g = ir::parseGraph(chainText(3, 2, 10, 20, 1024, 4));
  PipelineScheduleOptions o = optionsFor(g, "zb-x");
  EXPECT_HAS(messageOf<ConfigError>([&] { schedulePipeline(g, o); }), "unknown schedule 'zb-x'");
  o = optionsFor(g, "gpipe");
  o.stage_of_node.pop_back();
  EXPECT_HAS(messageOf<ConfigError>([&] { schedulePipeline(g, o); }), "stage_of_node has 11 entries for the 12 nodes");
  o = optionsFor(g, "gpipe");
  o.device_of_stage = {0, 1};
  EXPECT_HAS(messageOf<ConfigError>([&] { schedulePipeline(g, o); }),
             "node %f2_0 is on stage 2, which has no device (device_of_stage has 2 entries)");
  o.device_of_stage = {0, -1, 2};
  EXPECT_HAS(messageOf<ConfigError>([&] { schedulePipeline(g, o); }), "stage 1 has device -1");
  o = optionsFor(g, "gpipe");
  o.stage_of_node[0] = -1;
  EXPECT_HAS(messageOf<ConfigError>([&] { schedulePipeline(g, o); }), "node %f0_0 (mb=0) has stage -1");
  o = optionsFor(g, "1f1b*", {2, 2});
  EXPECT_HAS(messageOf<ConfigError>([&] { schedulePipeline(g, o); }), "needs in_flight for each of the 3 stages, got 2");
  o.in_flight = {2, 0, 1};
  EXPECT_HAS(messageOf<ConfigError>([&] { schedulePipeline(g, o); }), "in_flight[1] = 0");
  o.in_flight = {1, 2, 1};
  EXPECT_HAS(messageOf<ConfigError>([&] { schedulePipeline(g, o); }),
             "in_flight increases along forward edge %f0_0 (stage 0, 1 in flight) -> %f1_0 (stage 1, 2 in flight)");
  o = optionsFor(g, "gpipe");
  o.relay_skips = true;
  EXPECT_HAS(messageOf<ConfigError>([&] { schedulePipeline(g, o); }), "call lowerPipeline");
}

TEST(PipelineSchedule, RejectsEdgesAgainstTheStageOrder) {
  ir::Graph g = ir::parseGraph(chainText(3, 2, 10, 20, 1024, 4));
  PipelineScheduleOptions o = optionsFor(g, "1f1b");
  o.stage_of_node[0] = 2;  // %f0_0 on stage 2, read by %f1_0 on stage 1
  EXPECT_HAS(messageOf<ConfigError>([&] { schedulePipeline(g, o); }),
             "forward edge %f0_0 (stage 2) -> %f1_0 (stage 1) goes to an earlier stage");
  o = optionsFor(g, "1f1b");
  o.stage_of_node[5] = 2;  // %b0_0 on stage 2 reads %b1_0 on stage 1
  EXPECT_HAS(messageOf<ConfigError>([&] { schedulePipeline(g, o); }),
             "backward edge %b1_0 (stage 1) -> %b0_0 (stage 2) goes to a later stage");
}

TEST(PipelineSchedule, RejectsPhasesThatCannotPipeline) {
  ir::Graph back = ir::parseGraph(R"(
graph @g(%x: f32[4] input) {
  %b: f32[4] = aten::neg(%x) {layer="s0", phase=bwd, mb=0}
  %f: f32[4] = aten::relu(%b) {layer="s0", phase=fwd, mb=0}
  return %f
}
)");
  EXPECT_HAS(messageOf<ConfigError>([&] { schedulePipeline(back, optionsFor(back, "gpipe")); }),
             "forward node %f reads backward node %b");
  ir::Graph fin = ir::parseGraph(R"(
graph @g(%x: f32[4] input) {
  %f0: f32[4] = aten::relu(%x) {layer="s0", phase=fwd, mb=0}
  %f1: f32[4] = aten::relu(%x) {layer="s0", phase=fwd, mb=1}
  %sum: f32[4] = aten::add.Tensor(%f0, %f1) {layer="s0", phase=fwd}
  %b1: f32[4] = aten::neg(%sum) {layer="s0", phase=bwd, mb=1}
  return %b1
}
)");
  EXPECT_HAS(messageOf<ConfigError>([&] { schedulePipeline(fin, optionsFor(fin, "gpipe")); }),
             "micro-batch node %b1 (mb=1) reads %sum, which combines micro-batches");
  ir::Graph upd = ir::parseGraph(R"(
graph @g(%x: f32[4] input) {
  %u: f32[4] = aten::relu(%x) {layer="s0", phase=update, mb=0}
  return %u
}
)");
  EXPECT_HAS(messageOf<ConfigError>([&] { schedulePipeline(upd, optionsFor(upd, "gpipe")); }),
             "update node %u has mb=0");
}

// examples/ir/mlp_pipeline_gpipe.txt is exactly what schedule + lower make
// of its graph (devices dropped) with fc1 on stage 0 and fc2 / loss on 1.
TEST(PipelineSchedule, RegeneratesTheGPipeExampleProgram) {
  ir::Program example =
      ir::parseProgram(modelpar::testing::readExample("mlp_pipeline_gpipe.txt"));
  ir::verify(example);
  ir::Graph g = example.graph();
  for (ir::Input& i : g.inputs()) i.device.reset();
  PipelineScheduleOptions o;
  for (size_t n = 0; n < g.numNodes(); ++n) {
    g.node(static_cast<ir::NodeId>(n)).device.reset();
    const std::string& layer = g.nodes()[n].layer;
    o.stage_of_node.push_back(layer == "fc1" || layer == "input" ? 0 : 1);
  }
  EXPECT_EQ(lower(g, schedulePipeline(g, o)), example);
}

}  // namespace
}  // namespace modelpar::passes
