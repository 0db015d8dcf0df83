// Forward and backward placed as one (passes/plan_joint.h): the join's inputs,
// nodes, renames and outputs; the split's devices (a layer's backward on its
// forward's device, saved values bound where they were produced, gradients on
// their parameter's device); bad links; and planPlacement() from a fixed placement
// (PlacementOptions::placement), including its memory check.
#include "passes/plan_joint.h"

#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "ir/error.h"
#include "ir/parser.h"
#include "ir/verifier.h"
#include "tests/passes/test_graphs.h"
#include "tests/support/expect_error.h"

namespace modelpar::passes {
namespace {

using testing::machine;
using modelpar::testing::messageOf;

// Two parallel layers of 100 us each; the forward returns %y and saves %a
// and %b for the backward. Every value is f32[256] = 1 KiB.
constexpr const char* kForward = R"(
graph @fw(%x: f32[256] input, %w1: f32[256] param, %w2: f32[256] param) {
  %a: f32[256] = aten::mul.Tensor(%x, %w1) {layer="l1", phase=fwd, cost={time_us=100.0, out=1024, temp=0, persist=0}}
  %b: f32[256] = aten::mul.Tensor(%x, %w2) {layer="l2", phase=fwd, cost={time_us=100.0, out=1024, temp=0, persist=0}}
  %y: f32[256] = aten::add.Tensor(%a, %b) {layer="out", phase=fwd, cost={time_us=1.0, out=1024, temp=0, persist=0}}
  return %y, %a, %b
}
)";

// %y is taken by the forward: the join renames it bw.y.
constexpr const char* kBackward = R"(
graph @bw(%a: f32[256] input, %b: f32[256] input, %tangents_1: f32[256] input) {
  %y: f32[256] = aten::neg(%tangents_1) {layer="out", phase=bwd, cost={time_us=1.0, out=1024, temp=0, persist=0}}
  %ga: f32[256] = aten::mul.Tensor(%y, %a) {layer="l1", phase=bwd, cost={time_us=100.0, out=1024, temp=0, persist=0}}
  %gb: f32[256] = aten::mul.Tensor(%y, %b) {layer="l2", phase=bwd, cost={time_us=100.0, out=1024, temp=0, persist=0}}
  return %ga, %gb
}
)";

const std::vector<SavedLink> kSaved = {{"a", "a"}, {"b", "b"}};
const std::vector<SavedLink> kTangents = {{"tangents_1", "y"}};

PlacementOptions twoDevices() {
  PlacementOptions o;
  o.machine = machine(2);
  o.dump_dir = "";
  return o;
}

int nodeDevice(const PlacementPlan& p, const std::string& name) {
  const ir::Graph& g = p.program.graph();
  return *g.node(g.value(*g.findValue(name)).producer).device;
}

int inputDevice(const PlacementPlan& p, const std::string& name) {
  const ir::Graph& g = p.program.graph();
  return *g.inputs()[*g.inputIndex(*g.findValue(name))].device;
}

