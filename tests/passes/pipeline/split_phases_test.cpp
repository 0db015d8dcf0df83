// splitPhases on a pipelined GPipe step (examples/ir/skip_step_symbolic.txt
// on 4 devices, 4 micro-batches): the first part runs no backward work, the
// second starts from what the first carried, bound where it was made, every
// output of the step comes from exactly one part, and both Programs verify.
// (That running first then second equals the unsplit step is tested through
// torch.compile in tests/python/test_compile_pipeline.py and on this example
// in tests/python/test_pipeline_plan.py.)
#include "passes/pipeline/split_phases.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <set>
#include <string>

#include "ir/error.h"
#include "ir/parser.h"
#include "ir/verifier.h"
#include "passes/plan_pipeline.h"
#include "tests/support/read_file.h"

namespace modelpar::passes {
namespace {

PipelinePlan gpipeStep(const std::string& checkpoint) {
  PipelinePlanOptions o;
  o.devices = 4;
  o.microbatches = 4;
  o.batch_size = 8;
  o.schedule = "gpipe";
  o.checkpoint = checkpoint;
  return planPipeline(ir::parseGraph(testing::readExample("skip_step_symbolic.txt")), o);
}

std::set<std::string> names(const std::vector<std::string>& v) { return {v.begin(), v.end()}; }

std::vector<std::string> outputNames(const ir::Graph& g) {
  std::vector<std::string> out;
  for (ir::ValueId v : g.outputs()) out.push_back(g.value(v).name);
  return out;
}

TEST(SplitPhases, FirstPartRunsForwardWorkOnlyAndCarriesWhatTheSecondReads) {
  for (const char* ck : {"never", "always"}) {
    PipelinePlan plan = gpipeStep(ck);
    PhaseSplit s = splitPhases(plan.graph, plan.placement);
    ir::verify(s.first);
    ir::verify(s.second);
    const ir::Graph& a = s.first.graph();
    const ir::Graph& b = s.second.graph();
    for (const ir::Node& n : a.nodes()) {
      EXPECT_TRUE(!n.phase || *n.phase == ir::Phase::Forward) << ck << ": " << n.op;
    }
    // Nodes are split, none lost or repeated.
    EXPECT_EQ(a.numNodes() + b.numNodes(), plan.graph.numNodes()) << ck;
    ASSERT_FALSE(s.carried.empty());
    std::set<std::string> first_out = names(outputNames(a));
    std::set<std::string> second_in;
    for (const ir::Input& in : b.inputs()) second_in.insert(b.value(in.value).name);
    for (const std::string& c : s.carried) {
      EXPECT_TRUE(first_out.count(c)) << c;
      EXPECT_TRUE(second_in.count(c)) << c;
      // Bound on the device of the node that made it in the step.
      ir::ValueId v = *plan.graph.findValue(c);
      int made_on = plan.placement.node_device[static_cast<size_t>(plan.graph.value(v).producer)];
      const ir::Input& in = b.inputs()[*b.inputIndex(*b.findValue(c))];
      EXPECT_EQ(in.device.value_or(-1), made_on) << c;
      // Nothing carried is a gradient: GPipe's forward part makes none.
      EXPECT_EQ(c.find("grad"), std::string::npos) << c;
    }
    // Every output of the step comes from one part: the loss and the
    // predictions from the first, the new weights from the second.
    std::vector<std::string> step_out = outputNames(plan.graph);
    std::set<std::string> second_out = names(outputNames(b));
    for (const std::string& o : step_out) {
      EXPECT_NE(first_out.count(o) > 0, second_out.count(o) > 0) << o;
    }
    EXPECT_TRUE(first_out.count(step_out[0])) << "the loss is known after the forward";
    EXPECT_TRUE(second_out.count(step_out.back())) << "an updated weight needs the backward";
  }
}

// A weight the placement leaves unbound (-1) and reads on two devices, its
// first reader in the backward on another device than in the forward (GPT's
// tied embedding and head over two stages): both parts bind it where lowering
// the whole step does, on its first reader in graph order. Each part lowered
// apart had bound it on its own first reader (device 1, then device 0), and
// over ranks the backward then read a copy the forward's rank did not own.
TEST(SplitPhases, AnUnboundInputIsBoundWhereTheWholeStepBindsItInBothParts) {
  ir::Graph g = ir::parseGraph(R"(
graph @tied(%x: f32[4, 4] input, %w: f32[4, 4] param) {
  %h: f32[4, 4] = aten::mm(%x, %w) {layer="s0", phase=fwd}
  %y: f32[4, 4] = aten::mm(%h, %w) {layer="s1", phase=fwd}
  %gy: f32[4, 4] = aten::mm(%y, %w) {layer="s1", phase=bwd}
  %gh: f32[4, 4] = aten::mm(%gy, %w) {layer="s0", phase=bwd}
  return %y, %gh
}
)");
  Placement p;
  p.placer = "test";
  p.num_devices = 2;
  p.node_device = {1, 0, 0, 1};  // the forward's first reader on 1, the backward's on 0
  p.order = {{1, 2}, {0, 3}};
  p.input_device = {-1, -1};
  PhaseSplit s = splitPhases(g, p);
  for (const ir::Program* part : {&s.first, &s.second}) {
    const ir::Graph& pg = part->graph();
    const ir::Input& w = pg.inputs()[*pg.inputIndex(*pg.findValue("w"))];
    EXPECT_EQ(w.device.value_or(-1), 1) << pg.name();
  }
  ir::Program whole = lower(g, p);
  EXPECT_EQ(whole.graph().inputs()[1].device.value_or(-1), 1);
}

TEST(SplitPhases, RefusesAPlacementOfAnotherGraph) {
  PipelinePlan plan = gpipeStep("never");
  Placement wrong = plan.placement;
  wrong.node_device.pop_back();
  EXPECT_THROW(splitPhases(plan.graph, wrong), ConfigError);
}

}  // namespace
}  // namespace modelpar::passes
