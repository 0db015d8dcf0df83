// Pass `coarsen`: layer groups, co-placement, cycle-safe fusion, counts.
#include "passes/place/coarsen.h"

#include <gtest/gtest.h>

#include <random>

#include "ir/error.h"
#include "ir/parser.h"
#include "passes/cost/cost_model.h"
#include "passes/place/task_graph.h"
#include "tests/passes/test_graphs.h"

namespace modelpar::passes {
namespace {

// Two linear layers, a loss, and their backward (fc1, fc2, loss layers):
//
//   x ─ c ─ h1 ─ a1 ─┬─ h2 ─ l ─┬─ g2
//       (fc1)  (fc1) │   (fc2)  ├─ ga ─┐
//                    ├──────────┼──────┼─ g1 (fc1, bwd)
//                    └─ g2      │      │
//  c has no layer and one consumer (h1): co-placed into fc1.
//  Fusing a1 with g1 would close a1 → h2 → l → ga → g1 → (a1+g1): refused.
constexpr const char* kTwoLayers = R"(
graph @t(%x: f32[4] input, %w1: f32[4] param, %w2: f32[4] param) {
  %c: f32[4] = aten::clone(%x)
  %h1: f32[4] = aten::mul.Tensor(%c, %w1) {layer="fc1", phase=fwd}
  %a1: f32[4] = aten::relu(%h1) {layer="fc1", phase=fwd}
  %h2: f32[4] = aten::mul.Tensor(%a1, %w2) {layer="fc2", phase=fwd}
  %l: f32[] = aten::sum(%h2) {layer="loss"}
  %g2: f32[4] = aten::mul.Tensor(%a1, %l) {layer="fc2", phase=bwd}
  %ga: f32[4] = aten::mul.Tensor(%w2, %l) {layer="fc2", phase=bwd}
  %g1: f32[4] = aten::mul.Tensor(%a1, %ga) {layer="fc1", phase=bwd}
  return %g1, %g2
}
)";

int32_t unitOf(const ir::Graph& g, const Coarsening& c, const char* v) {
  return c.unit_of_node[static_cast<size_t>(g.value(*g.findValue(v)).producer)];
}
int32_t groupOf(const ir::Graph& g, const Coarsening& c, const char* v) {
  return c.group_of_node[static_cast<size_t>(g.value(*g.findValue(v)).producer)];
}

TEST(Coarsen, GroupsLayersCoplacesAndFusesWithoutCycles) {
  ir::Graph g = ir::parseGraph(kTwoLayers);
  estimateCosts(g, DeviceModel::uniform(1));
  Coarsening c = coarsen(g);
  EXPECT_EQ(c.nodes_before, 8);
  EXPECT_EQ(c.num_groups, 3);  // fc1 (+ c), fc2, loss
  EXPECT_EQ(c.coplaced, 1);
  EXPECT_EQ(c.fused, 2);       // c+h1, then +a1
  EXPECT_EQ(c.num_units, 6);   // {c,h1,a1} {h2} {l} {g2} {ga} {g1}
  EXPECT_EQ(unitOf(g, c, "c"), unitOf(g, c, "a1"));
  EXPECT_NE(unitOf(g, c, "a1"), unitOf(g, c, "g1"));
  EXPECT_EQ(groupOf(g, c, "a1"), groupOf(g, c, "g1"));  // fwd and bwd of a layer together
  EXPECT_EQ(groupOf(g, c, "h2"), groupOf(g, c, "ga"));
  EXPECT_NE(groupOf(g, c, "h2"), groupOf(g, c, "l"));
  EXPECT_NO_THROW(buildTaskGraph(g, &c));  // the unit graph is a DAG
}

TEST(Coarsen, CoplacementAcrossLayersOnlyWhenAsked) {
  ir::Graph g = ir::parseGraph(kTwoLayers);
  estimateCosts(g, DeviceModel::uniform(1));
  CoarsenOptions o;
  o.coplace_across_layers = true;
  Coarsening c = coarsen(g, o);
  // h2 -> l joins fc2 and loss; ga -> g1 joins fc2 and fc1.
  EXPECT_EQ(c.num_groups, 1);
  EXPECT_NO_THROW(buildTaskGraph(g, &c));
}

TEST(Coarsen, NodeUnitsKeepsOneUnitPerNode) {
  ir::Graph g = ir::parseGraph(kTwoLayers);
  Coarsening c = nodeUnits(g);
  EXPECT_EQ(c.num_units, 8);
  EXPECT_EQ(c.num_groups, 4);  // c alone, fc1, fc2, loss
  EXPECT_EQ(c.fused + c.coplaced, 0);
}

TEST(Coarsen, RandomLayeredGraphsStayAcyclic) {
  std::mt19937 rng(11);
  for (int trial = 0; trial < 50; ++trial) {
    ir::Graph g = testing::randomDag(rng, 40, 0.15, 64);
    std::uniform_int_distribution<int> layer(0, 5);
    for (size_t i = 0; i < g.numNodes(); ++i) {
      int l = layer(rng);
      if (l > 0) g.node(static_cast<ir::NodeId>(i)).layer = "L" + std::to_string(l);
    }
    Coarsening c = coarsen(g);
    EXPECT_LE(c.num_units, 40);
    TaskGraph tg = buildTaskGraph(g, &c);  // throws on a cycle
    EXPECT_EQ(tg.numTasks(), c.num_units);
  }
}

TEST(TaskGraph, RejectsNodesWithoutCost) {
  ir::Graph g = ir::parseGraph(kTwoLayers);
  try {
    buildTaskGraph(g);
    FAIL();
  } catch (const ConfigError& e) {
    EXPECT_NE(std::string(e.what()).find("%c"), std::string::npos) << e.what();
    EXPECT_NE(std::string(e.what()).find("run the cost pass first"), std::string::npos);
  }
}

TEST(TaskGraph, RejectsAGroupingWithACycle) {
  ir::Graph g = ir::parseGraph(kTwoLayers);
  estimateCosts(g, DeviceModel::uniform(1));
  Coarsening c = nodeUnits(g);
  // Put a1 and g1 in one unit by hand: a1 -> h2 -> l -> ga -> g1 closes a cycle.
  c.unit_of_node[7] = c.unit_of_node[2];
  c.num_units = 7;  // g1 was unit 7, the last
  try {
    buildTaskGraph(g, &c);
    FAIL();
  } catch (const ConfigError& e) {
    EXPECT_NE(std::string(e.what()).find("cycle"), std::string::npos) << e.what();
  }
}

TEST(TaskGraph, RejectsGroupingsThatDoNotMatchTheGraph) {
  ir::Graph g = ir::parseGraph(kTwoLayers);
  estimateCosts(g, DeviceModel::uniform(1));
  Coarsening c = nodeUnits(g);
  c.unit_of_node.pop_back();
  try {
    buildTaskGraph(g, &c);
    FAIL();
  } catch (const ConfigError& e) {
    EXPECT_NE(std::string(e.what()).find("covers 7 nodes but graph @t has 8"), std::string::npos)
        << e.what();
  }
  c = nodeUnits(g);
  c.unit_of_node[3] = c.unit_of_node[2];  // h2 (fc2) into a1's unit (fc1)
  c.unit_of_node[7] = 3;
  try {
    buildTaskGraph(g, &c);
    FAIL();
  } catch (const ConfigError& e) {
    EXPECT_NE(std::string(e.what()).find("spans colocation groups"), std::string::npos) << e.what();
  }
}

TEST(Coarsen, InPlaceUpdateWaitsForEarlierReaders) {
  // ^upd writes %w in place; %a reads %w, so %a must run before ^upd even
  // though no value flows from %a to ^upd.
  ir::Graph g = ir::parseGraph(R"(
graph @u(%x: f32[4] input, %w: f32[4] param, %gw: f32[4] input) {
  %a: f32[4] = aten::mul.Tensor(%x, %w) {cost={time_us=1.0, out=16, temp=0, persist=0}}
  ^upd = aten::_foreach_add_([%w], [%gw]) {phase=update, cost={time_us=1.0, out=0, temp=0, persist=0}}
  return %a
}
)");
  TaskGraph tg = buildTaskGraph(g);
  ASSERT_EQ(tg.numTasks(), 2);
  ASSERT_EQ(tg.succsOf(0).size(), 1u);
  EXPECT_EQ(tg.succsOf(0)[0], 1);
}

}  // namespace
}  // namespace modelpar::passes