TEST(PlanJoint, JoinsSavedValuesToTheirProducersAndRenamesClashes) {
  ir::Graph fw = ir::parseGraph(kForward), bw = ir::parseGraph(kBackward);
  JointGraph j = joinForwardBackward(fw, bw, kSaved, kTangents);
  const ir::Graph& g = j.graph;
  EXPECT_NO_THROW(ir::verify(g));
  EXPECT_EQ(g.name(), "fw_joint");
  std::vector<std::string> inputs;
  for (const ir::Input& in : g.inputs()) inputs.push_back(g.value(in.value).name);
  EXPECT_EQ(inputs, (std::vector<std::string>{"x", "w1", "w2"}));
  ASSERT_EQ(g.numNodes(), 7u);
  EXPECT_EQ(j.forward_node, (std::vector<ir::NodeId>{0, 1, 2}));
  EXPECT_EQ(j.backward_node, (std::vector<ir::NodeId>{4, 5, 6}));
  // The tangent is made from the output it is the gradient of.
  EXPECT_EQ(g.node(3).qualifiedName(), "aten::ones_like");
  EXPECT_EQ(g.nodeRef(3), "%tangents_1");
  EXPECT_EQ(g.node(3).inputs(), (std::vector<ir::ValueId>{g.node(2).outputs[0]}));
  EXPECT_EQ(g.nodeRef(4), "%bw.y");
  EXPECT_EQ(g.node(4).inputs(), (std::vector<ir::ValueId>{g.node(3).outputs[0]}));
  // %ga reads the renamed %bw.y and the forward's own %a: no copy of %a.
  const ir::Node& ga = g.node(5);
  EXPECT_EQ(ga.inputs(), (std::vector<ir::ValueId>{g.node(4).outputs[0], g.node(0).outputs[0]}));
  EXPECT_EQ(ga.layer, "l1");
  EXPECT_EQ(ga.phase, ir::Phase::Backward);
  ASSERT_TRUE(ga.cost);
  EXPECT_DOUBLE_EQ(ga.cost->time_us, 100.0);
  // The user's %y and the two gradients; the saved %a, %b are not outputs.
  std::vector<std::string> outputs;
  for (ir::ValueId v : g.outputs()) outputs.push_back(g.value(v).name);
  EXPECT_EQ(outputs, (std::vector<std::string>{"y", "ga", "gb"}));
  EXPECT_EQ(fw, ir::parseGraph(kForward));  // inputs untouched
}

TEST(PlanJoint, BadLinksAreNamed) {
  ir::Graph fw = ir::parseGraph(kForward), bw = ir::parseGraph(kBackward);
  EXPECT_HAS(messageOf<InvalidIrError>([&] { joinForwardBackward(fw, bw, {{"a", "nope"}}); }),
             "%a is linked to %nope, which the forward graph @fw does not define");
  EXPECT_HAS(messageOf<InvalidIrError>([&] { joinForwardBackward(fw, bw, {{"ga", "a"}}); }),
             "%ga is not an input of the backward graph @bw");
  EXPECT_HAS(messageOf<InvalidIrError>([&] {
               joinForwardBackward(fw, bw, {{"a", "a"}, {"a", "b"}});
             }),
             "linked to two forward values");
  ir::Graph other = ir::parseGraph(R"(
graph @bw(%a: f32[128] input) {
  %g: f32[128] = aten::neg(%a)
  return %g
}
)");
  EXPECT_HAS(messageOf<InvalidIrError>([&] { joinForwardBackward(fw, other, {{"a", "a"}}); }),
             "backward input %a: f32[128] is linked to forward value %a: f32[256]");
  JointPlanOptions jo{kSaved, kTangents, {{2, 0}}};
  EXPECT_HAS(messageOf<InvalidIrError>([&] { planJoint(fw, bw, jo, twoDevices()); }),
             "gradient (backward output 2, forward input 0) is out of range");
}

