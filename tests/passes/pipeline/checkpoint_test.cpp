// Pass `checkpoint`: recompute groups per mode, stage inputs and random masks
// stay stored, copies sit before their backward readers, errors, and the
// simulated peak memory of a 2-stage pipeline with and without it.
// Numerical identity: tests/python/test_microbatch.py.
#include "passes/pipeline/checkpoint.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <fstream>
#include <sstream>

#include "ir/error.h"
#include "ir/parser.h"
#include "ir/printer.h"
#include "ir/verifier.h"
#include "passes/lower/lower.h"
#include "passes/lower/simulate.h"
#include "passes/pipeline/microbatch.h"
#include "tests/passes/test_graphs.h"
#include "tests/support/expect_error.h"
#include "tests/support/read_file.h"

namespace modelpar::passes {
namespace {

using modelpar::testing::messageOf;

ir::Graph splitMlp(int m) {
  const std::string text = modelpar::testing::readExample("mlp_step_symbolic.txt");
  MicrobatchOptions o;
  o.microbatches = m;
  o.batch_size = 8;
  return microbatch(ir::parseGraph(text), o);
}

/// Stage per node from its layer: fc1 on stage 0, everything else on 1.
std::vector<int32_t> stagesByLayer(const ir::Graph& g, const std::string& stage0_layer) {
  std::vector<int32_t> s;
  for (const ir::Node& n : g.nodes()) s.push_back(n.layer == stage0_layer ? 0 : 1);
  return s;
}

CheckpointResult run(const ir::Graph& g, const std::vector<int32_t>& stages, CheckpointMode mode) {
  CheckpointOptions o;
  o.mode = mode;
  CheckpointResult r = checkpoint(g, stages, o);
  ir::verify(r.graph);
  EXPECT_EQ(r.stage_of_node.size(), r.graph.numNodes());
  return r;
}

std::vector<std::string> names(const ir::Graph& g, const RecomputeGroup& grp) {
  std::vector<std::string> out;
  for (ir::NodeId n : grp.nodes) out.push_back(g.nodeRef(n));
  return out;
}

std::string nodeText(const ir::Graph& g, const std::string& name) {
  std::optional<ir::ValueId> v = g.findValue(name);
  return v ? ir::printNode(g, g.value(*v).producer) : "<no %" + name + ">";
}

TEST(Checkpoint, NeverLeavesTheGraphUnchanged) {
  ir::Graph g = splitMlp(2);
  CheckpointResult r = run(g, stagesByLayer(g, "fc1"), CheckpointMode::Never);
  EXPECT_EQ(r.graph, g);
  EXPECT_TRUE(r.groups.empty());
  EXPECT_EQ(r.stage_of_node, stagesByLayer(g, "fc1"));
}

TEST(Checkpoint, AlwaysRecomputesWhatEachStagesBackwardReads) {
  // Stage 0 = fc1 (x slice, h, a); stage 1 = fc2 + loss (y slice, p, loss).
  // Stage 0's backward reads a (threshold_backward) and x (t(x)); stage 1's
  // reads p, y, loss (the seed, mse_loss_backward), and a, which is its
  // stage input: stored, not recomputed by stage 1.
  ir::Graph g = splitMlp(2);
  CheckpointResult r = run(g, stagesByLayer(g, "fc1"), CheckpointMode::Always);
  ASSERT_EQ(r.groups.size(), 4u);
  const ir::Graph& out = r.graph;
  // In graph order: stage 1 mb 0 (before its seed), stage 0 mb 0, then mb 1.
  EXPECT_EQ(r.groups[0].stage, 1);
  EXPECT_EQ(r.groups[0].microbatch, 0);
  EXPECT_EQ(names(out, r.groups[0]), (std::vector<std::string>{"%p.mb0.rc", "%y.mb0.rc", "%loss.mb0.rc"}));
  EXPECT_EQ(r.groups[1].stage, 0);
  EXPECT_EQ(names(out, r.groups[1]), (std::vector<std::string>{"%x.mb0.rc", "%h.mb0.rc", "%a.mb0.rc"}));
  EXPECT_EQ(r.groups[2].microbatch, 1);
  EXPECT_EQ(r.groups[3].microbatch, 1);
  EXPECT_EQ(out.numNodes(), g.numNodes() + 12);
  EXPECT_EQ(nodeText(out, "h.mb0.rc"),
            R"(%h.mb0.rc: f32[4, 32] = aten::mm(%x.mb0.rc, %w1) {layer="fc1", phase=recompute, mb=0})");
  // Stage 1 recomputes p from its stored stage input a, not from a's copy.
  EXPECT_EQ(nodeText(out, "p.mb0.rc"),
            R"(%p.mb0.rc: f32[4, 4] = aten::mm(%a.mb0, %w2) {layer="fc2", phase=recompute, mb=0})");
  EXPECT_EQ(nodeText(out, "at.mb0"), R"(%at.mb0: f32[32, 4] = aten::t(%a.mb0) {layer="fc2", phase=bwd, mb=0})");
  // Stage 0's backward reads the copies.
  EXPECT_EQ(nodeText(out, "dh.mb0"),
            R"(%dh.mb0: f32[4, 32] = aten::threshold_backward(%da.mb0, %a.mb0.rc, 0) {layer="fc1", phase=bwd, mb=0})");
  EXPECT_EQ(nodeText(out, "g.mb0"), R"(%g.mb0: f32[] = aten::ones_like(%loss.mb0.rc) {layer="loss", phase=bwd, mb=0})");
  // The forward and the loss combination keep reading the originals.
  EXPECT_EQ(nodeText(out, "loss.acc0"),
            R"(%loss.acc0: f32[] = aten::mul.Scalar(%loss.mb0, 0.5) {layer="loss", phase=fwd, mb=0})");
  // Each group sits right before its first backward reader.
  ir::NodeId first = r.groups[1].nodes.back();
  EXPECT_EQ(out.nodeRef(first + 1), "%dh.mb0");
  for (size_t i = 0; i < r.groups.size(); ++i) {
    for (ir::NodeId n : r.groups[i].nodes) EXPECT_EQ(r.stage_of_node[static_cast<size_t>(n)], r.groups[i].stage);
  }
}

// Per layer (CheckpointOptions::layers, Note [Recompute per layer]): only
// fc2 is recomputed; the loss's values and fc1's stay stored, and fc2's copy
// reads them.
TEST(Checkpoint, OnlyTheChosenLayersAreRecomputed) {
  ir::Graph g = splitMlp(2);
  CheckpointOptions o;
  o.mode = CheckpointMode::Always;
  o.layers.emplace(std::initializer_list<std::string>{"fc2"});
  std::vector<int32_t> one_stage(g.numNodes(), 0);
  CheckpointResult r = checkpoint(g, one_stage, o);
  ir::verify(r.graph);
  ASSERT_EQ(r.groups.size(), 2u);  // micro-batches 0 and 1
  for (const RecomputeGroup& grp : r.groups) {
    for (ir::NodeId n : grp.nodes) EXPECT_EQ(r.graph.node(n).layer, "fc2") << r.graph.nodeRef(n);
  }
  EXPECT_EQ(nodeText(r.graph, "p.mb0.rc"),
            R"(%p.mb0.rc: f32[4, 4] = aten::mm(%a.mb0, %w2) {layer="fc2", phase=recompute, mb=0})");
  EXPECT_FALSE(r.graph.findValue("a.mb0.rc").has_value());     // fc1: stored
  EXPECT_FALSE(r.graph.findValue("loss.mb0.rc").has_value());  // the loss: stored
  EXPECT_EQ(nodeText(r.graph, "g.mb0"), R"(%g.mb0: f32[] = aten::ones_like(%loss.mb0) {layer="loss", phase=bwd, mb=0})");
  // Every layer named is what no filter does; no layer named, nothing.
  o.layers.emplace(std::initializer_list<std::string>{"fc1", "fc2", "loss"});
  CheckpointOptions all;
  all.mode = CheckpointMode::Always;
  EXPECT_EQ(ir::print(checkpoint(g, one_stage, o).graph), ir::print(checkpoint(g, one_stage, all).graph));
  o.layers.emplace();
  EXPECT_EQ(ir::print(checkpoint(g, one_stage, o).graph), ir::print(g));
}

TEST(Checkpoint, ExceptLastSkipsTheLastMicrobatch) {
  ir::Graph g = splitMlp(3);
  CheckpointResult r = run(g, stagesByLayer(g, "fc1"), CheckpointMode::ExceptLast);
  ASSERT_EQ(r.groups.size(), 4u);  // (stage 0, 1) x (mb 0, 1)
  for (const RecomputeGroup& grp : r.groups) EXPECT_LT(grp.microbatch, 2);
  EXPECT_FALSE(r.graph.findValue("a.mb2.rc").has_value());
  EXPECT_HAS(nodeText(r.graph, "dh.mb2"), "threshold_backward(%da.mb2, %a.mb2, 0)");
  EXPECT_HAS(nodeText(r.graph, "dh.mb1"), "threshold_backward(%da.mb1, %a.mb1.rc, 0)");
}

TEST(Checkpoint, KeepsDropoutMasksAndInPlaceResultsStored) {
  // %o, %mask come from dropout: stored; %e reads %o and is recomputed; the
  // in-place %q mutates %e2's storage, so neither is recomputed.
  const char* text = R"(
graph @drop(%x: f32[4] input) {
  %a: f32[4] = aten::tanh(%x) {phase=fwd, mb=0}
  %o: f32[4], %mask: bool[4] = aten::native_dropout(%a, 0.5, true) {phase=fwd, mb=0}
  %e: f32[4] = aten::exp(%o) {phase=fwd, mb=0}
  %e2: f32[4] = aten::mul.Tensor(%e, %e) {phase=fwd, mb=0}
  %q: f32[4] = aten::relu_(%e2) {phase=fwd, mb=0}
  %de: f32[4] = aten::mul.Tensor(%q, %e) {phase=bwd, mb=0}
  %da: f32[4] = aten::native_dropout_backward(%de, %mask, 2.0) {phase=bwd, mb=0}
  %dx: f32[4] = aten::tanh_backward(%da, %a) {phase=bwd, mb=0}
  return %dx
})";
  ir::Graph g = ir::parseGraph(text);
  CheckpointResult r = run(g, std::vector<int32_t>(g.numNodes(), 0), CheckpointMode::Always);
  ASSERT_EQ(r.groups.size(), 1u);
  EXPECT_EQ(names(r.graph, r.groups[0]), (std::vector<std::string>{"%a.rc", "%e.rc"}));
  EXPECT_EQ(nodeText(r.graph, "e.rc"), "%e.rc: f32[4] = aten::exp(%o) {phase=recompute, mb=0}");
  EXPECT_HAS(nodeText(r.graph, "da"), "native_dropout_backward(%de, %mask, 2.0)");
  EXPECT_HAS(nodeText(r.graph, "de"), "aten::mul.Tensor(%q, %e.rc)");
}

// F.gumbel_softmax under checkpoint="except_last": AOTAutograd emits the
// functional aten::uniform (no trailing underscore), and an op the name list
// does not know is random by its `random` mark (the schema's
// nondeterministic_seeded tag). Both stay stored: a recompute would redraw
// them, and the backward would differentiate other samples than the forward
// used. %e reads them and is recomputed from the stored samples.
TEST(Checkpoint, KeepsFunctionalSamplersAndNodesMarkedRandomStored) {
  const char* text = R"(
graph @gumbel(%x: f32[4] input) {
  %a: f32[4] = aten::tanh(%x) {phase=fwd, mb=0}
  %u: f32[4] = aten::uniform(%a, 0.0, 1.0) {phase=fwd, mb=0}
  %s: f32[4] = mylib::sample(%a) {phase=fwd, mb=0, random=true}
  %e: f32[4] = aten::add.Tensor(%u, %s) {phase=fwd, mb=0}
  %f: f32[4] = aten::exp(%e) {phase=fwd, mb=0}
  %df: f32[4] = aten::mul.Tensor(%f, %f) {phase=bwd, mb=0}
  %dx: f32[4] = aten::tanh_backward(%df, %a) {phase=bwd, mb=0}
  return %dx
})";
  ir::Graph g = ir::parseGraph(text);
  CheckpointResult r = run(g, std::vector<int32_t>(g.numNodes(), 0), CheckpointMode::Always);
  ASSERT_EQ(r.groups.size(), 1u);
  EXPECT_EQ(names(r.graph, r.groups[0]), (std::vector<std::string>{"%a.rc", "%e.rc", "%f.rc"}));
  EXPECT_FALSE(r.graph.findValue("u.rc").has_value());
  EXPECT_FALSE(r.graph.findValue("s.rc").has_value());
  EXPECT_EQ(nodeText(r.graph, "e.rc"), "%e.rc: f32[4] = aten::add.Tensor(%u, %s) {phase=recompute, mb=0}");
  EXPECT_EQ(nodeText(r.graph, "s"), "%s: f32[4] = mylib::sample(%a) {phase=fwd, mb=0, random=true}");
}

