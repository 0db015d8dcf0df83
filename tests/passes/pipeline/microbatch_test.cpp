// Pass `microbatch`: the split rule, the structure of the split step (copies,
// slices, accumulation, loss weights), dimension symbols, and every refusal.
// Numerical equality with the full batch: tests/python/test_microbatch.py.
#include "passes/pipeline/microbatch.h"

#include <fmt/format.h>
#include <gtest/gtest.h>

#include <fstream>
#include <limits>
#include <map>
#include <sstream>

#include "ir/error.h"
#include "ir/parser.h"
#include "ir/printer.h"
#include "ir/verifier.h"
#include "passes/pipeline/batch_symbol.h"
#include "tests/support/expect_error.h"
#include "tests/support/read_file.h"

namespace modelpar::passes {
namespace {

using modelpar::testing::messageOf;

ir::Graph loadExample(const std::string& name) {
  return ir::parseGraph(modelpar::testing::readExample(name));
}

MicrobatchOptions opts(int m, int64_t b) {
  MicrobatchOptions o;
  o.microbatches = m;
  o.batch_size = b;
  return o;
}

/// The text of the node defining %name (without attributes' order worries:
/// the printer's canonical form).
std::string nodeText(const ir::Graph& g, const std::string& name) {
  std::optional<ir::ValueId> v = g.findValue(name);
  if (!v) return "<no %" + name + ">";
  return ir::printNode(g, g.value(*v).producer);
}

std::string typeOf(const ir::Graph& g, const std::string& name) {
  std::optional<ir::ValueId> v = g.findValue(name);
  return v ? ir::toString(g.value(*v).type) : "<no %" + name + ">";
}

// ---- the split rule -------------------------------------------------------------

TEST(MicrobatchSizes, FollowTorchChunk) {
  // torch.chunk: ceil(B/m) each, the last the rest; possibly fewer than m.
  EXPECT_EQ(microbatchSizes(10, 3), (std::vector<int64_t>{4, 4, 2}));
  EXPECT_EQ(microbatchSizes(10, 4), (std::vector<int64_t>{3, 3, 3, 1}));
  EXPECT_EQ(microbatchSizes(10, 6), (std::vector<int64_t>{2, 2, 2, 2, 2}));
  EXPECT_EQ(microbatchSizes(8, 8), (std::vector<int64_t>(8, 1)));
  EXPECT_EQ(microbatchSizes(8, 1), (std::vector<int64_t>{8}));
}

TEST(MicrobatchSizes, RejectsMoreMicrobatchesThanSamplesWithTheNumbers) {
  std::string msg = messageOf<ConfigError>([] { microbatchSizes(8, 9); });
  EXPECT_HAS(msg, "9 micro-batches asked for a batch of 8");
  EXPECT_HAS(msg, "at most 8");
  EXPECT_HAS(messageOf<ConfigError>([] { microbatchSizes(8, 0); }), "must be >= 1, got 0");
  EXPECT_HAS(messageOf<ConfigError>([] { microbatchSizes(0, 1); }), "batch_size must be >= 1");
}

// ---- structure ------------------------------------------------------------------

TEST(Microbatch, MlpStepInTwoHasOneCopyPerMicrobatchAndCombinesAfter) {
  ir::Graph g = loadExample("mlp_step_symbolic.txt");
  ir::Graph out = microbatch(g, opts(2, 8));
  ir::verify(out);
  EXPECT_EQ(ir::parseGraph(ir::print(out)), out);
  // 12 batched nodes x 2, 2 slices x 2, seed scale x 2, loss mul + add,
  // dw1/dw2 adds, w2t once, 2 updates: 24 + 4 + 2 + 2 + 2 + 1 + 2 = 37.
  EXPECT_EQ(out.numNodes(), 37u);
  std::map<std::optional<int>, int> per_mb;
  for (const ir::Node& n : out.nodes()) per_mb[n.microbatch]++;
  EXPECT_EQ(per_mb[0], 16);  // 12 copies, 2 slices, seed scale, loss.acc0
  EXPECT_EQ(per_mb[1], 18);  // 12 copies, 2 slices, seed scale, loss, dw1, dw2
  EXPECT_EQ(per_mb[std::nullopt], 3);  // w2t, w1_new, w2_new
  EXPECT_EQ(typeOf(out, "x"), "f32[8, 16]");
  EXPECT_EQ(nodeText(out, "x.mb1"),
            R"(%x.mb1: f32[4, 16] = aten::narrow(%x, 0, 4, 4) {layer="fc1", phase=fwd, mb=1})");
  EXPECT_EQ(typeOf(out, "at.mb0"), "f32[32, 4]");
  EXPECT_EQ(nodeText(out, "w2t"), R"(%w2t: f32[4, 32] = aten::t(%w2) {layer="fc2", phase=bwd})");
  EXPECT_EQ(nodeText(out, "g.mb0.scaled"),
            R"(%g.mb0.scaled: f32[] = aten::mul.Scalar(%g.mb0, 0.5) {layer="loss", phase=bwd, mb=0})");
  EXPECT_EQ(nodeText(out, "dp.mb0"),
            R"(%dp.mb0: f32[4, 4] = aten::mse_loss_backward(%g.mb0.scaled, %p.mb0, %y.mb0, 1) {layer="loss", phase=bwd, mb=0})");
  EXPECT_EQ(nodeText(out, "loss.acc0"),
            R"(%loss.acc0: f32[] = aten::mul.Scalar(%loss.mb0, 0.5) {layer="loss", phase=fwd, mb=0})");
  EXPECT_EQ(nodeText(out, "loss"),
            R"(%loss: f32[] = aten::add.Tensor(%loss.acc0, %loss.mb1, alpha=0.5) {layer="loss", phase=fwd, mb=1})");
  EXPECT_EQ(nodeText(out, "dw1"),
            R"(%dw1: f32[16, 32] = aten::add.Tensor(%dw1.mb0, %dw1.mb1) {layer="fc1", phase=bwd, mb=1})");
  EXPECT_EQ(nodeText(out, "w1_new"),
            R"(%w1_new: f32[16, 32] = aten::sub.Tensor(%w1, %dw1, alpha=0.1) {layer="fc1", phase=update})");
  // Accumulation runs as micro-batches finish: dw2 right after dw2.mb1.
  auto pos = [&](const std::string& v) { return out.value(*out.findValue(v)).producer; };
  EXPECT_EQ(pos("dw2"), pos("dw2.mb1") + 1);
  // Combination and updates come after every copy.
  EXPECT_GT(pos("w1_new"), pos("dw1"));
}

// A profiled time of 10 us at batch 8 with 2 us of it per-op overhead: each
// of 2 micro-batches of 4 pays the overhead whole and half the rest:
// 2 + (10 - 2) * 4/8 = 6 us (without the overhead option: 10 * 4/8 = 5 us).
TEST(Microbatch, ProfiledTimesKeepTheirPerOpOverheadPerMicrobatch) {
  ir::Graph g = loadExample("mlp_step_symbolic.txt");
  const std::string name = g.value(g.node(0).outputs[0]).name;
  g.node(0).cost = ir::Cost{10.0, 64, 0, 0};
  MicrobatchOptions o = opts(2, 8);
  o.launch_overhead_us = 2.0;
  ir::Graph out = microbatch(g, o);
  for (const char* mb : {".mb0", ".mb1"}) {
    std::optional<ir::ValueId> v = out.findValue(name + mb);
    ASSERT_TRUE(v.has_value()) << name << mb;
    EXPECT_DOUBLE_EQ(out.node(out.value(*v).producer).cost->time_us, 6.0);
  }
  ir::Graph plain = microbatch(g, opts(2, 8));
  EXPECT_DOUBLE_EQ(plain.node(plain.value(*plain.findValue(name + ".mb0")).producer).cost->time_us,
                   5.0);
}

TEST(Microbatch, UnevenSplitSlicesAndWeightsByMicrobatchSize) {
  // B = 10, m = 3 -> 4, 4, 2; a mean loss weighs them 0.4, 0.4, 0.2.
  ir::Graph out = microbatch(loadExample("mlp_step_symbolic.txt"), opts(3, 10));
  ir::verify(out);
  EXPECT_EQ(nodeText(out, "x.mb2"),
            R"(%x.mb2: f32[2, 16] = aten::narrow(%x, 0, 8, 2) {layer="fc1", phase=fwd, mb=2})");
  EXPECT_EQ(typeOf(out, "h.mb2"), "f32[2, 32]");
  EXPECT_EQ(typeOf(out, "h.mb1"), "f32[4, 32]");
  EXPECT_EQ(nodeText(out, "loss.acc0"),
            R"(%loss.acc0: f32[] = aten::mul.Scalar(%loss.mb0, 0.4) {layer="loss", phase=fwd, mb=0})");
  EXPECT_HAS(nodeText(out, "loss.acc1"), "aten::add.Tensor(%loss.acc0, %loss.mb1, alpha=0.4)");
  EXPECT_HAS(nodeText(out, "loss"), "aten::add.Tensor(%loss.acc1, %loss.mb2, alpha=0.2)");
  EXPECT_HAS(nodeText(out, "g.mb2.scaled"), "aten::mul.Scalar(%g.mb2, 0.2)");
  EXPECT_HAS(nodeText(out, "dw1.acc1"), "aten::add.Tensor(%dw1.mb0, %dw1.mb1)");
  EXPECT_HAS(nodeText(out, "dw1"), "aten::add.Tensor(%dw1.acc1, %dw1.mb2)");
}

TEST(Microbatch, SumLossNeedsNoWeights) {
  std::string text = ir::print(loadExample("mlp_step_symbolic.txt"));
  for (auto [from, to] : {std::pair<std::string, std::string>{"%y, 1)", "%y, 2)"}}) {
    for (size_t p; (p = text.find(from)) != std::string::npos;) text.replace(p, from.size(), to);
  }
  ir::Graph out = microbatch(ir::parseGraph(text), opts(2, 8));
  EXPECT_FALSE(out.findValue("g.mb0.scaled").has_value());
  EXPECT_FALSE(out.findValue("loss.acc0").has_value());  // loss.mb0 is acc_0 itself
  EXPECT_HAS(nodeText(out, "loss"), "aten::add.Tensor(%loss.mb0, %loss.mb1) {");
  // The override wins over detection.
  MicrobatchOptions o = opts(2, 8);
  o.loss_reduction = LossReduction::Mean;
  EXPECT_HAS(nodeText(microbatch(ir::parseGraph(text), o), "loss"), "alpha=0.5");
}

TEST(Microbatch, OneMicrobatchIsTheSameStepWithMbZero) {
  ir::Graph out = microbatch(loadExample("mlp_step_symbolic.txt"), opts(1, 8));
  // 12 copies + 2 slices + w2t + 2 updates; weights are all 1: nothing else.
  EXPECT_EQ(out.numNodes(), 17u);
  // The copies keep the graph's names (mb=0 on each marks the micro-batch).
  EXPECT_EQ(out.value(out.outputs()[0]).name, "loss");
  EXPECT_HAS(nodeText(out, "w1_new"), "aten::sub.Tensor(%w1, %dw1, alpha=0.1)");
  EXPECT_HAS(nodeText(out, "dw1"), "mb=0");
}

// A torch.compile dynamic graph: the batch is s0, an int input carries its
// value, sizes are computed from it, and a dim is the expression 4*s0.
constexpr const char* kDynamic = R"(
graph @dyn(%s0: int input, %x: f32[s0, 4] input, %w: f32[4, 4] param) {
  %bt: int = modelpar::sym_mul(%s0, 4) {phase=fwd}
  %h: f32[s0, 4] = aten::mm(%x, %w) {layer="l", phase=fwd}
  %v: f32[e_4xs0] = aten::view(%h, [%bt]) {layer="l", phase=fwd}
  %wt: f32[4, 4] = aten::t(%w) {layer="l", phase=fwd}
  return %v, %wt
}
)";

TEST(Microbatch, DynamicGraphSizesBecomeConstantsAndOutputsAreConcatenated) {
  ir::Graph out = microbatch(ir::parseGraph(kDynamic), opts(2, 6));
  ir::verify(out);
  EXPECT_EQ(nodeText(out, "bt.mb1"), R"(%bt.mb1: int = modelpar::sym_mul(3, 4) {phase=fwd, mb=1})");
  EXPECT_EQ(typeOf(out, "v.mb0"), "f32[12]");
  EXPECT_EQ(nodeText(out, "v"), R"(%v: f32[24] = aten::cat([%v.mb0, %v.mb1], 0) {layer="l", phase=fwd})");
  EXPECT_EQ(typeOf(out, "x"), "f32[6, 4]");
  EXPECT_EQ(nodeText(out, "wt"), R"(%wt: f32[4, 4] = aten::t(%w) {layer="l", phase=fwd})");
}

// Sizes are int64: a number or a result outside it is bad IR, not a wrapped
// size (and never std::stoll's std::out_of_range).
TEST(BatchSymbol, DimExpressionOutsideInt64IsInvalidIr) {
  auto sym = [](const char* s) { return ir::Dim::symbolic(s); };
  EXPECT_HAS(messageOf<InvalidIrError>([&] { evalDim(sym("e_99999999999999999999xs0"), "s0", 3); }),
             "modelpar microbatch: dimension e_99999999999999999999xs0 with s0=3: the number "
             "99999999999999999999 does not fit in int64");
  EXPECT_HAS(messageOf<InvalidIrError>([&] { evalDim(sym("e_4611686018427387904xs0"), "s0", 2); }),
             "the product does not fit in int64");
  EXPECT_HAS(messageOf<InvalidIrError>(
                 [&] { evalDim(sym("e_s0p1"), "s0", std::numeric_limits<int64_t>::max()); }),
             "the sum does not fit in int64");
  EXPECT_HAS(messageOf<InvalidIrError>(
                 [&] { evalDim(sym("e_s0m2x3"), "s0", std::numeric_limits<int64_t>::min() + 1); }),
             "the sum does not fit in int64");
  EXPECT_EQ(evalDim(sym("e_4611686018427387903x2p1"), "s0", 0), std::numeric_limits<int64_t>::max());
}

TEST(Microbatch, RefusesADimensionThatOverflowsWhenInstantiated) {
  const std::string g = R"(
graph @dyn(%s0: int input, %x: f32[s0, 4] input) {
  %v: f32[e_9223372036854775807xs0] = aten::view(%x, [-1]) {layer="l", phase=fwd}
  return %v
}
)";
  EXPECT_HAS(messageOf<InvalidIrError>([&] { microbatch(ir::parseGraph(g), opts(2, 6)); }),
             "dimension e_9223372036854775807xs0 with s0=3: the product does not fit in int64");
}

