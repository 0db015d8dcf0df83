// Pass `lower`: verification, frees, errors. Its golden programs (sends after
// producers, inputs sent once per reading device, views keeping their base
// alive) are in tests/passes/golden/lower_*.txt.
#include "passes/lower/lower.h"

#include <gtest/gtest.h>

#include <random>

#include "ir/error.h"
#include "ir/parser.h"
#include "ir/printer.h"
#include "ir/verifier.h"
#include "passes/place/place_metf.h"
#include "tests/passes/test_graphs.h"

namespace modelpar::passes {
namespace {

using testing::machine;
using testing::kDiamondNoLayers;

// a, b on device 0; c, d on device 1 (m-ETF's plan, place_metf_test).
Placement diamondPlacement() {
  Placement p;
  p.placer = "test";
  p.num_devices = 2;
  p.node_device = {0, 0, 1, 1};
  p.order = {{0, 1}, {2, 3}};
  return p;
}

TEST(Lower, WithoutFreesKeepsEverything) {
  ir::Graph g = ir::parseGraph(kDiamondNoLayers);
  LowerOptions o;
  o.emit_frees = false;
  ir::Program p = lower(g, diamondPlacement(), o);
  EXPECT_EQ(p.schedule(0).size(), 4u);
  EXPECT_EQ(p.schedule(1).size(), 4u);
  EXPECT_NO_THROW(ir::verify(p));
  EXPECT_TRUE(g.node(0).device == std::nullopt);  // the caller's graph is untouched
}

TEST(Lower, RejectsAPlacementThatMissesANode) {
  ir::Graph g = ir::parseGraph(kDiamondNoLayers);
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