TEST(Checkpoint, RejectsAForwardNodeAfterItsMicrobatchsBackward) {
  const char* text = R"(
graph @late(%x: f32[4] input) {
  %a: f32[4] = aten::tanh(%x) {phase=fwd, mb=0}
  %da: f32[4] = aten::tanh_backward(%x, %a) {phase=bwd, mb=0}
  %b: f32[4] = aten::exp(%a) {phase=fwd, mb=0}
  %db: f32[4] = aten::mul.Tensor(%da, %b) {phase=bwd, mb=0}
  return %db
})";
  ir::Graph g = ir::parseGraph(text);
  std::string msg = messageOf<InvalidIrError>([&] {
    CheckpointOptions o;
    o.mode = CheckpointMode::Always;
    checkpoint(g, std::vector<int32_t>(g.numNodes(), 0), o);
  });
  EXPECT_HAS(msg, "forward node %b (stage 0, micro-batch 0) comes after the backward node %da");
}

TEST(Checkpoint, RejectsBadStagesAndModes) {
  ir::Graph g = splitMlp(2);
  EXPECT_HAS(messageOf<ConfigError>([&] { checkpoint(g, {0, 1}); }),
             "has 37 nodes but 2 stages were given");
  std::vector<int32_t> s(g.numNodes(), 0);
  s[3] = -1;
  EXPECT_HAS(messageOf<ConfigError>([&] { checkpoint(g, s); }), "has stage -1");
  CheckpointOptions always;
  always.mode = CheckpointMode::Always;
  CheckpointResult once = checkpoint(g, stagesByLayer(g, "fc1"), always);
  EXPECT_HAS(messageOf<ConfigError>([&] { checkpoint(once.graph, once.stage_of_node); }),
             "is already a recompute node");
  // A model that recomputes on its own (torch.utils.checkpoint) goes through
  // `never` unchanged.
  CheckpointOptions never;
  never.mode = CheckpointMode::Never;
  CheckpointResult kept = checkpoint(once.graph, once.stage_of_node, never);
  EXPECT_EQ(kept.graph.numNodes(), once.graph.numNodes());
  EXPECT_HAS(messageOf<ConfigError>([] { parseCheckpointMode("sometimes"); }),
             "checkpoint='sometimes' is not valid; checkpoint takes one of 'always', 'except_last', "
             "'never'");
  EXPECT_EQ(parseCheckpointMode("except_last"), CheckpointMode::ExceptLast);
  EXPECT_EQ(name(CheckpointMode::Always), "always");
}