TEST(BatchSymbol, EvaluatesTorchCompileDimExpressions) {
  auto sym = [](const char* s) { return ir::Dim::symbolic(s); };
  EXPECT_EQ(evalDim(sym("e_16xs0"), "s0", 3), 48);
  EXPECT_EQ(evalDim(sym("e_s0p1"), "s0", 3), 4);
  EXPECT_EQ(evalDim(sym("e_2xs0m1"), "s0", 3), 5);
  EXPECT_EQ(evalDim(sym("e_s0x2p3x4"), "s0", 3), 18);
  EXPECT_EQ(evalDim(sym("e_s0ds1"), "s0", 3), std::nullopt);
  EXPECT_EQ(evalDim(sym("e_s0xs1"), "s0", 3), std::nullopt);
  EXPECT_EQ(evalDim(sym("N"), "s0", 3), std::nullopt);
  EXPECT_EQ(evalDim(ir::Dim::fixed(7), "s0", 3), 7);
  EXPECT_TRUE(dimMentions(sym("e_s0xs1"), "s0"));
  EXPECT_FALSE(dimMentions(sym("e_s10x2"), "s1"));
  EXPECT_EQ(batchDimOf(ir::parseGraph(kDynamic).value(1).type, "s0"), 0);
  EXPECT_EQ(batchDimOf(ir::parseGraph(kDynamic).value(2).type, "s0"), -1);
  ir::Type t = instantiate(ir::Type::tensor(ir::ScalarType::Float32, {sym("e_s0xs1"), sym("s0")}), "s0", 5);
  EXPECT_EQ(ir::toString(t), "f32[e_s0xs1, 5]");
}