TEST(PlanJoint, LayersBackwardRunsOnItsForwardsDeviceAndSavedValuesStayPut) {
  ir::Graph fw = ir::parseGraph(kForward), bw = ir::parseGraph(kBackward);
  JointPlanOptions jo{kSaved, kTangents, {{0, 1}, {1, 2}}};  // d w1, d w2
  for (const char* placer : {"m-etf", "m-topo", "m-sct"}) {
    PlacementOptions o = twoDevices();
    o.placer = placer;
    JointPlan jp = planJoint(fw, bw, jo, o);
    SCOPED_TRACE(placer);
    EXPECT_NO_THROW(ir::verify(jp.forward.program));
    EXPECT_NO_THROW(ir::verify(jp.backward.program));
    EXPECT_EQ(jp.forward.program.graph().name(), "fw");
    EXPECT_EQ(jp.backward.program.graph().name(), "bw");
    // Each layer's backward node on its forward node's device.
    EXPECT_EQ(nodeDevice(jp.backward, "ga"), nodeDevice(jp.forward, "a"));
    EXPECT_EQ(nodeDevice(jp.backward, "gb"), nodeDevice(jp.forward, "b"));
    // The backward's saved inputs are bound where the forward made them.
    EXPECT_EQ(inputDevice(jp.backward, "a"), nodeDevice(jp.forward, "a"));
    EXPECT_EQ(inputDevice(jp.backward, "b"), nodeDevice(jp.forward, "b"));
    // Gradients on their parameter's device.
    EXPECT_EQ(nodeDevice(jp.backward, "ga"), inputDevice(jp.forward, "w1"));
    EXPECT_EQ(nodeDevice(jp.backward, "gb"), inputDevice(jp.forward, "w2"));
    // The halves run the joint placement.
    const ir::Graph& jg = jp.joint.program.graph();
    for (const char* name : {"a", "b", "y"}) {
      EXPECT_EQ(nodeDevice(jp.forward, name), nodeDevice(jp.joint, name)) << name;
    }
    EXPECT_EQ(nodeDevice(jp.backward, "ga"), nodeDevice(jp.joint, "ga"));
    EXPECT_TRUE(jg.findValue("bw.y"));
    EXPECT_EQ(jp.forward.stats[1].pass, kFixedPlacementPassId);
    // The joint step covers both halves: at least the forward's critical
    // path (100 + 1) plus the backward's (1 + 100).
    EXPECT_GE(jp.joint.stepTimeUs(), 202.0);
  }
  // m-ETF runs the parallel layers on different devices (3 us per KiB sent):
  //   device 0: a 0..100; send a 100..103; recv bw.y; ga 108..208
  //   device 1: recv x 0..3; b 3..103; y 103..104; tangent (free) 104;
  //             bw.y 104..105, sent 105..108; gb 105..205
  // The backward cannot start before y exists: step 208 us.
  JointPlan jp = planJoint(fw, bw, jo, twoDevices());
  EXPECT_NE(nodeDevice(jp.forward, "a"), nodeDevice(jp.forward, "b"));
  EXPECT_DOUBLE_EQ(jp.joint.stepTimeUs(), 208.0);
  EXPECT_EQ(jp.moved_to_layer_device + jp.moved_to_parameter_device, 0);
}

TEST(PlanJoint, GradientProducersMoveToTheirParametersDeviceAndTheJointIsReplanned) {
  ir::Graph fw = ir::parseGraph(kForward), bw = ir::parseGraph(kBackward);
  // Declare %ga the gradient of w2 (input 2): it must follow w2 away from l1.
  JointPlanOptions jo{kSaved, kTangents, {{0, 2}}};
  JointPlan jp = planJoint(fw, bw, jo, twoDevices());
  ASSERT_NE(nodeDevice(jp.forward, "a"), nodeDevice(jp.forward, "b"));
  EXPECT_EQ(jp.moved_to_parameter_device, 1);
  EXPECT_EQ(nodeDevice(jp.backward, "ga"), inputDevice(jp.forward, "w2"));
  EXPECT_EQ(nodeDevice(jp.joint, "ga"), inputDevice(jp.forward, "w2"));
  EXPECT_EQ(jp.joint.stats[1].pass, kFixedPlacementPassId);  // replanned from the fixed placement
  // %a still stays on its producer's device; the backward receives it.
  EXPECT_EQ(inputDevice(jp.backward, "a"), nodeDevice(jp.forward, "a"));
  EXPECT_NO_THROW(ir::verify(jp.backward.program));
}

// A training step compiled again over ranks keeps each parameter where the
// first one bound it (PlacementOptions::pinned_inputs): w1 pinned away from
// its reader l1 is bound there, and its gradient made there.
TEST(PlanJoint, PinnedParametersKeepTheirDeviceAndTheirGradientsFollow) {
  ir::Graph fw = ir::parseGraph(kForward), bw = ir::parseGraph(kBackward);
  JointPlanOptions jo{kSaved, kTangents, {{0, 1}, {1, 2}}};  // d w1, d w2
  JointPlan free = planJoint(fw, bw, jo, twoDevices());
  const int l1 = nodeDevice(free.forward, "a");
  ASSERT_EQ(inputDevice(free.forward, "w1"), l1);
  PlacementOptions o = twoDevices();
  o.pinned_layers = {{"l1", l1}, {"l2", 1 - l1}};
  o.pinned_inputs = {{"w1", 1 - l1}};
  JointPlan jp = planJoint(fw, bw, jo, o);
  EXPECT_EQ(inputDevice(jp.forward, "w1"), 1 - l1);
  EXPECT_EQ(nodeDevice(jp.forward, "a"), l1);          // l1 still runs where it was pinned
  EXPECT_EQ(nodeDevice(jp.backward, "ga"), 1 - l1);    // w1's gradient at w1's device
  EXPECT_EQ(jp.moved_to_parameter_device, 1);
  EXPECT_NO_THROW(ir::verify(jp.forward.program));
  EXPECT_NO_THROW(ir::verify(jp.backward.program));
}