// ---- simulated memory -------------------------------------------------------------

// Two micro-batches through a 2-stage chain; every value is f32[256] = S =
// 1 KiB:
//   stage 0:  a_k = relu(x_k), b_k = sigmoid(a_k)           --b_k-->
//   stage 1:  c_k = tanh(b_k); backward gc_k = ones_like(c_k), db_k = tanh_backward(gc_k, c_k)
//   stage 0:  <--db_k--  da_k = sigmoid_backward(db_k, b_k), dx_k = threshold_backward(da_k, a_k)
//   s = dx_0 + dx_1 (stage 0)
constexpr const char* kChain = R"(
graph @chain(%x0: f32[256] input, %x1: f32[256] input) {
  %a0: f32[256] = aten::relu(%x0) {layer="s0", phase=fwd, mb=0, cost={time_us=1.0, out=1024, temp=0, persist=0}}
  %b0: f32[256] = aten::sigmoid(%a0) {layer="s0", phase=fwd, mb=0, cost={time_us=1.0, out=1024, temp=0, persist=0}}
  %c0: f32[256] = aten::tanh(%b0) {layer="s1", phase=fwd, mb=0, cost={time_us=1.0, out=1024, temp=0, persist=0}}
  %a1: f32[256] = aten::relu(%x1) {layer="s0", phase=fwd, mb=1, cost={time_us=1.0, out=1024, temp=0, persist=0}}
  %b1: f32[256] = aten::sigmoid(%a1) {layer="s0", phase=fwd, mb=1, cost={time_us=1.0, out=1024, temp=0, persist=0}}
  %c1: f32[256] = aten::tanh(%b1) {layer="s1", phase=fwd, mb=1, cost={time_us=1.0, out=1024, temp=0, persist=0}}
  %gc1: f32[256] = aten::ones_like(%c1) {layer="s1", phase=bwd, mb=1, cost={time_us=1.0, out=1024, temp=0, persist=0}}
  %db1: f32[256] = aten::tanh_backward(%gc1, %c1) {layer="s1", phase=bwd, mb=1, cost={time_us=1.0, out=1024, temp=0, persist=0}}
  %da1: f32[256] = aten::sigmoid_backward(%db1, %b1) {layer="s0", phase=bwd, mb=1, cost={time_us=1.0, out=1024, temp=0, persist=0}}
  %dx1: f32[256] = aten::threshold_backward(%da1, %a1, 0) {layer="s0", phase=bwd, mb=1, cost={time_us=1.0, out=1024, temp=0, persist=0}}
  %gc0: f32[256] = aten::ones_like(%c0) {layer="s1", phase=bwd, mb=0, cost={time_us=1.0, out=1024, temp=0, persist=0}}
  %db0: f32[256] = aten::tanh_backward(%gc0, %c0) {layer="s1", phase=bwd, mb=0, cost={time_us=1.0, out=1024, temp=0, persist=0}}
  %da0: f32[256] = aten::sigmoid_backward(%db0, %b0) {layer="s0", phase=bwd, mb=0, cost={time_us=1.0, out=1024, temp=0, persist=0}}
  %dx0: f32[256] = aten::threshold_backward(%da0, %a0, 0) {layer="s0", phase=bwd, mb=0, cost={time_us=1.0, out=1024, temp=0, persist=0}}
  %s: f32[256] = aten::add.Tensor(%dx0, %dx1) {layer="s0", phase=bwd, cost={time_us=1.0, out=1024, temp=0, persist=0}}
  return %s
}
)";