TEST(Microbatch, BatchDimsOverrideFindsASequenceFirstBatch) {
  // x is [T, B, 4]: dim 0 is the time symbol, so the batch must be named.
  const char* text = R"(
graph @seq(%x: f32[T, B, 4] input, %w: f32[4, 4] param) {
  %h: f32[T, B, 4] = aten::matmul(%x, %w) {layer="l", phase=fwd}
  return %h
})";
  MicrobatchOptions o = opts(2, 4);
  o.batch_dims = {{"x", 1}};
  ir::Graph out = microbatch(ir::parseGraph(text), o);
  EXPECT_HAS(nodeText(out, "x.mb1"), "aten::narrow(%x, 1, 2, 2)");
  EXPECT_EQ(typeOf(out, "h.mb1"), "f32[T, 2, 4]");
  EXPECT_HAS(nodeText(out, "h"), "aten::cat([%h.mb0, %h.mb1], 1)");
  o.batch_dims.clear();
  o.batch_symbol = "B";
  EXPECT_HAS(nodeText(microbatch(ir::parseGraph(text), o), "x.mb0"), "aten::narrow(%x, 1, 0, 2)");
}

// ---- refusals -------------------------------------------------------------------

TEST(Microbatch, RejectsStaticBatchSayingHowToMakeItSymbolic) {
  std::string msg = messageOf<ConfigError>([] { microbatch(loadExample("mlp_step.txt"), opts(2, 8)); });
  EXPECT_HAS(msg, "the batch dimension is static");
  EXPECT_HAS(msg, "%x: f32[8, 16]");
  EXPECT_HAS(msg, "f32[B, 16]");
  EXPECT_HAS(msg, "dynamic=True");
}

TEST(Microbatch, RejectsBadOptions) {
  ir::Graph g = loadExample("mlp_step_symbolic.txt");
  EXPECT_HAS(messageOf<ConfigError>([&] { microbatch(g, MicrobatchOptions{}); }),
             "batch_size is required");
  EXPECT_HAS(messageOf<ConfigError>([&] { microbatch(g, opts(9, 8)); }),
             "9 micro-batches asked for a batch of 8");
  MicrobatchOptions o = opts(2, 8);
  o.batch_dims = {{"z", 0}};
  EXPECT_HAS(messageOf<ConfigError>([&] { microbatch(g, o); }), "names 'z', which is not a graph input");
  o.batch_dims = {{"x", 1}};
  EXPECT_HAS(messageOf<ConfigError>([&] { microbatch(g, o); }), "its size there is static");
  o.batch_dims = {{"x", 2}};
  EXPECT_HAS(messageOf<ConfigError>([&] { microbatch(g, o); }), "batch dim 2");
  o = opts(2, 8);
  o.loss = "w1_new";
  EXPECT_HAS(messageOf<ConfigError>([&] { microbatch(g, o); }), "loss %w1_new does not depend");
  o.loss = "h";
  EXPECT_HAS(messageOf<ConfigError>([&] { microbatch(g, o); }), "loss 'h' is not a graph output");
  EXPECT_HAS(messageOf<ConfigError>([] { parseLossReduction("avg"); }), "loss_reduction='avg' is not valid; loss_reduction takes one of 'auto', 'mean', 'sum'");
}

