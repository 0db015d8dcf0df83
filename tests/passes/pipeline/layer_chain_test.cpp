// chainFromGraph: layer order, times by phase, weights, stored bytes and cut
// bytes with a skip edge; the errors for graphs it cannot read.
#include "passes/pipeline/layer_chain.h"

#include <gtest/gtest.h>

#include "ir/error.h"
#include "ir/parser.h"
#include "tests/support/expect_error.h"

namespace modelpar::passes {
namespace {

using modelpar::testing::messageOf;

#define COST(t) "cost={time_us=" #t ", out=0, temp=0, persist=0}"

//   x ─► l0 ─a─► l1 ─b─► l2 ─c─► l3 ─► d
//             └──────────────────►┘        (skip: %a read by l3)
// bytes: x, a, d: 64; b, c: 128; w0: 32 (l0 and l1 read it: charged to l0);
// w2: 16 (l2). Backward nodes read d (l3), b (l2), a (l1), x (l0).
constexpr const char* kSkip = R"(
graph @skip(%x: f32[16] input, %w0: f32[8] param, %w2: f32[4] param, %rm: f32[4] buffer) {
  %a: f32[16] = aten::mul.Tensor(%x, %w0) {layer="l0", phase=fwd, )" COST(1.0) R"(}
  %b: f32[32] = aten::mul.Tensor(%a, %w0) {layer="l1", phase=fwd, )" COST(2.0) R"(}
  %c: f32[32] = aten::mul.Tensor(%b, %w2) {layer="l2", phase=fwd, )" COST(3.0) R"(}
  %d: f32[16] = aten::add.Tensor(%c, %a) {layer="l3", phase=fwd, )" COST(4.0) R"(}
  %gd: f32[16] = aten::mul.Tensor(%d, %rm) {layer="l3", phase=bwd, )" COST(8.0) R"(}
  %gc: f32[32] = aten::mul.Tensor(%gd, %b) {layer="l2", phase=bwd, )" COST(6.0) R"(}
  %gc2: f32[32] = aten::mul.Tensor(%gc, %w2) {layer="l2", phase=recompute, )" COST(0.5) R"(}
  %gb: f32[16] = aten::mul.Tensor(%gc2, %a) {layer="l1", phase=bwd, )" COST(4.0) R"(}
  %ga: f32[16] = aten::mul.Tensor(%gb, %x) {layer="l0", phase=bwd, )" COST(2.0) R"(}
  ^upd = aten::_foreach_add_([%w0, %w2], [%ga, %gc]) {phase=update, )" COST(100.0) R"(}
  return %d
}
)";

TEST(ChainFromGraph, ReadsTimesWeightsStoredAndCutBytesWithASkipEdge) {
  LayerChain c = chainFromGraph(ir::parseGraph(kSkip));
  ASSERT_EQ(c.size(), 4);
  EXPECT_EQ(c.layers[0].name, "l0");
  EXPECT_EQ(c.layers[3].name, "l3");
  // Times by phase (recompute counts as backward; the update is left out).
  EXPECT_DOUBLE_EQ(c.layers[0].fwd_us, 1.0);
  EXPECT_DOUBLE_EQ(c.layers[0].bwd_us, 2.0);
  EXPECT_DOUBLE_EQ(c.layers[2].bwd_us, 6.5);
  EXPECT_DOUBLE_EQ(c.layers[3].bwd_us, 8.0);
  EXPECT_DOUBLE_EQ(c.totalTime(), 1 + 2 + 3 + 4 + 8 + 6.5 + 4 + 2);
  // w0 once (first reader l0), w2 on l2; the buffer is no weight.
  EXPECT_EQ(c.layers[0].weight_bytes, 32);
  EXPECT_EQ(c.layers[1].weight_bytes, 0);
  EXPECT_EQ(c.layers[2].weight_bytes, 16);
  EXPECT_EQ(c.layers[3].weight_bytes, 0);
  // Stored: forward values the backward reads (backward values do not count).
  EXPECT_EQ(c.layers[0].stored_bytes, 64);   // x
  EXPECT_EQ(c.layers[1].stored_bytes, 64);   // a
  EXPECT_EQ(c.layers[2].stored_bytes, 128);  // b
  EXPECT_EQ(c.layers[3].stored_bytes, 64);   // d
  // Cuts: after l0 {a}; after l1 {a, b}; after l2 {a, c}: the skip edge
  // stays in every cut it jumps.
  EXPECT_EQ(c.layers[0].out_bytes, 64);
  EXPECT_EQ(c.layers[1].out_bytes, 64 + 128);
  EXPECT_EQ(c.layers[2].out_bytes, 64 + 128);
  EXPECT_EQ(c.layers[3].out_bytes, 0);
  EXPECT_DOUBLE_EQ(c.weight_copies, 3.0);
  EXPECT_DOUBLE_EQ(chainFromGraph(ir::parseGraph(kSkip), ChainOptions{2.0}).weight_copies, 2.0);
}

TEST(ChainFromGraph, ForwardOnlyGraphStoresEachLayersInputs) {
  // No phases at all: every node is forward; a layer stores what it reads
  // from outside itself (MadPipe's a_{l-1}); x read by l2 crosses cut 0 and 1.
  LayerChain c = chainFromGraph(ir::parseGraph(R"(
graph @fwd(%x: f32[16] input) {
  %a: f32[8] = aten::relu(%x) {layer="l0", )" COST(1.0) R"(}
  %a2: f32[8] = aten::relu(%a) {layer="l0", )" COST(1.0) R"(}
  %b: f32[4] = aten::relu(%a2) {layer="l1", )" COST(1.0) R"(}
  %c: f32[4] = aten::add.Tensor(%b, %x) {layer="l2", )" COST(1.0) R"(}
  return %c
}
)"));
  ASSERT_EQ(c.size(), 3);
  EXPECT_DOUBLE_EQ(c.layers[0].fwd_us, 2.0);
  EXPECT_EQ(c.layers[0].stored_bytes, 64);       // x (a is internal to l0)
  EXPECT_EQ(c.layers[1].stored_bytes, 32);       // a2
  EXPECT_EQ(c.layers[2].stored_bytes, 16 + 64);  // b, x
  EXPECT_EQ(c.layers[0].out_bytes, 32 + 64);     // a2, x
  EXPECT_EQ(c.layers[1].out_bytes, 16 + 64);     // b, x
}

TEST(ChainFromGraph, RejectsGraphsWithoutLayersCostsOrOrder) {
  auto err = [](const char* text) { return messageOf<ConfigError>([&] { chainFromGraph(ir::parseGraph(text)); }); };
  EXPECT_HAS(err("graph @e(%x: f32[4] input) {\n return %x\n}"), "graph @e has no forward node with a layer");
  EXPECT_HAS(err(R"(graph @n(%x: f32[4] input) {
  %a: f32[4] = aten::relu(%x) {layer="l0"}
  return %a
})"), "node %a (layer 'l0') has no cost; run the cost pass first");
  EXPECT_HAS(err(R"(graph @n(%x: f32[4] input) {
  %a: f32[4] = aten::relu(%x) {)" COST(1.0) R"(}
  return %a
})"), "node %a (aten::relu) in graph @n has no layer");
  EXPECT_HAS(err(R"(graph @n(%x: f32[4] input) {
  %a: f32[4] = aten::relu(%x) {layer="l0", )" COST(1.0) R"(}
  %g: f32[4] = aten::relu(%a) {layer="lost", phase=bwd, )" COST(1.0) R"(}
  return %g
})"), "backward node of layer 'lost', which has no forward node");
  // l0 appears first, then l1, then l0 again reading l1's output.
  EXPECT_HAS(err(R"(graph @n(%x: f32[4] input) {
  %a: f32[4] = aten::relu(%x) {layer="l0", )" COST(1.0) R"(}
  %b: f32[4] = aten::relu(%a) {layer="l1", )" COST(1.0) R"(}
  %c: f32[4] = aten::relu(%b) {layer="l0", )" COST(1.0) R"(}
  return %c
})"), "layer 'l0' (node %c) reads %b made by the later layer 'l1'");
}

TEST(LayerChain, ValidateNamesTheBadLayer) {
  LayerChain c;
  EXPECT_HAS(messageOf<ConfigError>([&] { c.validate(); }), "the layer chain is empty");
  c.layers = {ChainLayer{"ok", 1, 1}, ChainLayer{"bad", -1, 0}};
  EXPECT_HAS(messageOf<ConfigError>([&] { c.validate(); }), "layer 'bad' has times fwd -1 us");
  c.layers[1] = ChainLayer{"neg", 1, 1, -5};
  EXPECT_HAS(messageOf<ConfigError>([&] { c.validate(); }), "layer 'neg' has negative bytes (weights -5");
}


TEST(ChainFromGraph, InheritLayersGivesFunctionalOpsTheLayerTheyRead) {
  // %r (a functional relu) has no layer: it joins l0, whose output it reads;
  // its backward %gr joins l1 (the latest layer among what it reads).
  ir::Graph g = ir::parseGraph(R"(
graph @g(%x: f32[4] input, %w0: f32[4] param, %w1: f32[4] param) {
  %a: f32[4] = aten::mul.Tensor(%x, %w0) {layer="l0", phase=fwd, )" COST(1.0) R"(}
  %r: f32[4] = aten::relu(%a) {phase=fwd, )" COST(2.0) R"(}
  %b: f32[4] = aten::mul.Tensor(%r, %w1) {layer="l1", phase=fwd, )" COST(3.0) R"(}
  %gb: f32[4] = aten::mul.Tensor(%b, %w1) {layer="l1", phase=bwd, )" COST(4.0) R"(}
  %gr: f32[4] = aten::threshold_backward(%gb, %r, 0) {phase=bwd, )" COST(5.0) R"(}
  return %gr
})");
  EXPECT_HAS(messageOf<ConfigError>([&] { chainFromGraph(g); }), "node %r (aten::relu)");
  ChainOptions o;
  o.inherit_layers = true;
  LayerChain c = chainFromGraph(g, o);
  ASSERT_EQ(c.size(), 2);
  EXPECT_EQ(c.layers[0].name, "l0");
  EXPECT_DOUBLE_EQ(c.layers[0].fwd_us, 3.0);  // %a + %r
  EXPECT_DOUBLE_EQ(c.layers[1].bwd_us, 9.0);  // %gb + %gr
  EXPECT_EQ(withInheritedLayers(g).node(1).layer, "l0");
  EXPECT_TRUE(g.node(1).layer.empty());  // the caller's graph is unchanged
}

}  // namespace
}  // namespace modelpar::passes
