// Pass `place-msct`: the favourite-child LP and its rounding, classic list
// scheduling bounds with free communication, single device with costly
// communication.
#include "passes/place/place_msct.h"

#include <gtest/gtest.h>

#include <atomic>
#include <random>
#include <thread>

#include "ir/error.h"
#include "ir/parser.h"
#include "passes/lower/lower.h"
#include "passes/lower/simulate.h"
#include "tests/passes/test_graphs.h"

namespace modelpar::passes {
namespace {

using testing::machine;

// r (10 us) feeds c1 through 10 KiB (12 us to move) and c2 through 1 KiB
// (3 us); both children take 20 us.
//        r
//   12 /   \ 3
//     c1    c2
// (r is fused with a 1 us sum, so it takes 11 us.) LP: x1 + x2 >= 1 (one
// favourite at most); w >= 11 + 12 x1 + 20 and w >= 11 + 3 x2 + 20. The
// optimum balances 12 x1 = 3 x2: x1 = 0.2, x2 = 0.8, w = 33.4. Rounding at
// 0.5 makes c1 r's favourite.
TEST(PlaceMSct, TheHeavierEdgeBecomesTheFavourite) {
  ir::Graph g = ir::parseGraph(R"(
graph @fork(%x: f32[256] input) {
  %r: f32[2560] = aten::relu(%x) {layer="rs", cost={time_us=10.0, out=10240, temp=0, persist=0}}
  %s: f32[256] = aten::sum.dim_IntList(%r, [0], keepdim=false, dtype=None) {layer="rs", cost={time_us=1.0, out=1024, temp=0, persist=0}}
  %c1: f32[2560] = aten::relu(%r) {cost={time_us=20.0, out=10240, temp=0, persist=0}}
  %c2: f32[256] = aten::relu(%s) {cost={time_us=20.0, out=1024, temp=0, persist=0}}
  return %c1, %c2
}
)");
  // Units: r+s are fused by hand so that r's edges carry 10 KiB and 1 KiB.
  Coarsening units = nodeUnits(g);
  units.unit_of_node = {0, 0, 1, 2};
  units.num_units = 3;
  TaskGraph tg = buildTaskGraph(g, &units);
  MSctStats stats;
  MSctOptions o;
  o.stats = &stats;
  std::vector<int32_t> fav = favouriteChildren(tg, machine(2), o);
  EXPECT_TRUE(stats.lp_optimal);
  EXPECT_NEAR(stats.lp_makespan_us, 33.4, 1e-6);
  EXPECT_EQ(fav, (std::vector<int32_t>{1, -1, -1}));
  EXPECT_EQ(stats.favourite_edges, 1);
}

TEST(PlaceMSct, RoundingKeepsOneFavouritePerParentAndChild) {
  std::mt19937 rng(3);
  for (int trial = 0; trial < 30; ++trial) {
    ir::Graph g = testing::randomDag(rng, 40, 0.15, 4096);
    TaskGraph tg = buildTaskGraph(g);
    MSctOptions o;
    o.threshold = 0.9;  // generous: many candidates, the rules must still hold
    if (trial % 2) {    // and with the LP solved in windows of 7 tasks
      o.lp_whole_max_tasks = 0;
      o.lp_window_tasks = 7;
    }
    std::vector<int32_t> fav = favouriteChildren(tg, machine(3, int64_t{1} << 40, 2.0, 64.0), o);
    std::vector<int> parents(fav.size(), 0);
    for (size_t i = 0; i < fav.size(); ++i) {
      if (fav[i] < 0) continue;
      auto succ = tg.succsOf(static_cast<int32_t>(i));
      EXPECT_NE(std::find(succ.begin(), succ.end(), fav[i]), succ.end());
      ++parents[static_cast<size_t>(fav[i])];
    }
    for (int p : parents) EXPECT_LE(p, 1);
  }
}

double criticalPath(const TaskGraph& tg) {
  std::vector<double> finish(static_cast<size_t>(tg.numTasks()), 0.0);
  double cp = 0;
  for (int32_t t : tg.topo) {
    double start = 0;
    for (int32_t p : tg.predsOf(t)) start = std::max(start, finish[static_cast<size_t>(p)]);
    finish[static_cast<size_t>(t)] = start + tg.time_us[static_cast<size_t>(t)];
    cp = std::max(cp, finish[static_cast<size_t>(t)]);
  }
  return cp;
}

TEST(PlaceMSct, MeetsGrahamsBoundsWithFreeCommunication) {
  std::mt19937 rng(17);
  for (int trial = 0; trial < 40; ++trial) {
    int m = 2 + trial % 3;
    ir::Graph g = testing::randomDag(rng, 50, 0.08, 4096);
    TaskGraph tg = buildTaskGraph(g);
    double work = 0;
    for (double t : tg.time_us) work += t;
    double cp = criticalPath(tg);
    DeviceModel free_comm = machine(m, int64_t{1} << 40, 0.0, 1e18);
    Placement p = placeMSct(g, tg, free_comm);
    double lower_bound = std::max(cp, work / m);
    double graham = work / m + (1.0 - 1.0 / m) * cp;
    EXPECT_GE(p.makespan_us, lower_bound - 1e-6);
    EXPECT_LE(p.makespan_us, graham + 1e-6);
    SimulationReport r = simulate(lower(g, p), free_comm);
    EXPECT_NEAR(r.step_time_us, p.makespan_us, 1e-6);
  }
}

TEST(PlaceMSct, KeepsASingleSourceGraphOnOneDeviceWhenCommunicationIsHuge) {
  std::mt19937 rng(23);
  for (int trial = 0; trial < 20; ++trial) {
    ir::Graph g = testing::randomDag(rng, 40, 0.1, 4096, /*single_source=*/true);
    Placement p = placeMSct(g, machine(2 + trial % 3, int64_t{1} << 40, 1e9, 1.0));
    for (int32_t d : p.node_device) EXPECT_EQ(d, p.node_device[0]);
  }
}

// A chain a -> b -> c -> d of 10 us tasks, 1 KiB edges (3 us on machine(2)),
// solved in two windows of two tasks.
//   window {a, b}: s_b >= s_a + 10 + 3 x_ab; b's successor lies beyond, so
//     s_b + 10 <= w; minimum w = 20 at x_ab = 0, s_a = 0, s_b = 10 (the
//     small weight on the starts pins them to their earliest times);
//   window {c, d}: s_c >= s_b + 10 + 3 x_bc with s_b = 10 fixed,
//     s_d >= s_c + 10 + 3 x_cd, s_d + 10 <= w: w = 40 at x = 0.
// Every edge rounds to a favourite: the chain stays on one device.
TEST(PlaceMSct, WindowedLpFixesEarlierStartsAndKeepsTheChainTogether) {
  ir::Graph g("chain");
  ir::ValueId v = g.addInput("x", testing::f32(256), ir::InputRole::Input);
  for (const char* name : {"a", "b", "c", "d"}) {
    v = g.node(testing::addTask(g, name, {v}, 1024, 10.0)).outputs[0];
  }
  g.setOutputs({v});
  TaskGraph tg = buildTaskGraph(g);
  MSctStats stats;
  MSctOptions o;
  o.stats = &stats;
  o.lp_window_tasks = 2;
  o.lp_whole_max_tasks = 0;
  std::vector<int32_t> fav = favouriteChildren(tg, machine(2), o);
  EXPECT_EQ(stats.lp_windows, 2);
  EXPECT_TRUE(stats.lp_optimal);
  EXPECT_NEAR(stats.lp_makespan_us, 40.0, 1e-6);
  EXPECT_EQ(fav, (std::vector<int32_t>{1, 2, 3, -1}));
  Placement p = placeMSct(g, tg, machine(2), o);
  for (int32_t d : p.node_device) EXPECT_EQ(d, p.node_device[0]);
  EXPECT_DOUBLE_EQ(p.makespan_us, 40.0);
  // Graphs up to lp_whole_max_tasks solve one LP.
  o.lp_whole_max_tasks = 4;
  favouriteChildren(tg, machine(2), o);
  EXPECT_EQ(stats.lp_windows, 1);
}

TEST(PlaceMSct, WindowedLpKeepsGrahamsBoundsAndCostlyGraphsOnOneDevice) {
  std::mt19937 rng(29);
  MSctOptions o;
  o.lp_window_tasks = 9;
  o.lp_whole_max_tasks = 0;
  for (int trial = 0; trial < 20; ++trial) {
    int m = 2 + trial % 3;
    ir::Graph g = testing::randomDag(rng, 50, 0.08, 4096);
    TaskGraph tg = buildTaskGraph(g);
    double work = 0;
    for (double t : tg.time_us) work += t;
    Placement p = placeMSct(g, tg, machine(m, int64_t{1} << 40, 0.0, 1e18), o);
    EXPECT_LE(p.makespan_us, work / m + (1.0 - 1.0 / m) * criticalPath(tg) + 1e-6);
    ir::Graph one = testing::randomDag(rng, 40, 0.1, 4096, /*single_source=*/true);
    Placement q = placeMSct(one, machine(m, int64_t{1} << 40, 1e9, 1.0), o);
    for (int32_t d : q.node_device) EXPECT_EQ(d, q.node_device[0]);
  }
}

// Note [An LP that does not depend on the clock]: an LP stopped by its
// iteration limit rounds the same favourites whatever the clock allows and
// whatever else loads the machine. Two threads spin on the cores while the
// same 300-task LP, cut short at 20 iterations, is solved with a backstop of
// 1 s and of 1000 s: the same unfinished basis, the same favourites.
TEST(PlaceMSct, TheIterationLimitNotTheClockDecidesAnUnfinishedLp) {
  std::mt19937 rng(41);
  ir::Graph g = testing::randomDag(rng, 300, 0.03, 4096);
  TaskGraph tg = buildTaskGraph(g);
  MSctStats stats;
  MSctOptions o;
  o.stats = &stats;
  o.lp_iteration_limit = 20;
  o.lp_time_limit_s = 1000;
  std::vector<int32_t> reference = favouriteChildren(tg, machine(3), o);
  EXPECT_FALSE(stats.lp_optimal);  // the iteration limit stopped it
  std::atomic<bool> stop{false};
  std::vector<std::thread> load;
  for (int i = 0; i < 2; ++i) {
    load.emplace_back([&] {
      volatile double x = 1;
      while (!stop.load(std::memory_order_relaxed)) x = x * 1.0000001 + 1e-9;
    });
  }
  for (double backstop : {1.0, 1000.0, 1.0}) {
    o.lp_time_limit_s = backstop;
    EXPECT_EQ(favouriteChildren(tg, machine(3), o), reference) << "backstop " << backstop << " s";
  }
  stop = true;
  for (std::thread& t : load) t.join();
  // Unlimited, the LP finishes; the option takes counts >= 0.
  o.lp_iteration_limit = 0;
  favouriteChildren(tg, machine(3), o);
  EXPECT_TRUE(stats.lp_optimal);
  o.lp_iteration_limit = -1;
  EXPECT_THROW(favouriteChildren(tg, machine(3), o), ConfigError);
}

TEST(PlaceMSct, RejectsABadThreshold) {
  ir::Graph g = testing::randomDag(*std::make_unique<std::mt19937>(1), 5, 0.5, 64);
  MSctOptions o;
  o.threshold = 1.5;
  EXPECT_THROW(placeMSct(g, machine(2), o), ConfigError);
}

}  // namespace
}  // namespace modelpar::passes