TEST(Microbatch, RejectsInputsThatDisagreeOnTheBatchSymbol) {
  const char* text = R"(
graph @two(%x: f32[B, 4] input, %y: f32[N, 4] input) {
  %z: f32[B, 4] = aten::relu(%x) {phase=fwd}
  return %z
})";
  std::string msg = messageOf<ConfigError>([&] { microbatch(ir::parseGraph(text), opts(2, 4)); });
  EXPECT_HAS(msg, "disagree on the batch symbol: %x has B and %y has N");
  MicrobatchOptions o = opts(2, 4);
  o.batch_symbol = "B";  // y is then unbatched
  EXPECT_NO_THROW(microbatch(ir::parseGraph(text), o));
}

// A training step through a functional batch norm (AOTAutograd's form) with
// a sum loss; the backward receives the new running stats but ignores them.
constexpr const char* kBnStep = R"(
graph @bn(%x: f32[B, 3, 2, 2] input, %t: f32[B, 3, 2, 2] input, %w: f32[3] param, %b: f32[3] param, %rm: f32[3] buffer, %rv: f32[3] buffer) {
  %y: f32[B, 3, 2, 2], %mean: f32[3], %rstd: f32[3], %rm2: f32[3], %rv2: f32[3] = aten::_native_batch_norm_legit_functional(%x, %w, %b, %rm, %rv, true, 0.1, 1e-05) {layer="bn", phase=fwd}
  %p: f32[B, 3, 2, 2] = aten::mul.Tensor(%y, %t) {layer="loss", phase=fwd}
  %loss: f32[] = aten::sum(%p) {layer="loss", phase=fwd}
  %g: f32[] = aten::ones_like(%loss) {layer="loss", phase=bwd}
  %dy: f32[B, 3, 2, 2] = aten::mul.Tensor(%t, %g) {layer="loss", phase=bwd}
  %dx: f32[B, 3, 2, 2], %dw: f32[3], %db: f32[3] = aten::native_batch_norm_backward(%dy, %x, %w, %rm2, %rv2, %mean, %rstd, true, 1e-05, [true, true, true]) {layer="bn", phase=bwd}
  return %loss, %y, %rm2, %rv2, %dw, %db
})";

MicrobatchOptions deferred(int m, int64_t b) {
  MicrobatchOptions o = opts(m, b);
  o.batch_norm = BatchNormMode::Deferred;
  return o;
}

TEST(Microbatch, RejectsBatchNormStatisticsNamingTheDeferredOption) {
  const char* text = R"(
graph @bn(%x: f32[B, 3] input, %w: f32[3] param, %b: f32[3] param, %rm: f32[3] buffer, %rv: f32[3] buffer) {
  %y: f32[B, 3], %mean: f32[3], %rstd: f32[3], %rm2: f32[3], %rv2: f32[3] = aten::_native_batch_norm_legit_functional(%x, %w, %b, %rm, %rv, true, 0.1, 1e-05) {layer="bn", phase=fwd}
  %loss: f32[] = aten::sum(%y) {layer="loss", phase=fwd}
  return %loss, %rm2, %rv2
})";
  // Returned running statistics leave the micro-batches...
  std::string msg = messageOf<UnsupportedOpError>([&] { microbatch(ir::parseGraph(text), opts(2, 4)); });
  EXPECT_HAS(msg, "%rm2 = aten::_native_batch_norm_legit_functional has no batch dimension");
  EXPECT_HAS(msg, "set the batch_norm option to deferred");
  // ... and the batch statistics differ per micro-batch even when not returned.
  std::string internal = text;
  internal.replace(internal.find("return %loss, %rm2, %rv2"), 24, "return %loss");
  msg = messageOf<UnsupportedOpError>([&] { microbatch(ir::parseGraph(internal), opts(2, 4)); });
  EXPECT_HAS(msg, "%mean = aten::_native_batch_norm_legit_functional reduces over the batch");
  EXPECT_HAS(msg, "BatchNormMode::Deferred");
  // Deferred: accepted, both ways.
  EXPECT_NO_THROW(ir::verify(microbatch(ir::parseGraph(text), deferred(2, 4))));
  EXPECT_NO_THROW(ir::verify(microbatch(ir::parseGraph(internal), deferred(2, 4))));
}

TEST(Microbatch, DeferredBatchNormCombinesRunningStatsFromTheWholeBatch) {
  ir::Graph out = microbatch(ir::parseGraph(kBnStep), deferred(2, 5));  // sizes 3, 2
  ir::verify(out);
  EXPECT_EQ(ir::parseGraph(ir::print(out)), out);
  // Per micro-batch: the batch norm and its backward, own statistics.
  EXPECT_EQ(typeOf(out, "y.mb0"), "f32[3, 3, 2, 2]");
  EXPECT_EQ(typeOf(out, "y.mb1"), "f32[2, 3, 2, 2]");
  EXPECT_HAS(nodeText(out, "dx.mb1"), "aten::native_batch_norm_backward(%dy.mb1, %x.mb1, %w, %rm2.mb1, %rv2.mb1, %mean.mb1, %rstd.mb1");
  // n_k = b_k * 4 elements per channel, N = 20: weights 12/20 and 8/20.
  EXPECT_HAS(nodeText(out, "rm2.batch_mean.acc0"), "aten::mul.Scalar(%mean.mb0, 0.6)");
  EXPECT_HAS(nodeText(out, "rm2.batch_mean"), "aten::add.Tensor(%rm2.batch_mean.acc0, %mean.mb1, alpha=0.4)");
  EXPECT_HAS(nodeText(out, "rm2.mb1.rstd_m2"), "aten::pow.Tensor_Scalar(%rstd.mb1, -2)");
  EXPECT_HAS(nodeText(out, "rm2.mb1.var"), "aten::sub.Scalar(%rm2.mb1.rstd_m2, 1e-05)");
  EXPECT_HAS(nodeText(out, "rm2.mb1.dev"), "aten::sub.Tensor(%mean.mb1, %rm2.batch_mean)");
  EXPECT_HAS(nodeText(out, "rm2.batch_var"), "aten::add.Tensor(%rm2.batch_var.acc0, %rm2.mb1.spread, alpha=0.4)");
  EXPECT_HAS(nodeText(out, "rm2"), "aten::add.Tensor(%rm2.kept, %rm2.batch_mean, alpha=0.1)");
  EXPECT_HAS(nodeText(out, "rm2.kept"), "aten::mul.Scalar(%rm, 0.9)");
  EXPECT_HAS(nodeText(out, "rv2"), "aten::add.Tensor(%rv2.kept, %rm2.batch_var_unbiased, alpha=0.1)");
  const ir::Node& unbiased = out.node(out.value(*out.findValue("rm2.batch_var_unbiased")).producer);
  EXPECT_DOUBLE_EQ(unbiased.args[1].toDouble(), 20.0 / 19.0);
  // After the micro-batches, in the batch norm's layer, forward, no mb.
  const ir::Node& rm2 = out.node(out.value(*out.findValue("rm2")).producer);
  EXPECT_EQ(rm2.layer, "bn");
  EXPECT_EQ(rm2.phase, ir::Phase::Forward);
  EXPECT_FALSE(rm2.microbatch.has_value());
  // Outputs: the combined running stats; gradients accumulated.
  EXPECT_EQ(out.value(out.outputs()[2]).name, "rm2");
  EXPECT_EQ(out.value(out.outputs()[3]).name, "rv2");
  EXPECT_HAS(nodeText(out, "dw"), "aten::add.Tensor(%dw.mb0, %dw.mb1)");
}

