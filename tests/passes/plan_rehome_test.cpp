// rehomePlanInputs(): a placed plan with a parameter moved home simulates the
// transfer the move adds (hand-computed); a pipeline's plan is simulated
// again the same way; errors leave nothing half-applied.
#include "passes/plan_rehome.h"

#include <gtest/gtest.h>

#include "ir/error.h"
#include "ir/parser.h"
#include "ir/verifier.h"
#include "passes/lower/simulate.h"
#include "tests/passes/test_graphs.h"
#include "tests/support/expect_error.h"
#include "tests/support/read_file.h"

namespace modelpar::passes {
namespace {

// The diamond of test_graphs.h with a 16 KiB parameter read by layer c.
constexpr const char* kDiamondWithParam = R"(
graph @diamond(%x: f32[256] input, %w: f32[4096] param) {
  %a: f32[256] = aten::relu(%x) {layer="a", cost={time_us=10.0, out=1024, temp=0, persist=0}}
  %b: f32[256] = aten::relu(%a) {layer="b", cost={time_us=20.0, out=1024, temp=0, persist=0}}
  %s: f32[] = aten::sum(%w) {layer="c", cost={time_us=10.0, out=4, temp=0, persist=0}}
  %c: f32[256] = aten::mul.Tensor(%a, %s) {layer="c", cost={time_us=10.0, out=1024, temp=0, persist=0}}
  %d: f32[256] = aten::add.Tensor(%b, %c) {layer="d", cost={time_us=5.0, out=1024, temp=0, persist=0}}
  return %d
}
)";

PlacementPlan placed() {
  PlacementOptions o;
  o.machine = testing::machine(2);  // links: 2 us + 1 us per KiB
  o.dump_dir = "";
  o.pinned_layers = {{"a", 0}, {"b", 0}, {"c", 1}, {"d", 1}};
  return planPlacement(ir::parseGraph(kDiamondWithParam), o);
}

TEST(RehomePlanInputs, ThePlacedStepCountsTheTransferOfTheMovedParameter) {
  PlacementPlan before = placed();
  // %w is bound where c reads it. Device 0: a 0..10, b 10..30; a sent
  // 10..13, b 30..33; device 1: s 0..10, c 13..23, d 33..38.
  ASSERT_EQ(before.program.graph().inputs()[1].device, 1);
  EXPECT_DOUBLE_EQ(before.stepTimeUs(), 38.0);

  PlacementPlan after = rehomePlanInputs(before, {{"w", 0}});
  // %w (16 KiB) now comes from device 0 first, over its one tx channel:
  // 0..18; a queues behind it, 18..21; s 18..28, c 28..38; b 30..33; d
  // 38..43.
  EXPECT_EQ(after.program.graph().inputs()[1].device, 0);
  EXPECT_DOUBLE_EQ(after.stepTimeUs(), 43.0);
  EXPECT_EQ(after.simulation.num_transfers, before.simulation.num_transfers + 1);
  // Device 1's new peak: the received copy of %w (16 KiB) and s's output
  // while s runs (the copy is released after its last read).
  EXPECT_EQ(after.simulation.devices[1].peak_bytes, 16384 + 4);
  EXPECT_LT(before.simulation.devices[1].peak_bytes, 16384);
  EXPECT_NO_THROW(ir::verify(after.program));
  // Nodes do not move: the placement is the plan's own.
  EXPECT_EQ(after.placement.node_device, before.placement.node_device);
  ASSERT_EQ(after.stats.size(), before.stats.size() + 2);
  EXPECT_EQ(after.stats[after.stats.size() - 2].pass, "rehome-inputs");
  EXPECT_EQ(after.stats[after.stats.size() - 2].out, 1);  // one transfer added
  EXPECT_EQ(after.stats.back().pass, "simulate");
  EXPECT_NE(after.summary().find("simulated step time 43 us"), std::string::npos) << after.summary();
}

TEST(RehomePlanInputs, AnInputAtHomeChangesNothing) {
  PlacementPlan before = placed();
  PlacementPlan after = rehomePlanInputs(before, {{"w", 1}});
  EXPECT_DOUBLE_EQ(after.stepTimeUs(), before.stepTimeUs());
  EXPECT_EQ(after.simulation.num_transfers, before.simulation.num_transfers);
}

TEST(RehomePlanInputs, APipelinesStepIsSimulatedAgainWithTheMove) {
  PipelinePlanOptions o;
  o.devices = 2;
  o.microbatches = 2;
  o.batch_size = 8;
  o.schedule = "gpipe";
  o.checkpoint = "never";
  PipelinePlan before =
      planPipeline(ir::parseGraph(modelpar::testing::readExample("skip_step_symbolic.txt")), o);
  int w4 = -1;
  const auto& inputs = before.program.graph().inputs();
  for (size_t k = 0; k < inputs.size(); ++k) {
    if (before.program.graph().value(inputs[k].value).name == "w4") w4 = static_cast<int>(k);
  }
  ASSERT_GE(w4, 0);
  const int bound = inputs[static_cast<size_t>(w4)].device.value_or(0);
  PipelinePlan after = rehomePlanInputs(before, {{"w4", 1 - bound}});
  EXPECT_EQ(after.program.graph().inputs()[static_cast<size_t>(w4)].device, 1 - bound);
  EXPECT_EQ(after.simulation.num_transfers, before.simulation.num_transfers + 1);
  // The plan's step is the simulation of the program it now holds.
  EXPECT_DOUBLE_EQ(after.stepTimeUs(), simulate(after.program, after.machine).step_time_us);
  EXPECT_GE(after.stepTimeUs(), before.stepTimeUs());
}

TEST(RehomePlanInputs, ABadNameIsAnErrorAndThePlanIsUnchanged) {
  PlacementPlan before = placed();
  EXPECT_HAS(modelpar::testing::messageOf<ConfigError>([&] { rehomePlanInputs(before, {{"nope", 0}}); }),
             "nope");
  EXPECT_HAS(modelpar::testing::messageOf<ConfigError>([&] { rehomePlanInputs(before, {{"w", 5}}); }),
             "5");
  EXPECT_EQ(before.program.graph().inputs()[1].device, 1);
  EXPECT_DOUBLE_EQ(before.stepTimeUs(), 38.0);
}

}  // namespace
}  // namespace modelpar::passes