/// GPipe's per-stage order (seed 002 §2.2, Figure 3): all forwards in
/// micro-batch order, then per micro-batch in reverse its recompute and
/// backward, then the stage's nodes without a micro-batch.
Placement gpipeOrder(const CheckpointResult& r, int stages, int microbatches) {
  const ir::Graph& g = r.graph;
  Placement p;
  p.placer = "test-gpipe";
  p.num_devices = stages;
  p.node_device.assign(r.stage_of_node.begin(), r.stage_of_node.end());
  p.order.resize(static_cast<size_t>(stages));
  p.input_device.assign(g.inputs().size(), -1);
  auto take = [&](auto&& pick) {
    for (size_t n = 0; n < g.numNodes(); ++n) {
      if (pick(g.nodes()[n])) p.order[static_cast<size_t>(r.stage_of_node[n])].push_back(static_cast<ir::NodeId>(n));
    }
  };
  for (int k = 0; k < microbatches; ++k) {
    take([&](const ir::Node& n) { return n.phase == ir::Phase::Forward && n.microbatch == k; });
  }
  for (int k = microbatches - 1; k >= 0; --k) {
    take([&](const ir::Node& n) { return n.phase != ir::Phase::Forward && n.microbatch == k; });
  }
  take([&](const ir::Node& n) { return !n.microbatch.has_value(); });
  return p;
}