TEST(Microbatch, DeferredBatchNormWithOneMicrobatchUsesTheCopysOwnUpdate) {
  ir::Graph out = microbatch(ir::parseGraph(kBnStep), deferred(1, 4));
  ir::verify(out);
  // One micro-batch keeps the graph's names: its outputs are the graph's.
  EXPECT_EQ(out.value(out.outputs()[2]).name, "rm2");
  EXPECT_EQ(out.value(out.outputs()[3]).name, "rv2");
  EXPECT_FALSE(out.findValue("rm2.batch_mean").has_value());
}

// AOTAutograd writes the new running stats back with copy_ into the buffer
// inside the forward: under deferred batch norm that write reads the whole
// batch's statistics, so it runs after the micro-batches.
TEST(Microbatch, DeferredBatchNormRunsTheBufferWriteBackAfterTheMicrobatches) {
  std::string text = kBnStep;
  text.replace(text.find("  %p: f32"), 0,
               "  %w1: f32[3] = aten::copy_(%rm, %rm2) {phase=fwd}\n"
               "  %w2: f32[3] = aten::copy_(%rv, %rv2) {phase=fwd}\n");
  ir::Graph out = microbatch(ir::parseGraph(text), deferred(2, 4));
  ir::verify(out);
  EXPECT_HAS(nodeText(out, "w1"), "aten::copy_(%rm, %rm2)");
  EXPECT_FALSE(out.findValue("w1.mb0").has_value());
  const ir::Node& w1 = out.node(out.value(*out.findValue("w1")).producer);
  EXPECT_FALSE(w1.microbatch.has_value());
  // After the combination it reads.
  EXPECT_GT(out.value(*out.findValue("w1")).producer,
            out.value(*out.findValue("rm2")).producer);
  // Without deferral the statistics are refused as before.
  EXPECT_THROW(microbatch(ir::parseGraph(text), opts(2, 4)), UnsupportedOpError);
}

// torch.compile passes the batch size once per input that has it
// (`%s0`, `%s0_1`): every such int input becomes the micro-batch's size.
TEST(BatchSymbol, EveryIntInputNamedAfterTheSymbolIsTheSize) {
  ir::Graph out = microbatch(ir::parseGraph(R"(
graph @two_sizes(%s0: int input, %x: f32[s0, 4] input, %s0_1: int input, %s01: int input) {
  %a: int = modelpar::sym_mul(%s0, 4) {layer="l", phase=fwd}
  %v: f32[e_4xs0] = aten::view(%x, [%a]) {layer="l", phase=fwd}
  %b: int = modelpar::sym_mul(%s0_1, 4) {layer="l", phase=fwd}
  %u: f32[e_4xs0] = aten::view(%x, [%b]) {layer="l", phase=fwd}
  %c: int = modelpar::sym_mul(%s01, 4) {layer="l", phase=fwd}
  return %v, %u, %c
})"), opts(2, 6));
  EXPECT_HAS(nodeText(out, "a.mb1"), "modelpar::sym_mul(3, 4)");
  EXPECT_HAS(nodeText(out, "b.mb1"), "modelpar::sym_mul(3, 4)");
  // %s01 is another int: not the size, so %c is computed once from it.
  EXPECT_HAS(nodeText(out, "c"), "modelpar::sym_mul(%s01, 4)");
}

TEST(Microbatch, DeferredBatchNormRefusesWhatItCannotCombine) {
  auto edit = [](std::string from, std::string to) {
    std::string t = kBnStep;
    size_t at = t.find(from);
    EXPECT_NE(at, std::string::npos) << from;
    return ir::parseGraph(t.replace(at, from.size(), to));
  };
  // The per-micro-batch statistics cannot leave the micro-batches.
  std::string msg = messageOf<UnsupportedOpError>([&] {
    microbatch(edit("return %loss, %y,", "return %loss, %mean, %y,"), deferred(2, 4));
  });
  EXPECT_HAS(msg, "%mean = aten::_native_batch_norm_legit_functional has no batch dimension");
  EXPECT_HAS(msg, "save_mean / save_rstd must stay inside the micro-batches");
  // A new running stat read inside the micro-batches is not known there.
  msg = messageOf<UnsupportedOpError>([&] {
    microbatch(edit("aten::mul.Tensor(%y, %t)", "aten::add.Tensor(%y, %rm2)"), deferred(2, 4));
  });
  EXPECT_HAS(msg, "%rm2 (the new running mean of %y = aten::_native_batch_norm_legit_functional) is read by %p = aten::add.Tensor inside the micro-batches");
  // Running stats must be shared buffers.
  msg = messageOf<UnsupportedOpError>([&] {
    microbatch(edit("%w, %b, %rm, %rv, true", "%w, %b, None, %rv, true"), deferred(2, 4));
  });
  EXPECT_HAS(msg, "the running mean to be one tensor shared by all micro-batches");
  // Batch first: a channel-first input cannot be split per channel.
  MicrobatchOptions channel_first = deferred(2, 4);
  channel_first.batch_dims = {{"x", 1}};
  msg = messageOf<UnsupportedOpError>([&] {
    microbatch(ir::parseGraph(R"(
graph @cf(%x: f32[3, B] input, %w: f32[3] param, %b: f32[3] param, %rm: f32[3] buffer, %rv: f32[3] buffer) {
  %y: f32[3, B], %mean: f32[3], %rstd: f32[3], %rm2: f32[3], %rv2: f32[3] = aten::_native_batch_norm_legit_functional(%x, %w, %b, %rm, %rv, true, 0.1, 1e-05) {layer="bn", phase=fwd}
  %loss: f32[] = aten::sum(%y) {layer="loss", phase=fwd}
  return %loss, %rm2
})"), channel_first);
  });
  EXPECT_HAS(msg, "needs its input at [B, C, ...]");
  EXPECT_HAS(msg, "got f32[3, B]");
  // Symbolic spatial dimensions (torch.compile's dynamic=True) leave the
  // element count per channel unknown.
  msg = messageOf<UnsupportedOpError>([&] {
    microbatch(edit("%x: f32[B, 3, 2, 2] input", "%x: f32[B, 3, H, 2] input"), deferred(2, 4));
  });
  EXPECT_HAS(msg, "mark_dynamic(x, 0)");
  EXPECT_HAS(msg, "got f32[B, 3, H, 2]");
  // The in-place form updates the buffers per micro-batch.
  msg = messageOf<UnsupportedOpError>([] {
    microbatch(ir::parseGraph(R"(
graph @nbn(%x: f32[B, 3] input, %w: f32[3] param, %b: f32[3] param, %rm: f32[3] buffer, %rv: f32[3] buffer) {
  %y: f32[B, 3], %mean: f32[3], %rstd: f32[3] = aten::native_batch_norm(%x, %w, %b, %rm, %rv, true, 0.1, 1e-05) {layer="bn", phase=fwd}
  %loss: f32[] = aten::sum(%y) {layer="loss", phase=fwd}
  return %loss
})"), deferred(2, 4));
  });
  EXPECT_HAS(msg, "%y = aten::native_batch_norm updates the running statistics in place");
  EXPECT_HAS(msg, "aten::_native_batch_norm_legit_functional");
  EXPECT_HAS(messageOf<ConfigError>([] { parseBatchNormMode("defer"); }),
             "batch_norm='defer' is not valid; batch_norm takes one of 'refuse', 'deferred'");
  EXPECT_EQ(parseBatchNormMode("deferred"), BatchNormMode::Deferred);
}

TEST(Microbatch, RejectsRandomOpsUnlessAllowed) {
  const char* text = R"(
graph @drop(%x: f32[B, 3] input) {
  %o: f32[B, 3], %mask: bool[B, 3] = aten::native_dropout(%x, 0.5, true) {layer="d", phase=fwd}
  return %o
})";
  MicrobatchOptions o = opts(2, 4);
  EXPECT_TRUE(o.allow_random);  // the default, as the pipeline option's
  EXPECT_EQ(microbatch(ir::parseGraph(text), o).numNodes(), 5u);  // 2 slices, 2 dropouts, cat
  o.allow_random = false;
  std::string msg = messageOf<UnsupportedOpError>([&] { microbatch(ir::parseGraph(text), o); });
  EXPECT_HAS(msg, "%o = aten::native_dropout draws random numbers per micro-batch");
  EXPECT_HAS(msg, "allow_random");
}

// allow_random=false refuses the functional samplers AOTAutograd emits and
// any node marked random (the schema's nondeterministic_seeded tag), not
// only the names of the in-place samplers; the mark survives the split.
TEST(Microbatch, RefusesFunctionalSamplersAndNodesMarkedRandomUnlessAllowed) {
  const char* text = R"(
graph @draw(%x: f32[B, 3] input) {
  %u: f32[B, 3] = aten::uniform(%x, 0.0, 1.0) {layer="u", phase=fwd}
  %s: f32[B, 3] = mylib::sample(%u) {layer="s", phase=fwd, random=true}
  return %s
})";
  MicrobatchOptions o = opts(2, 4);
  o.allow_random = false;
  EXPECT_HAS(messageOf<UnsupportedOpError>([&] { microbatch(ir::parseGraph(text), o); }),
             "%u = aten::uniform draws random numbers per micro-batch");
  const char* marked = R"(
graph @draw(%x: f32[B, 3] input) {
  %s: f32[B, 3] = mylib::sample(%x) {layer="s", phase=fwd, random=true}
  return %s
})";
  EXPECT_HAS(messageOf<UnsupportedOpError>([&] { microbatch(ir::parseGraph(marked), o); }),
             "%s = mylib::sample draws random numbers per micro-batch");
  o.allow_random = true;
  const ir::Graph split = microbatch(ir::parseGraph(marked), o);
  int marked_copies = 0;
  for (const ir::Node& n : split.nodes()) marked_copies += n.op == "mylib::sample" && n.random;
  EXPECT_EQ(marked_copies, 2);  // one per micro-batch, each still marked
}

