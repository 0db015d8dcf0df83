// Pass `cost`: roofline formulas per op family, profiled costs kept,
// defaults, persistent bytes of parameters, symbolic sizes, errors.
#include "passes/cost/cost_model.h"

#include <gtest/gtest.h>

#include <cmath>

#include "ir/error.h"
#include "ir/parser.h"

namespace modelpar::passes {
namespace {

// 1e9 FLOP/s = 1e3 FLOP/us; 1e10 B/s = 1e4 B/us; 5 us per launch.
DeviceModel slowMachine() {
  DeviceSpec d;
  d.peak_flops = 1e9;
  d.memory_bandwidth = 1e10;
  d.launch_overhead_us = 5.0;
  return DeviceModel::uniform(1, d);
}

constexpr const char* kMlp = R"(
graph @mlp(%x: f32[B, 64] input, %w: f32[128, 64] param, %b: f32[128] param) {
  %y: f32[B, 128] = aten::linear(%x, %w, %b)
  %r: f32[B, 128] = aten::relu(%y)
  %v: f32[4096] = aten::view(%r, [4096])
  %s: f32[] = aten::sum(%v)
  %q: f32[B, 128] = aten::gelu(%r) {cost={time_us=7.0, out=1, temp=2, persist=3}}
  %z: f32[B, 128] = mylib::fancy(%q)
  %a: f32[B, 128] = aten::add_.Tensor(%z, %r)
  return %s, %a
}
)";

TEST(CostModel, FillsEveryFamilyByHandComputedRoofline) {
  ir::Graph g = ir::parseGraph(kMlp);
  CostOptions o;
  o.symbol_sizes["B"] = 32;
  o.count_gradients = true;
  o.optimizer_state_factor = 2.0;
  CostStats st = estimateCosts(g, slowMachine(), o);
  EXPECT_EQ(st.profiled, 1);
  EXPECT_EQ(st.analytic, 5);
  EXPECT_EQ(st.defaulted, 1);
  auto cost = [&](const char* v) { return *g.node(g.value(*g.findValue(v)).producer).cost; };
  // linear: 2*32*128*64 = 524288 FLOP -> 524.288 us; bytes (8192 + 32768 + 512 + 16384) /
  // 1e4 = 5.79 us: compute-bound, + 5 us launch. Persistent: (32768 + 512) * (1 + 1 + 2).
  EXPECT_DOUBLE_EQ(cost("y").time_us, 524.288 + 5.0);
  EXPECT_EQ(cost("y").output_bytes, 16384);
  EXPECT_EQ(cost("y").persistent_bytes, 4 * (32768 + 512));
  // relu: 4096 FLOP -> 4.096 us vs 32768 B -> 3.2768 us.
  EXPECT_DOUBLE_EQ(cost("r").time_us, 4.096 + 5.0);
  // view: no bytes moved, no allocation: launch overhead only.
  EXPECT_DOUBLE_EQ(cost("v").time_us, 5.0);
  EXPECT_EQ(cost("v").output_bytes, 0);
  // sum: 4096 FLOP -> 4.096 us vs 16388 B -> 1.6388 us.
  EXPECT_DOUBLE_EQ(cost("s").time_us, 4.096 + 5.0);
  EXPECT_EQ(cost("s").output_bytes, 4);
  // profiled: kept as is.
  EXPECT_EQ(cost("q"), (ir::Cost{7.0, 1, 2, 3}));
  // unknown op: memory-bound default, (16384 + 16384) / 1e4 = 3.2768 us.
  EXPECT_DOUBLE_EQ(cost("z").time_us, 3.2768 + 5.0);
  // in-place add: writes into %z, allocates nothing.
  EXPECT_EQ(cost("a").output_bytes, 0);
}

TEST(CostModel, MatmulConvolutionAttentionFlops) {
  ir::Graph g = ir::parseGraph(R"(
graph @f(%a: f32[8, 16, 32] input, %b: f32[8, 32, 4] input, %m: f32[16, 32] input,
         %n: f32[32, 4] input, %c: f32[16, 4] input, %img: f32[8, 3, 32, 32] input,
         %k: f32[16, 3, 3, 3] input, %q: f32[2, 4, 128, 64] input,
         %kk: f32[2, 4, 256, 64] input, %vv: f32[2, 4, 256, 32] input) {
  %bmm: f32[8, 16, 4] = aten::bmm(%a, %b)
  %addmm: f32[16, 4] = aten::addmm(%c, %m, %n)
  %conv: f32[8, 16, 32, 32] = aten::convolution(%img, %k, None, [1, 1], [1, 1], [1, 1], false, [0, 0], 1)
  %att: f32[2, 4, 128, 32] = aten::scaled_dot_product_attention(%q, %kk, %vv)
  return %bmm, %addmm, %conv, %att
}
)");
  DeviceSpec d;
  auto flops = [&](const char* v) {
    return estimateNodeCost(g, g.value(*g.findValue(v)).producer, d).flops;
  };
  EXPECT_DOUBLE_EQ(flops("bmm"), 2.0 * 8 * 16 * 4 * 32);
  EXPECT_DOUBLE_EQ(flops("addmm"), 2.0 * 16 * 4 * 32 + 16 * 4);
  EXPECT_DOUBLE_EQ(flops("conv"), 2.0 * (8 * 16 * 32 * 32) * (3 * 3 * 3));
  EXPECT_DOUBLE_EQ(flops("att"), 2.0 * 8 * 128 * 256 * (64 + 32));
  EXPECT_EQ(estimateNodeCost(g, 2, d).family, OpFamily::Convolution);
}

TEST(CostModel, ChargesEachParameterToItsFirstUserOnly) {
  ir::Graph g = ir::parseGraph(R"(
graph @shared(%x: f32[4] input, %w: f32[4] param, %rm: f32[4] buffer) {
  %a: f32[4] = aten::mul.Tensor(%x, %w)
  %b: f32[4] = aten::mul.Tensor(%a, %w)
  %c: f32[4] = aten::add.Tensor(%b, %rm)
  return %c
}
)");
  CostOptions o;
  o.optimizer_state_factor = 1.0;  // momentum
  estimateCosts(g, slowMachine(), o);
  EXPECT_EQ(g.node(0).cost->persistent_bytes, 32);  // 16 B weight + 16 B momentum
  EXPECT_EQ(g.node(1).cost->persistent_bytes, 0);
  EXPECT_EQ(g.node(2).cost->persistent_bytes, 16);  // buffers carry no optimizer state
}

TEST(CostModel, AppliesAProfileWithAnalyticBytesAndKeepsIt) {
  ir::Graph g = ir::parseGraph(R"(
graph @shared(%x: f32[4] input, %w: f32[4] param) {
  %a: f32[4] = aten::mul.Tensor(%x, %w)
  %b: f32[4] = aten::relu(%a) {cost={time_us=9.0, out=100, temp=2, persist=3}}
  %c: f32[4] = aten::relu(%b)
  return %c
}
)");
  applyProfile(g, {12.5, 4.0, -1.0}, slowMachine());
  // %a: measured time, the analytic 16 B output and the weight's 16 B.
  EXPECT_EQ(*g.node(0).cost, (ir::Cost{12.5, 16, 0, 16}));
  // %b kept its bytes, took the measured time; %c (negative) is unprofiled.
  EXPECT_EQ(*g.node(1).cost, (ir::Cost{4.0, 100, 2, 3}));
  EXPECT_FALSE(g.node(2).cost.has_value());
  CostStats st = estimateCosts(g, slowMachine());
  EXPECT_EQ(st.profiled, 2);
  EXPECT_EQ(st.analytic, 1);
  EXPECT_DOUBLE_EQ(g.node(0).cost->time_us, 12.5);
  // One time per node, finite, or nothing is written.
  ir::Graph before = g;
  EXPECT_THROW(applyProfile(g, {1.0, 2.0}, slowMachine()), ConfigError);
  EXPECT_THROW(applyProfile(g, {1.0, 2.0, std::nan("")}, slowMachine()), ConfigError);
  EXPECT_TRUE(g == before);
}

TEST(CostModel, LeavesTheGraphUntouchedWhenItThrows) {
  ir::Graph g = ir::parseGraph(kMlp);
  ir::Graph before = g;
  CostOptions o;
  o.reference_device = 3;
  try {
    estimateCosts(g, slowMachine(), o);
    FAIL();
  } catch (const ConfigError& e) {
    EXPECT_NE(std::string(e.what()).find("reference device 3"), std::string::npos) << e.what();
  }
  o.reference_device = 0;
  o.optimizer_state_factor = -1;
  EXPECT_THROW(estimateCosts(g, slowMachine(), o), ConfigError);
  EXPECT_TRUE(g == before);
}

TEST(OpFamily, ClassifiesByName) {
  EXPECT_EQ(classifyOp("aten::addmm"), OpFamily::MatMul);
  EXPECT_EQ(classifyOp("aten::_scaled_dot_product_flash_attention"), OpFamily::Attention);
  EXPECT_EQ(classifyOp("aten::native_layer_norm"), OpFamily::Reduction);
  EXPECT_EQ(classifyOp("aten::mul_"), OpFamily::Elementwise);
  EXPECT_EQ(classifyOp("aten::copy_"), OpFamily::Copy);
  EXPECT_EQ(classifyOp("aten::transpose"), OpFamily::View);
  EXPECT_EQ(classifyOp("aten::_foreach_add_"), OpFamily::Elementwise);
  EXPECT_EQ(classifyOp("mylib::fancy"), OpFamily::Other);
  EXPECT_TRUE(isInPlaceOp("aten::add_"));
  EXPECT_TRUE(isInPlaceOp("aten::__iand__"));
  EXPECT_FALSE(isInPlaceOp("aten::__and__"));
  EXPECT_FALSE(isInPlaceOp("aten::add"));
}

// Note [Reduced losses keep their element-wise buffer]: mse_loss,
// smooth_l1_loss and binary_cross_entropy reduced (mean by default, or sum)
// hold their input's bytes; unreduced, other losses and received copies
// (denseBytes) their own.
TEST(OpFamily, ReducedLossesHoldTheirInputsBytes) {
  ir::Graph g = ir::parseGraph(R"(
    graph @losses(%p: f32[8, 4] input, %y: f32[8, 4] input) {
      %mean: f32[] = aten::mse_loss(%p, %y, 1)
      %dflt: f32[] = aten::mse_loss(%p, %y)
      %sum: f32[] = aten::smooth_l1_loss(%p, %y, reduction=2, beta=1.0)
      %none: f32[8, 4] = aten::mse_loss(%p, %y, 0)
      %bce: f32[] = aten::binary_cross_entropy(%p, %y, None, 1)
      %l1: f32[] = aten::l1_loss(%p, %y, 1)
      return %mean, %dflt, %sum, %none, %bce, %l1
    })");
  auto bytes = [&](ir::ValueId v) { return storageBytes(g, v); };
  const std::vector<ir::ValueId>& out = g.outputs();
  EXPECT_EQ(bytes(out[0]), 128);  // f32[8, 4]
  EXPECT_EQ(bytes(out[1]), 128);
  EXPECT_EQ(bytes(out[2]), 128);
  EXPECT_EQ(bytes(out[3]), 128);  // unreduced: the output is the buffer
  EXPECT_EQ(bytes(out[4]), 128);
  EXPECT_EQ(bytes(out[5]), 4);    // l1_loss returns a fresh scalar
  EXPECT_EQ(allocBytes(g, out[0]), 128);
  EXPECT_EQ(denseBytes(g, out[0]), 4);  // what a received copy takes
  EXPECT_EQ(storageBytes(g, g.inputs()[0].value), 128);
}

}  // namespace
}  // namespace modelpar::passes
