// searchStrategy(): the chosen candidate is the simulator's minimum, the
// bounds and times are the hand-computed ones, pruning skips only what
// cannot win, and a step that fits nowhere is an error naming why.
#include "passes/search/strategy_search.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <iterator>
#include <limits>
#include <string>

#include "ir/error.h"
#include "passes/lower/chrome_trace.h"
#include "passes/option_names.h"
#include "passes/pipeline/layer_order.h"
#include "ir/parser.h"
#include "tests/support/expect_error.h"
#include "tests/support/read_file.h"

namespace modelpar::passes {
namespace {

using testing::messageOf;

// Two independent layers with profiled costs (kept by pass `cost`):
//
//   %x ──relu (a, 100 us)──► %ra
//   %y ──relu (b, 100 us)──► %rb
//
// One device: 100 + 100 = 200 us. Two devices: a and b side by side, 100 us
// (graph inputs live on their reader's device: no transfer). The step has
// no loss, so there are no pipeline candidates.
constexpr const char* kTwoBranches = R"(
graph @two(%x: f32[B, 4] input, %y: f32[B, 4] input) {
  %ra: f32[B, 4] = aten::relu(%x) {layer="a", phase=fwd, cost={time_us=100, out=64, temp=0, persist=0}}
  %rb: f32[B, 4] = aten::relu(%y) {layer="b", phase=fwd, cost={time_us=100, out=64, temp=0, persist=0}}
  return %ra, %rb
}
)";

StrategySearchOptions twoDevices(int64_t batch = 4) {
  StrategySearchOptions o;
  o.devices = 2;
  o.batch_size = batch;
  o.pipelines = false;
  return o;
}

TEST(StrategySearch, BoundsAndTimesMatchHandComputationOnTwoBranches) {
  ir::Graph g = ir::parseGraph(kTwoBranches);
  StrategySearchOptions o = twoDevices();
  o.prune = false;
  StrategySearch s = searchStrategy(g, o);
  ASSERT_EQ(s.candidates.size(), 4u);  // one-device, m-topo, m-etf, m-sct
  // T1 = 200 us; bound = T1 / n with m = 1 (Note [A lower bound per candidate]).
  EXPECT_DOUBLE_EQ(s.t1_us, 200.0);
  EXPECT_EQ(s.candidates[0].label(), "one-device");
  EXPECT_DOUBLE_EQ(s.candidates[0].lower_bound_us, 200.0);
  EXPECT_DOUBLE_EQ(s.candidates[0].step_us, 200.0);
  for (size_t i = 1; i < 4; ++i) {
    SCOPED_TRACE(s.candidates[i].label());
    EXPECT_EQ(s.candidates[i].status, CandidateStatus::Ok);
    EXPECT_DOUBLE_EQ(s.candidates[i].lower_bound_us, 100.0);
  }
  // m-ETF runs the two layers side by side: 100 us.
  EXPECT_DOUBLE_EQ(s.candidates[2].step_us, 100.0);
}

TEST(StrategySearch, ChoosesTheSimulatorsMinimumAndPrunesWhatCannotBeatIt) {
  ir::Graph g = ir::parseGraph(kTwoBranches);
  StrategySearch s = searchStrategy(g, twoDevices());
  double best = std::numeric_limits<double>::infinity();
  for (const StrategyCandidate& c : s.candidates) {
    if (c.status == CandidateStatus::Ok) best = std::min(best, c.step_us);
  }
  EXPECT_DOUBLE_EQ(s.chosenCandidate().step_us, best);
  EXPECT_DOUBLE_EQ(best, 100.0);
  ASSERT_TRUE(s.placement.has_value());
  EXPECT_FALSE(s.pipeline.has_value());
  EXPECT_DOUBLE_EQ(s.placement->stepTimeUs(), 100.0);
  // The one-device bound (200 us) exceeds the best step (100 us): pruned.
  EXPECT_EQ(s.candidates[0].status, CandidateStatus::Pruned);
  EXPECT_NE(s.candidates[0].reason.find("bound 200 us"), std::string::npos) << s.candidates[0].reason;
  EXPECT_NE(s.table().find("* "), std::string::npos) << s.table();
}

// strategy="auto" with a trace writes the chosen plan's simulated timeline:
// without record_timeline the search keeps none (toChromeTrace refuses).
TEST(StrategySearch, TheChosenPlanKeepsItsTimelineWhenAskedTo) {
  ir::Graph g = ir::parseGraph(kTwoBranches);
  StrategySearch without = searchStrategy(g, twoDevices());
  ASSERT_TRUE(without.placement.has_value());
  EXPECT_TRUE(without.placement->simulation.start_us.empty());
  StrategySearchOptions o = twoDevices();
  o.record_timeline = true;
  StrategySearch s = searchStrategy(g, o);
  ASSERT_TRUE(s.placement.has_value());
  const SimulationReport& sim = s.placement->simulation;
  ASSERT_EQ(sim.end_us.size(), 2u);  // m-ETF: a on one device, b on the other
  for (const std::vector<double>& ends : sim.end_us) {
    ASSERT_FALSE(ends.empty());
    EXPECT_DOUBLE_EQ(*std::max_element(ends.begin(), ends.end()), 100.0);
  }
  const std::string trace = toChromeTrace(s.placement->program, sim);
  EXPECT_NE(trace.find("aten::relu"), std::string::npos) << trace;
}

// Rounding is a tie, and a tie goes to the earlier (simpler) candidate,
// whatever order the candidates were planned in.
TEST(StrategySearch, ATieWithinRoundingGoesToTheEarlierCandidate) {
  EXPECT_TRUE(beatsBest(500.0, 3, 0.0, -1));             // the first one planned
  EXPECT_FALSE(beatsBest(116.41999999999999, 1, 116.42, 0));  // m-topo vs one-device
  EXPECT_TRUE(beatsBest(116.42, 0, 116.41999999999999, 1));   // planned the other way
  EXPECT_TRUE(beatsBest(116.0, 5, 116.42, 0));           // really faster
  EXPECT_FALSE(beatsBest(116.42, 0, 116.0, 5));
  EXPECT_FALSE(beatsBest(116.42, 2, 116.42, 1));
}

TEST(StrategySearch, PipelineCandidatesCoverSchedulesMicrobatchesPartitionsAndCheckpoints) {
  ir::Graph step = ir::parseGraph(testing::readExample("skip_step_symbolic.txt"));
  StrategySearchOptions o;
  o.devices = 2;
  o.batch_size = 8;
  o.prune = false;
  StrategySearch s = searchStrategy(step, o);
  // 1 + 3 placers + m in {2, 4, 8} x (gpipe, 1f1b, zb-h1: 3 partitions;
  // 1f1b*: 4; zb-v and interleaved per v: 2, not balance-time-comm) x 3
  // checkpoints and per_layer; v = 2, and 3 when the step has 6 layers.
  const size_t vs = orderLayers(step).layers.size() >= 6 ? 2 : 1;
  EXPECT_EQ(s.candidates.size(), 1u + 3u + 3u * (3u * 3u + 4u + 2u + 2u * vs) * 4u);
  double best = std::numeric_limits<double>::infinity();
  int pipelines_ok = 0;
  for (const StrategyCandidate& c : s.candidates) {
    SCOPED_TRACE(c.label() + ": " + c.reason);
    EXPECT_NE(c.status, CandidateStatus::Pruned);
    if (c.status != CandidateStatus::Ok) continue;
    best = std::min(best, c.step_us);
    EXPECT_GE(c.step_us, c.lower_bound_us * (1 - 1e-9));  // the bound is a bound
    pipelines_ok += c.kind == "pipeline";
    EXPECT_GT(c.peak_bytes, 0);
  }
  EXPECT_GT(pipelines_ok, 0);
  EXPECT_DOUBLE_EQ(s.chosenCandidate().step_us, best);
  const double chosen_plan_us =
      s.pipeline ? s.pipeline->stepTimeUs() : s.placement->stepTimeUs();
  EXPECT_DOUBLE_EQ(chosen_plan_us, best);

  // Pruning changes what is planned, never what is chosen.
  o.prune = true;
  StrategySearch pruned = searchStrategy(step, o);
  EXPECT_EQ(pruned.chosen, s.chosen);
  EXPECT_DOUBLE_EQ(pruned.chosenCandidate().step_us, best);
}

// Pipelines only, 2 devices, batch 8, m = 4, balance-time, no checkpoint,
// every candidate planned: one candidate per schedule (and v).
StrategySearchOptions pipelinesAtFourMicrobatches() {
  StrategySearchOptions o;
  o.devices = 2;
  o.batch_size = 8;
  o.prune = false;
  o.one_device = false;
  o.placements = false;
  o.microbatches = {4};
  o.checkpoints = {"never"};
  o.partitions = {"balance-time"};
  return o;
}

// checkpoint='per_layer' in the search (Note [Recompute per layer]): 1F1B,
// batch 64, m = 4. With no limit it is pruned as never's twin; at always's
// peak (where never and except_last do not fit) it is planned, fits, and is
// chosen over always, whose step recomputes every layer.
TEST(StrategySearch, PerLayerIsPlannedWhereNeverDoesNotFitAndBeatsAlways) {
  ir::Graph step = ir::parseGraph(testing::readExample("skip_step_symbolic.txt"));
  StrategySearchOptions o = pipelinesAtFourMicrobatches();
  o.batch_size = 64;
  o.schedules = {"1f1b"};
  o.checkpoints = {"always", "except_last", "never", "per_layer"};
  o.prune = true;
  StrategySearch free = searchStrategy(step, o);
  ASSERT_EQ(free.candidates.size(), 4u);
  EXPECT_EQ(free.candidates[3].status, CandidateStatus::Pruned);
  EXPECT_HAS(free.candidates[3].reason, "checkpoint='never' fits");
  EXPECT_EQ(free.chosenCandidate().checkpoint, "never");

  const int64_t limit = free.candidates[0].peak_bytes;  // always's
  ASSERT_LT(limit, free.candidates[2].peak_bytes);
  o.memory_bytes = {limit};
  StrategySearch bound = searchStrategy(step, o);
  EXPECT_EQ(bound.candidates[1].status, CandidateStatus::DoesNotFit);  // except_last
  EXPECT_EQ(bound.candidates[2].status, CandidateStatus::DoesNotFit);  // never
  ASSERT_EQ(bound.candidates[3].status, CandidateStatus::Ok) << bound.candidates[3].reason;
  EXPECT_LE(bound.candidates[3].peak_bytes, limit);
  EXPECT_LT(bound.candidates[3].step_us, bound.candidates[0].step_us);
  EXPECT_EQ(bound.chosenCandidate().checkpoint, "per_layer");
  ASSERT_TRUE(bound.pipeline.has_value());
  EXPECT_FALSE(bound.pipeline->recomputed_layers.empty());
}

// Note [Schedules in the search]: interleaved 1F1B is searched by default
// with each v of {2, 3} whose N·v stages the layers allow, and with the v
// named; zb-h1 by default too.
TEST(StrategySearch, InterleavedIsSearchedWithTheStagesPerDeviceTheLayersAllow) {
  ir::Graph step = ir::parseGraph(testing::readExample("skip_step_symbolic.txt"));
  const int layers = static_cast<int>(orderLayers(step).layers.size());
  ASSERT_GE(layers, 4);  // v = 2 on 2 devices fits; v = 3 only if 6 layers
  StrategySearchOptions o = pipelinesAtFourMicrobatches();
  StrategySearch all = searchStrategy(step, o);
  std::vector<int> vs;
  for (const StrategyCandidate& c : all.candidates) {
    SCOPED_TRACE(c.label() + ": " + c.reason);
    EXPECT_EQ(c.status, CandidateStatus::Ok);
    if (c.schedule == "interleaved") vs.push_back(c.virtual_stages);
    else EXPECT_EQ(c.virtual_stages, c.schedule == "zb-v" ? 2 : 1);
  }
  std::vector<int> expected{2};
  if (layers >= 6) expected.push_back(3);
  EXPECT_EQ(vs, expected);
  // Every schedule, once each (interleaved once per v; zb-v with its 2).
  EXPECT_EQ(all.candidates.size(), std::size(kPipelineScheduleNames) - 1 + expected.size());

  o.schedules = {"interleaved"};
  StrategySearch only = searchStrategy(step, o);
  ASSERT_TRUE(only.pipeline.has_value());
  EXPECT_EQ(only.pipeline->schedule, "interleaved");
  EXPECT_EQ(only.pipeline->virtual_stages, 2);
  EXPECT_EQ(only.pipeline->partition.stage_device, (std::vector<int>{0, 1, 0, 1}));
  EXPECT_EQ(only.candidates.front().label(),
            "pipeline interleaved v=2 m=4 balance-time checkpoint=never");

  // Named counts are planned whatever the layers: more stages than layers
  // fail, saying why.
  o.virtual_stages = {2, layers};
  StrategySearch named = searchStrategy(step, o);
  ASSERT_EQ(named.candidates.size(), 2u);
  EXPECT_EQ(named.candidates[0].status, CandidateStatus::Ok);
  EXPECT_EQ(named.candidates[1].virtual_stages, layers);
  EXPECT_EQ(named.candidates[1].status, CandidateStatus::Failed);
  EXPECT_HAS(named.candidates[1].reason, "cannot be cut into devices=2 x virtual_stages=");

  o.virtual_stages = {1};
  EXPECT_HAS(messageOf<ConfigError>([&] { searchStrategy(step, o); }),
             "virtual_stages=1 is not valid on 2 devices; give stages per device for schedule "
             "'interleaved' from 2 to 32");
}

// A step too small for N·2 stages gets no interleaved candidate unless
// interleaved is named, then one that fails saying why.
TEST(StrategySearch, InterleavedIsLeftOutWhenTheLayersCannotGiveTwoStagesPerDevice) {
  ir::Graph step = ir::parseGraph(testing::readExample("skip_step_symbolic.txt"));
  const int layers = static_cast<int>(orderLayers(step).layers.size());
  StrategySearchOptions o;
  o.devices = (layers + 1) / 2;  // N·2 > layers >= N
  o.batch_size = 8;
  o.prune = false;
  o.one_device = false;
  o.placements = false;
  o.microbatches = {o.devices};
  o.checkpoints = {"never"};
  o.partitions = {"balance-time"};
  ASSERT_GE(o.devices, 2);
  StrategySearch all = searchStrategy(step, o);
  for (const StrategyCandidate& c : all.candidates) EXPECT_NE(c.schedule, "interleaved") << c.label();
  o.schedules = {"interleaved"};
  EXPECT_HAS(messageOf<PlanDoesNotFitError>([&] { searchStrategy(step, o); }),
             "virtual_stages=2");
}

// zb-h1 is searched by default and, on the same stages, beats 1F1B.
TEST(StrategySearch, ZeroBubbleH1IsSearchedByDefaultAndBeatsOneFOneB) {
  ir::Graph step = ir::parseGraph(testing::readExample("skip_step_symbolic.txt"));
  StrategySearchOptions o = pipelinesAtFourMicrobatches();
  StrategySearch all = searchStrategy(step, o);
  const auto zb = std::find_if(all.candidates.begin(), all.candidates.end(),
                               [](const StrategyCandidate& c) { return c.schedule == "zb-h1"; });
  ASSERT_NE(zb, all.candidates.end());
  EXPECT_EQ(zb->status, CandidateStatus::Ok) << zb->reason;

  o.schedules = {"1f1b", "zb-h1"};
  StrategySearch s = searchStrategy(step, o);
  ASSERT_EQ(s.candidates.size(), 2u);
  for (const StrategyCandidate& c : s.candidates) EXPECT_EQ(c.status, CandidateStatus::Ok) << c.label();
  ASSERT_TRUE(s.pipeline.has_value());
  EXPECT_EQ(s.pipeline->schedule, "zb-h1");  // faster than 1F1B on the same stages
  EXPECT_LT(s.candidates[1].step_us, s.candidates[0].step_us);
}

TEST(StrategySearch, CandidatesOverMemoryAreDroppedAndNoneFittingIsAnError) {
  ir::Graph step = ir::parseGraph(testing::readExample("skip_step_symbolic.txt"));
  StrategySearchOptions o;
  o.devices = 2;
  o.batch_size = 8;
  o.memory_bytes = {64};  // less than one weight matrix
  try {
    searchStrategy(step, o);
    FAIL() << "expected PlanDoesNotFitError";
  } catch (const PlanDoesNotFitError& e) {
    std::string m = e.what();
    EXPECT_NE(m.find("none of the"), std::string::npos) << m;
    // One line per distinct reason, naming the candidates that gave it
    // (candidate_reasons.h): the one-device plan and m-ETF fail alike.
    EXPECT_NE(m.find("2 candidates (one-device, placement m-etf): modelpar place-metf"),
              std::string::npos) << m;
    EXPECT_EQ(m.find("place-metf", m.find("place-metf") + 1), std::string::npos) << m;
    EXPECT_NE(m.find("more memory"), std::string::npos) << m;
  }
}

// A step with a static batch cannot be micro-batched: one "pipelines" row
// says why, the placements are searched as usual.
TEST(StrategySearch, AStaticBatchListsWhyThereAreNoPipelines) {
  ir::Graph g = ir::parseGraph(R"(
graph @static(%x: f32[4, 4] input, %y: f32[4, 4] input) {
  %ra: f32[4, 4] = aten::relu(%x) {layer="a", phase=fwd}
  %rb: f32[4, 4] = aten::relu(%y) {layer="b", phase=fwd}
  return %ra, %rb
}
)");
  StrategySearchOptions o;
  o.devices = 2;
  o.batch_size = 4;
  StrategySearch s = searchStrategy(g, o);
  ASSERT_EQ(s.candidates.size(), 5u);  // one-device, 3 placers, the pipelines row
  EXPECT_EQ(s.candidates.back().label(), "pipelines");
  EXPECT_EQ(s.candidates.back().status, CandidateStatus::Failed);
  EXPECT_NE(s.candidates.back().reason.find("static"), std::string::npos)
      << s.candidates.back().reason;
  EXPECT_NE(s.chosenCandidate().kind, "pipeline");
}

TEST(StrategySearch, RejectsBadOptionsBeforePlanning) {
  ir::Graph g = ir::parseGraph(kTwoBranches);
  StrategySearchOptions o = twoDevices();
  o.batch_size.reset();
  EXPECT_NE(messageOf<ConfigError>([&] { searchStrategy(g, o); }).find("batch_size is required"),
            std::string::npos);
  o = twoDevices();
  o.devices = 0;
  EXPECT_NE(messageOf<ConfigError>([&] { searchStrategy(g, o); }).find("devices=0"),
            std::string::npos);
  o = twoDevices();
  o.placers = {"m-best"};
  EXPECT_NE(messageOf<ConfigError>([&] { searchStrategy(g, o); }).find("placer='m-best'"),
            std::string::npos);
  ir::Graph step = ir::parseGraph(testing::readExample("skip_step_symbolic.txt"));
  o = twoDevices(8);
  o.pipelines = true;
  o.microbatches = {16};
  EXPECT_NE(messageOf<ConfigError>([&] { searchStrategy(step, o); }).find("microbatches=16"),
            std::string::npos);
}

}  // namespace
}  // namespace modelpar::passes