// Note [Random ops per micro-batch]: a permutation per micro-batch is not
// the batch's, allowed random ops or not.
TEST(Microbatch, RejectsAPermutationDrawnPerMicroBatch) {
  const char* text = R"(
graph @shuffle(%x: f32[B, 3] input, %B: int input) {
  %p: i64[B] = aten::randperm(%B, dtype.i64) {layer="s", phase=fwd}
  %o: f32[B, 3] = aten::index_select(%x, 0, %p) {layer="s", phase=fwd}
  return %o
})";
  MicrobatchOptions o = opts(2, 4);
  o.allow_random = true;
  std::string msg = messageOf<UnsupportedOpError>([&] { microbatch(ir::parseGraph(text), o); });
  EXPECT_HAS(msg, "%p = aten::randperm draws a permutation per micro-batch");
}

TEST(Microbatch, RejectsALossThatIsNotAWeightedSum) {
  const char* text = R"(
graph @sq(%x: f32[B, 3] input) {
  %m: f32[] = aten::mean(%x) {layer="loss", phase=fwd}
  %loss: f32[] = aten::pow.Tensor_Scalar(%m, 2) {layer="loss", phase=fwd}
  return %loss
})";
  std::string msg = messageOf<UnsupportedOpError>([&] { microbatch(ir::parseGraph(text), opts(2, 4)); });
  EXPECT_HAS(msg, "the loss %loss is not a weighted sum of micro-batch losses: %loss = aten::pow.Tensor_Scalar");
  // Dividing the mean by a constant keeps it a weighted sum; dividing a
  // constant by it does not.
  auto withLoss = [](const char* node) {
    return fmt::format(R"(
graph @div(%x: f32[B, 3] input, %c: f32[] param) {{
  %m: f32[] = aten::mean(%x) {{layer="loss", phase=fwd}}
  %loss: f32[] = {} {{layer="loss", phase=fwd}}
  return %loss
}})", node);
  };
  EXPECT_NO_THROW(microbatch(ir::parseGraph(withLoss("aten::div.Tensor(%m, %c)")), opts(2, 4)));
  msg = messageOf<UnsupportedOpError>(
      [&] { microbatch(ir::parseGraph(withLoss("aten::div.Tensor(%c, %m)")), opts(2, 4)); });
  EXPECT_HAS(msg, "%loss = aten::div.Tensor lies between the batch reduction and the loss");
  msg = messageOf<UnsupportedOpError>(
      [&] { microbatch(ir::parseGraph(withLoss("aten::mul.Tensor(%m, %m)")), opts(2, 4)); });
  EXPECT_HAS(msg, "%loss = aten::mul.Tensor lies between");
}

