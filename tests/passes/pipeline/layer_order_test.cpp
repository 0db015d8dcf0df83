// orderLayers: nested module names merged, hoisted nodes ordered by their
// edges, unlayered nodes placed, backward rules, naming, errors. (The
// pipelines it enables are tested through torch.compile in
// tests/python/test_compile_pipeline.py.)
#include "passes/pipeline/layer_order.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <string>
#include <vector>

#include "ir/error.h"
#include "ir/parser.h"
#include "tests/support/expect_error.h"

namespace modelpar::passes {
namespace {

using modelpar::testing::messageOf;
using Names = std::vector<std::string>;

std::string layerOf(const ir::Graph& g, const std::string& value) {
  return g.node(g.value(*g.findValue(value)).producer).layer;
}

// A captured transformer block: `blk` (the residual adds, the GELU) runs
// before and after `blk.fc`, and `blk.out` between; `emb` comes first.
// t(w) of `head` is hoisted to the top, as AOTAutograd does.
constexpr const char* kNested = R"(
graph @nested(%x: f32[B, 8] input, %w: f32[8, 8] param, %wh: f32[8, 8] param) {
  %wt: f32[8, 8] = aten::t(%wh) {layer="head", phase=fwd}
  %e: f32[B, 8] = aten::mm(%x, %w) {layer="emb", phase=fwd}
  %r1: f32[B, 8] = aten::add.Tensor(%e, %e) {layer="blk", phase=fwd}
  %f: f32[B, 8] = aten::mm(%r1, %w) {layer="blk.fc", phase=fwd}
  %g: f32[B, 8] = aten::gelu(%f) {layer="blk", phase=fwd}
  %o: f32[B, 8] = aten::mm(%g, %w) {layer="blk.out", phase=fwd}
  %r2: f32[B, 8] = aten::add.Tensor(%r1, %o) {layer="blk", phase=fwd}
  %h: f32[B, 8] = aten::mm(%r2, %wt) {layer="head", phase=fwd}
  %s: f32[B, 8] = aten::relu(%h) {phase=fwd}
  return %s
}
)";

// `blk` is a container (the dotted prefix of blk.fc and blk.out): its own
// nodes join the layer before them, so the block's submodules stay layers of
// their own and nothing merges (Note [Container modules]).
TEST(LayerOrder, KeepsSubmodulesOfAContainerAsLayersAndOrdersHoistedNodesByEdges) {
  ir::Graph g = ir::parseGraph(kNested);
  LayerOrder lo = orderLayers(g);
  EXPECT_EQ(lo.layers, (Names{"emb", "blk.fc", "blk.out", "head"}));
  EXPECT_EQ(lo.merged_layers, 0);
  EXPECT_EQ(lo.unlayered_nodes, 4);  // %r1, %g, %r2 of the container, and %s
  EXPECT_EQ(layerOf(lo.graph, "r1"), "emb");      // the residual add joins the layer before
  EXPECT_EQ(layerOf(lo.graph, "g"), "blk.fc");    // the GELU between fc and out
  EXPECT_EQ(layerOf(lo.graph, "r2"), "blk.out");
  EXPECT_EQ(layerOf(lo.graph, "wt"), "head");
  EXPECT_EQ(layerOf(lo.graph, "s"), "head");  // joins the layer before it
  // The caller's graph is untouched.
  EXPECT_EQ(layerOf(g, "f"), "blk.fc");
  EXPECT_EQ(layerOf(g, "r1"), "blk");
}

// Two blocks of a container model (GPT-2's `transformer` holds the embedding
// sum before the blocks and a view after them): with the container's nodes
// as layers of their own, the cycle through them merged the whole body into
// one layer; now each block's submodules stay separate, blocks in order.
TEST(LayerOrder, ABodyWithTwoBlocksStaysAsFineAsItsSubmodules) {
  ir::Graph g = ir::parseGraph(R"(
graph @body(%x: f32[B, 8] input, %w: f32[8, 8] param) {
  %e: f32[B, 8] = aten::add.Tensor(%x, %x) {layer="transformer", phase=fwd}
  %a0: f32[B, 8] = aten::mm(%e, %w) {layer="transformer.h.0.mlp", phase=fwd}
  %r0: f32[B, 8] = aten::add.Tensor(%a0, %e) {layer="transformer.h.0", phase=fwd}
  %a1: f32[B, 8] = aten::mm(%r0, %w) {layer="transformer.h.1.mlp", phase=fwd}
  %r1: f32[B, 8] = aten::add.Tensor(%a1, %r0) {layer="transformer.h.1", phase=fwd}
  %v: f32[B, 8] = aten::relu(%r1) {layer="transformer", phase=fwd}
  %o: f32[B, 8] = aten::mm(%v, %w) {layer="lm_head", phase=fwd}
  return %o
}
)");
  LayerOrder lo = orderLayers(g);
  EXPECT_EQ(lo.layers, (Names{"transformer.h.0.mlp", "transformer.h.1.mlp", "lm_head"}));
  EXPECT_EQ(layerOf(lo.graph, "e"), "transformer.h.0.mlp");  // before every layer: the first
  EXPECT_EQ(layerOf(lo.graph, "r0"), "transformer.h.0.mlp");
  EXPECT_EQ(layerOf(lo.graph, "v"), "transformer.h.1.mlp");
}

// Two sibling modules in a cycle (one call of p reads q's result, which reads
// p's) with no common prefix: `p+q`; an unlayered node before every layer
// joins the first.
TEST(LayerOrder, NamesMergedSiblingsAndPlacesLeadingUnlayeredNodes) {
  ir::Graph g = ir::parseGraph(R"(
graph @sib(%x: f32[B, 4] input) {
  %n: f32[B, 4] = aten::neg(%x) {phase=fwd}
  %a: f32[B, 4] = aten::relu(%n) {layer="p", phase=fwd}
  %b: f32[B, 4] = aten::tanh(%a) {layer="q", phase=fwd}
  %c: f32[B, 4] = aten::add.Tensor(%b, %a) {layer="p", phase=fwd}
  %d: f32[B, 4] = aten::exp(%c) {layer="r", phase=fwd}
  return %d
}
)");
  LayerOrder lo = orderLayers(g);
  EXPECT_EQ(lo.layers, (Names{"p+q", "r"}));
  EXPECT_EQ(layerOf(lo.graph, "n"), "p+q");
  EXPECT_EQ(layerOf(lo.graph, "b"), "p+q");
}

// Siblings in a cycle merge under their common dotted prefix (a name no
// other forward layer has; a taken one would get `#2`).
TEST(LayerOrder, MergedSiblingsTakeTheirCommonPrefix) {
  ir::Graph g = ir::parseGraph(R"(
graph @clash(%x: f32[B, 4] input) {
  %a: f32[B, 4] = aten::relu(%x) {layer="m", phase=fwd}
  %b: f32[B, 4] = aten::tanh(%a) {layer="x.a", phase=fwd}
  %c: f32[B, 4] = aten::sigmoid(%b) {layer="x.b", phase=fwd}
  %d: f32[B, 4] = aten::add.Tensor(%c, %b) {layer="x.a", phase=fwd}
  %e: f32[B, 4] = aten::exp(%d) {layer="x", phase=bwd}
  return %e
}
)");
  LayerOrder lo = orderLayers(g);
  // x.a and x.b form a cycle: merged under their common prefix `x`, which is
  // free (x has no forward node of its own).
  EXPECT_EQ(lo.layers, (Names{"m", "x"}));
  EXPECT_EQ(layerOf(lo.graph, "c"), "x");
}

// Backward rules, on the shape AOTAutograd gives an MLP with F.relu: the
// relu and its backward have no module; `detach` of the saved relu output is
// a backward node that reads forward values only.
TEST(LayerOrder, BackwardNodesFollowGradientsAndReaders) {
  ir::Graph g = ir::parseGraph(R"(
graph @relu_step(%x: f32[B, 4] input, %w1: f32[4, 4] param, %w2: f32[4, 4] param) {
  %h: f32[B, 4] = aten::mm(%x, %w1) {layer="fc1", phase=fwd}
  %r: f32[B, 4] = aten::relu(%h) {phase=fwd}
  %p: f32[B, 4] = aten::mm(%r, %w2) {layer="fc2", phase=fwd}
  %loss: f32[] = aten::sum(%p) {phase=fwd}
  %seed: f32[] = aten::ones_like(%loss) {phase=bwd}
  %dp: f32[B, 4] = aten::mul.Tensor(%p, %seed) {phase=bwd}
  %w2t: f32[4, 4] = aten::t(%w2) {layer="fc2", phase=bwd}
  %dr: f32[B, 4] = aten::mm(%dp, %w2t) {layer="fc2", phase=bwd}
  %det: f32[B, 4] = aten::detach(%r) {phase=bwd}
  %dh: f32[B, 4] = aten::threshold_backward(%dr, %det, 0) {phase=bwd}
  %xt: f32[4, B] = aten::t(%x) {layer="fc1", phase=bwd}
  %dw1: f32[4, 4] = aten::mm(%xt, %dh) {layer="fc1", phase=bwd}
  %w1n: f32[4, 4] = aten::sub.Tensor(%w1, %dw1, alpha=0.1) {layer="fc1", phase=update}
  return %loss, %w1n
}
)");
  LayerOrder lo = orderLayers(g);
  EXPECT_EQ(lo.layers, (Names{"fc1", "fc2"}));
  EXPECT_EQ(layerOf(lo.graph, "r"), "fc1");     // joins the layer before it
  EXPECT_EQ(layerOf(lo.graph, "loss"), "fc2");
  // seed and dp read forward values only: the latest layer of their readers.
  EXPECT_EQ(layerOf(lo.graph, "seed"), "fc2");
  EXPECT_EQ(layerOf(lo.graph, "dp"), "fc2");
  // dh reads a gradient of fc2: at most fc2's stage; det feeds it.
  EXPECT_EQ(layerOf(lo.graph, "dh"), "fc2");
  EXPECT_EQ(layerOf(lo.graph, "det"), "fc2");
  EXPECT_EQ(layerOf(lo.graph, "w1n"), "fc1");
  for (const ir::Node& n : lo.graph.nodes()) EXPECT_FALSE(n.layer.empty()) << n.op;
}

// AOTAutograd's write-back of a buffer (copy_ into the graph input) comes at
// the end of the forward; it joins the layer that reads the buffer, not the
// layer before it in graph order.
TEST(LayerOrder, BufferWriteBackJoinsTheLayerReadingTheBuffer) {
  ir::Graph g = ir::parseGraph(R"(
graph @bn(%x: f32[B, 4] input, %rm: f32[4] buffer) {
  %a: f32[B, 4] = aten::add.Tensor(%x, %rm) {layer="bn", phase=fwd}
  %m: f32[4] = aten::mul.Scalar(%rm, 0.9) {layer="bn", phase=fwd}
  %b: f32[B, 4] = aten::relu(%a) {layer="fc", phase=fwd}
  %w: f32[4] = aten::copy_(%rm, %m) {phase=fwd}
  return %b
}
)");
  LayerOrder lo = orderLayers(g);
  EXPECT_EQ(lo.layers, (Names{"bn", "fc"}));
  EXPECT_EQ(layerOf(lo.graph, "w"), "bn");
}

// A module called twice (T5's stack dropout before and after the blocks)
// is two layers, one per call, instead of a cycle with everything between
// (Note [Reused modules]); its backward nodes stay with the first call's
// name unless a gradient they read comes from earlier.
TEST(LayerOrder, AModuleCalledTwiceIsOneLayerPerCall) {
  ir::Graph g = ir::parseGraph(R"(
graph @reuse(%x: f32[B, 4] input, %w: f32[4, 4] param) {
  %d1: f32[B, 4] = aten::relu(%x) {layer="drop", phase=fwd}
  %a: f32[B, 4] = aten::mm(%d1, %w) {layer="block.0", phase=fwd}
  %b: f32[B, 4] = aten::mm(%a, %w) {layer="block.1", phase=fwd}
  %d2: f32[B, 4] = aten::relu(%b) {layer="drop", phase=fwd}
  return %d2
}
)");
  LayerOrder lo = orderLayers(g);
  EXPECT_EQ(lo.layers, (Names{"drop", "block.0", "block.1", "drop#2"}));
  EXPECT_EQ(lo.merged_layers, 0);
  EXPECT_EQ(layerOf(lo.graph, "d2"), "drop#2");
}

TEST(LayerOrder, AChainKeepsItsLayers) {
  ir::Graph g = ir::parseGraph(R"(
graph @chain(%x: f32[B, 4] input, %w: f32[4, 4] param) {
  %a: f32[B, 4] = aten::mm(%x, %w) {layer="l0", phase=fwd}
  %b: f32[B, 4] = aten::mm(%a, %w) {layer="l1", phase=fwd}
  %c: f32[B, 4] = aten::mm(%b, %w) {layer="l2", phase=fwd}
  %gc: f32[B, 4] = aten::mul.Tensor(%c, %c) {layer="l2", phase=bwd}
  %gb: f32[B, 4] = aten::mul.Tensor(%gc, %b) {layer="l1", phase=bwd}
  return %c, %gb
}
)");
  LayerOrder lo = orderLayers(g);
  EXPECT_EQ(lo.layers, (Names{"l0", "l1", "l2"}));
  EXPECT_EQ(lo.graph, g);
  EXPECT_EQ(lo.merged_layers, 0);
}

TEST(LayerOrder, AGraphWithoutLayersIsAnError) {
  ir::Graph g = ir::parseGraph(R"(
graph @flat(%x: f32[B, 4] input) {
  %a: f32[B, 4] = aten::relu(%x) {phase=fwd}
  return %a
}
)");
  std::string msg = messageOf<ConfigError>([&] { orderLayers(g); });
  EXPECT_NE(msg.find("no forward node with a layer"), std::string::npos) << msg;
  EXPECT_NE(msg.find("@flat"), std::string::npos) << msg;
}

}  // namespace
}  // namespace modelpar::passes