TEST(PlanJoint, PlanFromAFixedPlacementLowersItAndChecksMemory) {
  ir::Graph fw = ir::parseGraph(kForward);
  Placement p;
  p.num_devices = 2;
  p.node_device = {1, 0, 1};
  p.order = {{1}, {0, 2}};
  p.input_device = {1, 1, 0};
  PlacementOptions o = twoDevices();
  o.placement = p;
  PlacementPlan plan1 = planPlacement(fw, o);
  EXPECT_EQ(plan1.placement.node_device, p.node_device);
  EXPECT_EQ(inputDevice(plan1, "w2"), 0);
  ASSERT_EQ(plan1.stats.size(), 4u);  // cost, fixed-placement, lower, simulate
  EXPECT_EQ(plan1.stats[1].pass, "fixed-placement");
  // a on 1 and b on 0 both need %x (on 1): x -> 0 (3 us) then b (100 us),
  // b -> 1 (3 us), y (1 us): 107 us.
  EXPECT_DOUBLE_EQ(plan1.stepTimeUs(), 107.0);

  Placement bad = p;
  bad.order = {{1}, {2, 0}};  // y before a
  o.placement = bad;
  EXPECT_THROW(planPlacement(fw, o), ConfigError);
  o.placement = p;
  o.memory_bytes = {2048};
  std::string msg = messageOf<PlanDoesNotFitError>([&] { planPlacement(fw, o); });
  EXPECT_HAS(msg, "does not fit with the fixed placement: device 1 needs");
  EXPECT_HAS(msg, "device 1 needs 3.0 KiB (3072 bytes) at its simulated peak but has 2.0 KiB "
                 "(2048 bytes)");
}

}  // namespace
}  // namespace modelpar::passes

namespace modelpar::passes {
namespace {

// Note [In-place writes to graph inputs]: the copy_ that updates %rm must run
// where %rm lives (its first reader's device, 0), wherever it was placed.
TEST(PlanJoint, InPlaceWritesToGraphInputsRunOnTheInputsDevice) {
  ir::Graph g = ir::parseGraph(R"(
graph @bn(%x: f32[256] input, %rm: f32[256] buffer) {
  %a: f32[256] = aten::add.Tensor(%x, %rm) {cost={time_us=10.0, out=1024, temp=0, persist=0}}
  %b: f32[256] = aten::relu(%a) {cost={time_us=10.0, out=1024, temp=0, persist=0}}
  %c: f32[256] = aten::copy_(%rm, %b) {cost={time_us=1.0, out=1024, temp=0, persist=0}}
  return %b
}
)");
  Placement p;
  p.num_devices = 2;
  p.node_device = {0, 1, 1};
  p.order = {{0}, {1, 2}};
  PlacementOptions o = twoDevices();
  o.placement = p;
  PlacementPlan out = planPlacement(g, o);
  EXPECT_EQ(out.placement.node_device, (std::vector<int32_t>{0, 1, 0}));
  EXPECT_EQ(inputDevice(out, "rm"), 0);
  EXPECT_HAS(out.stats[1].detail, "1 in-place write to inputs moved to the inputs' devices");
  // Without a fixed placement too (one device for every layerless node here,
  // or any split): the write is on %rm's device.
  PlacementPlan placed = planPlacement(g, twoDevices());
  EXPECT_EQ(nodeDevice(placed, "c"), inputDevice(placed, "rm"));
}

}  // namespace
}  // namespace modelpar::passes