TEST(Microbatch, RejectsALossMixingMeanAndSum) {
  const char* text = R"(
graph @mix(%x: f32[B, 3] input) {
  %a: f32[] = aten::mean(%x) {layer="loss", phase=fwd}
  %b: f32[] = aten::sum(%x) {layer="loss", phase=fwd}
  %loss: f32[] = aten::add.Tensor(%a, %b) {layer="loss", phase=fwd}
  return %loss
})";
  std::string msg = messageOf<UnsupportedOpError>([&] { microbatch(ir::parseGraph(text), opts(2, 4)); });
  EXPECT_HAS(msg, "mixes a mean (%a = aten::mean) and a sum (%b = aten::sum)");
}

TEST(Microbatch, RejectsUnbatchedForwardOutputsThatAreNotTheLoss) {
  // %acc (a metric) reduces the batch but is not the loss the seed reads.
  const char* text = R"(
graph @metric(%x: f32[B, 3] input) {
  %loss: f32[] = aten::sum(%x) {layer="loss", phase=fwd}
  %acc: f32[] = aten::amax(%x, [0, 1]) {layer="metric", phase=fwd}
  %g: f32[] = aten::ones_like(%loss) {layer="loss", phase=bwd}
  return %loss, %acc, %g
})";
  std::string msg = messageOf<UnsupportedOpError>([&] { microbatch(ir::parseGraph(text), opts(2, 4)); });
  EXPECT_HAS(msg, "%acc = aten::amax has no batch dimension");
  EXPECT_HAS(msg, "returned after the micro-batches, and it is not the loss");
}

TEST(Microbatch, RejectsTwoScalarOutputsWithoutSeed) {
  const char* text = R"(
graph @two(%x: f32[B, 3] input) {
  %a: f32[] = aten::sum(%x) {phase=fwd}
  %b: f32[] = aten::mean(%x) {phase=fwd}
  return %a, %b
})";
  std::string msg = messageOf<ConfigError>([&] { microbatch(ir::parseGraph(text), opts(2, 4)); });
  EXPECT_HAS(msg, "cannot tell which output is the loss among %a, %b");
}

TEST(Microbatch, FindsALossThatIsNotReturnedThroughItsSeed) {
  // Only the update is returned; the seed ones_like(%loss) names the loss,
  // whose mean gives the seed weights 0.5.
  std::string text = ir::print(loadExample("mlp_step_symbolic.txt"));
  text.replace(text.find("return %loss, "), 14, "return ");
  ir::Graph out = microbatch(ir::parseGraph(text), opts(2, 8));
  EXPECT_HAS(nodeText(out, "g.mb1.scaled"), "aten::mul.Scalar(%g.mb1, 0.5)");
  EXPECT_FALSE(out.findValue("loss").has_value());  // nothing combines it
}

TEST(Microbatch, RejectsATangentSeedWithoutALossToTellTheReduction) {
  const char* text = R"(
graph @tangent(%x: f32[B, 3] input, %w: f32[3, 3] param, %t: f32[] input) {
  %ge: f32[B, 3] = aten::expand_as(%t, %x) {phase=bwd}
  %xt: f32[3, B] = aten::t(%x) {phase=bwd}
  %dw: f32[3, 3] = aten::mm(%xt, %ge) {phase=bwd}
  return %dw
})";
  std::string msg = messageOf<ConfigError>([&] { microbatch(ir::parseGraph(text), opts(2, 4)); });
  EXPECT_HAS(msg, "found the backward seed %t but not the loss");
  MicrobatchOptions o = opts(2, 4);
  o.loss_reduction = LossReduction::Sum;
  EXPECT_EQ(microbatch(ir::parseGraph(text), o).numNodes(), 9u);  // 2 x (slice, 3 copies), add
}

TEST(Microbatch, RejectsInPlaceUpdatesOfSharedValuesInTheMicrobatches) {
  const char* text = R"(
graph @inplace(%x: f32[B, 3] input, %w: f32[3] param) {
  %s: f32[3] = aten::sum.dim_IntList(%x, [0]) {phase=bwd}
  %w2: f32[3] = aten::add_.Tensor(%w, %s) {phase=bwd}
  return %w2
})";
  std::string msg = messageOf<UnsupportedOpError>([&] { microbatch(ir::parseGraph(text), opts(2, 4)); });
  EXPECT_HAS(msg, "in-place %w2 = aten::add_.Tensor in the micro-batches mutates %w");
}

TEST(Microbatch, RejectsBatchedNodesReadingUpdatedParameters) {
  const char* text = R"(
graph @late(%x: f32[B, 3] input, %w: f32[3] param) {
  %s: f32[3] = aten::sum.dim_IntList(%x, [0]) {phase=bwd}
  %w_new: f32[3] = aten::sub.Tensor(%w, %s) {phase=update}
  %y: f32[B, 3] = aten::mul.Tensor(%x, %w_new) {phase=fwd}
  return %y
})";
  std::string msg = messageOf<UnsupportedOpError>([&] { microbatch(ir::parseGraph(text), opts(2, 4)); });
  EXPECT_HAS(msg, "node %y = aten::mul.Tensor reads batched data and %w_new");
}

TEST(Microbatch, RejectsSizesDerivedFromTheBatchLeavingTheMicrobatches) {
  const char* text = R"(
graph @size(%B: int input, %x: f32[B, 3] input) {
  %n: int = modelpar::sym_mul(%B, 3) {phase=fwd}
  return %n
})";
  std::string msg = messageOf<UnsupportedOpError>([&] { microbatch(ir::parseGraph(text), opts(2, 4)); });
  EXPECT_HAS(msg, "%n (int), computed from the batch size, is returned after the micro-batches");
}

// Note [Counted means]: a mean nll loss divides by the weight of the targets
// it counts (not ignore_index; class weights), so each micro-batch's loss and
// backward seed are weighted by its own count and the results divided by
// the total after the micro-batches.
constexpr const char* kCountedStep = R"(
graph @nll(%x: f32[B, 3] input, %t: i64[B] input, %w: f32[3, 3] param) {
  %h: f32[B, 3] = aten::mm(%x, %w) {layer="fc", phase=fwd}
  %loss: f32[], %tw: f32[] = aten::nll_loss_forward(%h, %t, None, 1, -100) {layer="loss", phase=fwd}
  %g: f32[] = aten::ones_like(%loss) {layer="loss", phase=bwd}
  %gh: f32[B, 3] = aten::nll_loss_backward(%g, %h, %t, None, 1, -100, %tw) {layer="loss", phase=bwd}
  %xt: f32[3, B] = aten::t(%x) {layer="fc", phase=bwd}
  %gw: f32[3, 3] = aten::mm(%xt, %gh) {layer="fc", phase=bwd}
  return %loss, %gw
})";

