// The backward split (passes/pipeline/backward_split.h, Note [Backward
// split]) on small real graphs: a two-layer step as AOTAutograd writes it,
// micro-batched and its gradient sums fused, cut into two stages; expected
// split written out golden-style, every backward node of the step with its
// part.
#include "passes/pipeline/backward_split.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <map>
#include <string>
#include <vector>

#include "ir/error.h"
#include "ir/parser.h"
#include "passes/pipeline/fuse_accumulation.h"
#include "passes/pipeline/microbatch.h"
#include "tests/support/expect_error.h"

namespace modelpar::passes {
namespace {

using modelpar::testing::messageOf;

// fc1 (stage 0): h = relu(x·w1ᵀ); fc2 and the loss (stage 1):
// r = relu(h·w2ᵀ + b2), loss = mse(r, y). fc2's dp = threshold_backward(dr)
// is read by both the input gradient dh = dp·w2 (sent to stage 0) and the
// weight gradients dw2 = dpᵀ·h and db2 = sum(dp): the shared node.
//
//        stage 0               |            stage 1
//   x -> mm -> relu -> h ------+--> addmm -> relu -> mse_loss
//                              |
//   dw1 <- mm(da1ᵀ, x)         |   dw2 <- mm(dpᵀ, h)    db2 <- sum(dp)
//   da1 <- threshold_bwd(dh) <-+-- dh <- mm(dp, w2)  dp <- threshold_bwd(dr)
constexpr const char* kTwoLinear = R"(
graph @two_linear(
    %w1: f32[4, 5] param,
    %w2: f32[3, 4] param,
    %b2: f32[3] param,
    %x: f32[B, 5] input,
    %y: f32[B, 3] input) {
  %w1t: f32[5, 4] = aten::t(%w1) {layer="fc1", phase=fwd}
  %a1: f32[B, 4] = aten::mm(%x, %w1t) {layer="fc1", phase=fwd}
  %h: f32[B, 4] = aten::relu(%a1) {layer="fc1", phase=fwd}
  %w2t: f32[4, 3] = aten::t(%w2) {layer="fc2", phase=fwd}
  %p: f32[B, 3] = aten::addmm(%b2, %h, %w2t) {layer="fc2", phase=fwd}
  %r: f32[B, 3] = aten::relu(%p) {layer="fc2", phase=fwd}
  %loss: f32[] = aten::mse_loss(%r, %y, 1) {layer="loss", phase=fwd}
  %g: f32[] = aten::ones_like(%loss) {layer="loss", phase=bwd}
  %dr: f32[B, 3] = aten::mse_loss_backward(%g, %r, %y, 1) {layer="loss", phase=bwd}
  %dp: f32[B, 3] = aten::threshold_backward(%dr, %r, 0) {layer="fc2", phase=bwd}
  %dh: f32[B, 4] = aten::mm(%dp, %w2) {layer="fc2", phase=bwd}
  %dpt: f32[3, B] = aten::t(%dp) {layer="fc2", phase=bwd}
  %dw2: f32[3, 4] = aten::mm(%dpt, %h) {layer="fc2", phase=bwd}
  %s2: f32[1, 3] = aten::sum.dim_IntList(%dp, [0], true) {layer="fc2", phase=bwd}
  %db2: f32[3] = aten::view(%s2, [3]) {layer="fc2", phase=bwd}
  %da1: f32[B, 4] = aten::threshold_backward(%dh, %h, 0) {layer="fc1", phase=bwd}
  %da1t: f32[4, B] = aten::t(%da1) {layer="fc1", phase=bwd}
  %dw1: f32[4, 5] = aten::mm(%da1t, %x) {layer="fc1", phase=bwd}
  return %loss, %dw1, %dw2, %db2
}
)";

struct Split {
  ir::Graph g{"split"};
  std::vector<int32_t> stage;
  BackwardSplit split;
};

// Micro-batched (m = 2, batch 4), gradient sums fused, fc1 on stage 0 and
// the rest on stage 1, split.
Split twoLinearSplit() {
  MicrobatchOptions mo;
  mo.microbatches = 2;
  mo.batch_size = 4;
  Split s;
  s.g = fuseAccumulation(microbatch(ir::parseGraph(kTwoLinear), mo)).graph;
  for (const ir::Node& n : s.g.nodes()) s.stage.push_back(n.layer == "fc1" ? 0 : 1);
  s.split = splitBackward(s.g, s.stage);
  return s;
}

// "<stage> <node> <B|W>" per node of a backward task, in graph order.
std::string splitText(const Split& s) {
  std::string out;
  for (size_t i = 0; i < s.g.numNodes(); ++i) {
    const BackwardPart part = s.split.part[i];
    if (part == BackwardPart::None) continue;
    out += std::to_string(s.stage[i]) + " " + s.g.nodeRef(static_cast<ir::NodeId>(i)) + " " +
           (part == BackwardPart::B ? "B" : "W") + "\n";
  }
  return out;
}

// Stage 1's B is the loss gradient, fc2's activation derivative dp (read by
// B and W: computed once, in B) and the input gradient dh sent to stage 0;
// its W the weight gradient mm, the bias sum and, in micro-batch 1, the sums
// over micro-batches (addmm(acc, ..), add). Stage 0 sends nothing back: all
// W.
TEST(BackwardSplit, LinearLayersInputGradientInBWeightGradientsAndSumsInW) {
  const Split s = twoLinearSplit();
  // %dw2 = addmm(%dw2.mb0, %dpt.mb1, %h.mb1) and %dw1 alike (fused sums),
  // %db2 = add(%db2.mb0, %db2.mb1): the sums, in micro-batch 1's W.
  EXPECT_EQ(splitText(s), R"(1 %g.mb0 B
1 %g.mb0.scaled B
1 %dr.mb0 B
1 %dp.mb0 B
1 %dh.mb0 B
1 %dpt.mb0 W
1 %dw2.mb0 W
1 %s2.mb0 W
1 %db2.mb0 W
0 %da1.mb0 W
0 %da1t.mb0 W
0 %dw1.mb0 W
1 %g.mb1 B
1 %g.mb1.scaled B
1 %dr.mb1 B
1 %dp.mb1 B
1 %dh.mb1 B
1 %dpt.mb1 W
1 %dw2 W
1 %s2.mb1 W
1 %db2.mb1 W
1 %db2 W
0 %da1.mb1 W
0 %da1t.mb1 W
0 %dw1 W
)");
  EXPECT_EQ(s.split.num_b, 10);
  EXPECT_EQ(s.split.num_w, 15);
  EXPECT_EQ(s.split.num_b + s.split.num_w,
            static_cast<int64_t>(std::count_if(s.split.part.begin(), s.split.part.end(),
                                               [](BackwardPart p) { return p != BackwardPart::None; })));
}

// B is closed under "read by": no B node reads a W node of its own task, so
// W can wait without holding B back, and each node is in one part only.
TEST(BackwardSplit, NoBNodeReadsAWNodeOfItsTask) {
  const Split s = twoLinearSplit();
  for (size_t i = 0; i < s.g.numNodes(); ++i) {
    if (s.split.part[i] != BackwardPart::B) continue;
    for (ir::ValueId v : s.g.nodes()[i].inputs()) {
      const ir::NodeId u = s.g.value(v).producer;
      if (u == ir::kNoId) continue;
      const auto ui = static_cast<size_t>(u);
      const bool same_task = s.stage[ui] == s.stage[i] &&
                             s.g.nodes()[ui].microbatch == s.g.nodes()[i].microbatch;
      EXPECT_FALSE(same_task && s.split.part[ui] == BackwardPart::W)
          << s.g.nodeRef(static_cast<ir::NodeId>(i)) << " reads " << s.g.nodeRef(u);
    }
  }
}

// One stage: nothing is sent anywhere, every backward node is W.
TEST(BackwardSplit, OneStageIsAllW) {
  Split s = twoLinearSplit();
  s.stage.assign(s.g.numNodes(), 0);
  const BackwardSplit one = splitBackward(s.g, s.stage);
  EXPECT_EQ(one.num_b, 0);
  EXPECT_EQ(one.num_w, s.split.num_b + s.split.num_w);
}

TEST(BackwardSplit, RefusesAStageListOfAnotherSize) {
  const Split s = twoLinearSplit();
  const std::vector<int32_t> short_list(3, 0);
  EXPECT_HAS(messageOf<ConfigError>([&] { splitBackward(s.g, short_list); }),
             "stage_of_node has 3 entries");
}

}  // namespace
}  // namespace modelpar::passes