std::vector<int64_t> simulatedPeaks(CheckpointMode mode) {
  ir::Graph g = ir::parseGraph(kChain);
  std::vector<int32_t> stages;
  for (const ir::Node& n : g.nodes()) stages.push_back(n.layer == "s0" ? 0 : 1);
  CheckpointOptions o;
  o.mode = mode;
  CheckpointResult r = checkpoint(g, stages, o);
  ir::Program prog = lower(r.graph, gpipeOrder(r, 2, 2));
  ir::verify(prog);
  SimulationReport rep = simulate(prog, testing::machine(2));
  return {rep.devices[0].peak_bytes, rep.devices[1].peak_bytes};
}

TEST(Checkpoint, LowersSimulatedPeakMemoryByTheActivationsItDrops) {
  constexpr int64_t S = 1024;
  // Stage 0 without checkpointing, in its order a0 b0 a1 b1 | da1 dx1 | da0
  // dx0 | s (an input dies after its last reader): at da1 the live values
  // are a0 b0 a1 b1 db1 da1 = 6 S.
  // always: a_k dies after b_k, b_k once sent, but x_k lives on to the
  // recompute. After the forward only x0 x1 remain; mb 1's backward peaks at
  // x0 a1' b1' db1 da1 = 5 S (x1 died after the recompute a1'), mb 0's at
  // dx1 a0' b0' db0 da0 = 5 S.
  // except_last keeps a1, b1 instead of x1 until mb 1's backward, which comes
  // right after its forward: x0 a1 b1 db1 da1 = 5 S too (torchgpipe's reason
  // to skip the last micro-batch: recomputing it saves nothing).
  // Stage 1 peaks at 4 S in every mode (never: c0 c1 gc1 db1; always: b0
  // c1' gc1 db1, b0 stored for the recompute of mb 0).
  std::vector<int64_t> never = simulatedPeaks(CheckpointMode::Never);
  std::vector<int64_t> always = simulatedPeaks(CheckpointMode::Always);
  std::vector<int64_t> except_last = simulatedPeaks(CheckpointMode::ExceptLast);
  EXPECT_EQ(never, (std::vector<int64_t>{6 * S, 4 * S}));
  EXPECT_EQ(always, (std::vector<int64_t>{5 * S, 4 * S}));
  EXPECT_EQ(except_last, (std::vector<int64_t>{5 * S, 4 * S}));
  EXPECT_EQ(never[0] - always[0], S);
}

}  // namespace
}  // namespace modelpar::passes