TEST(Microbatch, WeighsAMeanNllLossByEachMicrobatchsTargetCount) {
  ir::Graph split = microbatch(ir::parseGraph(kCountedStep), opts(2, 4));
  // Micro-batch k: its loss and its backward seed times its count T_k ...
  EXPECT_HAS(nodeText(split, "loss.mb1.counted"), "aten::mul.Tensor(%loss.mb1, %tw.mb1)");
  EXPECT_HAS(nodeText(split, "g.mb1.scaled"), "aten::mul.Tensor(%g.mb1, %tw.mb1)");
  // ... the counts summed, and the loss and the gradient divided by the sum.
  EXPECT_HAS(nodeText(split, "tw.total1"), "aten::add.Tensor(%tw.mb0, %tw.mb1)");
  EXPECT_HAS(nodeText(split, "loss"), "aten::div.Tensor(%loss.sum, %tw.total1)");
  EXPECT_HAS(nodeText(split, "gw"), "aten::div.Tensor(%gw.sum, %tw.total1)");
  EXPECT_NO_THROW(ir::verify(split));
  // Class weights only change what the count weighs: accepted the same way.
  std::string weighted = kCountedStep;
  weighted.replace(weighted.find("%w: f32[3, 3] param"), 19, "%w: f32[3, 3] param, %cw: f32[3] param");
  for (size_t at; (at = weighted.find("%t, None, 1")) != std::string::npos;) {
    weighted.replace(at, 11, "%t, %cw, 1");
  }
  EXPECT_HAS(nodeText(microbatch(ir::parseGraph(weighted), opts(2, 4)), "loss"),
             "aten::div.Tensor(%loss.sum, %tw.total1)");
}

TEST(Microbatch, RejectsClassWeightsInALossOfSeveralTerms) {
  // Two reducers: the terms would need weights of their own.
  const char* text = R"(
graph @nll(%x: f32[B, 3] input, %t: i64[B] input, %cw: f32[3] param) {
  %nll: f32[], %tw: f32[] = aten::nll_loss_forward(%x, %t, %cw, 1, -100) {layer="loss", phase=fwd}
  %reg: f32[] = aten::mean(%x) {layer="loss", phase=fwd}
  %loss: f32[] = aten::add.Tensor(%nll, %reg) {layer="loss", phase=fwd}
  return %loss
})";
  std::string msg = messageOf<UnsupportedOpError>([&] { microbatch(ir::parseGraph(text), opts(2, 4)); });
  EXPECT_HAS(msg, "averages with class weights");
  // Without class weights both terms are means over the batch, weighted b_k / B.
  std::string plain = text;
  plain.replace(plain.find("%cw, 1"), 6, "None, 1");
  EXPECT_HAS(nodeText(microbatch(ir::parseGraph(plain), opts(2, 4)), "loss"), "alpha=0.5");
}

// The GPU attention kernels return their dropout RNG state (philox seed and
// offset) as int64 tensors without a batch dimension: not a reduction over
// the batch (seen on the first GPU run with efficient attention). A float
// output without a batch dimension still is.
// Note [Row-group offsets]: a mixture-of-experts layer counts its sorted
// rows per expert over the batch (histc, cumsum) only to tell a grouped
// matmul where each expert's rows end; per micro-batch that is exact.
constexpr const char* kMoe = R"(
graph @moe(%x: f32[B, 4] input, %e: f32[B] input, %w: f32[2, 4, 3] param) {
  %se: f32[B], %perm: i64[B] = aten::sort(%e) {layer="moe", phase=fwd}
  %xs: f32[B, 4] = aten::index.Tensor(%x, [%perm]) {layer="moe", phase=fwd}
  %counts: f32[2] = aten::histc(%se, 2, 0, 1) {layer="moe", phase=fwd}
  %offs: i32[2] = aten::cumsum(%counts, 0, dtype=dtype.i32) {layer="moe", phase=fwd}
  %y: f32[B, 3] = aten::_grouped_mm(%xs, %w, %offs) {layer="moe", phase=fwd}
  %loss: f32[] = aten::sum(%y) {layer="loss", phase=fwd}
  return %loss
})";

TEST(Microbatch, AcceptsExpertCountsThatOnlyGroupTheRowsOfAGroupedMatmul) {
  ir::Graph split = microbatch(ir::parseGraph(kMoe), opts(2, 4));
  // Each micro-batch counts and groups its own rows.
  EXPECT_EQ(typeOf(split, "counts.mb1"), "f32[2]");
  EXPECT_HAS(nodeText(split, "y.mb1"), "aten::_grouped_mm(%xs.mb1, %w, %offs.mb1)");
}

TEST(Microbatch, RefusesExpertCountsReadAsData) {
  std::string mixed = kMoe;
  mixed.replace(mixed.find("  %loss: f32[] = aten::sum(%y)"), 0,
                "  %z: f32[B, 3] = aten::add.Tensor(%y, %offs) {layer=\"moe\", phase=fwd}\n");
  mixed.replace(mixed.find("aten::sum(%y)"), 13, "aten::sum(%z)");
  EXPECT_HAS(messageOf<UnsupportedOpError>([&] { microbatch(ir::parseGraph(mixed), opts(2, 4)); }),
             "%counts = aten::histc reduces over the batch");
  std::string returned = kMoe;
  returned.replace(returned.find("return %loss"), 12, "return %loss, %counts");
  EXPECT_HAS(messageOf<UnsupportedOpError>([&] { microbatch(ir::parseGraph(returned), opts(2, 4)); }),
             "%counts");
}

TEST(Microbatch, AcceptsTheRngStateOfGpuAttention) {
  const char* text = R"(
graph @attn(%q: f32[B, 2, 4, 8] input, %k: f32[B, 2, 4, 8] input, %v: f32[B, 2, 4, 8] input) {
  %o: f32[B, 2, 4, 8], %lse: f32[B, 2, 32], %seed: i64[], %off: i64[] = aten::_scaled_dot_product_efficient_attention(%q, %k, %v, None, true) {layer="attn", phase=fwd}
  %loss: f32[] = aten::sum(%o) {layer="loss", phase=fwd}
  return %loss
})";
  EXPECT_NO_THROW(microbatch(ir::parseGraph(text), opts(2, 4)));
  std::string reduced = text;
  reduced.replace(reduced.find("%off: i64[]"), 11, "%off: f32[]");
  std::string msg = messageOf<UnsupportedOpError>([&] { microbatch(ir::parseGraph(reduced), opts(2, 4)); });
  EXPECT_HAS(msg, "%off = aten::_scaled_dot_product_efficient_attention reduces over the batch");
}

}  // namespace
}  // namespace modelpar::passes
