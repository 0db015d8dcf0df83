// Pass `fuse-accumulation`: which sums of products become addmm, with which
// operands, and which are left alone (the golden file
// fuse_accumulation_linear.txt shows it on a micro-batched Linear step; the
// values are checked against ATen in tests/python/test_fuse_accumulation.py).
#include "passes/pipeline/fuse_accumulation.h"

#include <gtest/gtest.h>

#include <string>

#include "ir/parser.h"
#include "ir/printer.h"
#include "ir/verifier.h"

namespace modelpar::passes {
namespace {

// One add of %acc and a product of %a [2, 3] and %b [3, 4], `body` between.
std::string sumOf(const std::string& body, const std::string& ret = "%s") {
  return "graph @g(%acc: f32[2, 4] input, %a: f32[2, 3] input, %b: f32[3, 4] input,\n"
         "         %d: f32[2, 4] input) {\n" +
         body + "  return " + ret + "\n}\n";
}

// The printed node that defines `value` ("" when none does).
std::string defining(const ir::Graph& g, const std::string& value) {
  for (size_t n = 0; n < g.numNodes(); ++n) {
    const ir::Node& nd = g.node(static_cast<ir::NodeId>(n));
    if (!nd.outputs.empty() && g.value(nd.outputs[0]).name == value) {
      return ir::printNode(g, static_cast<ir::NodeId>(n));
    }
  }
  return "";
}

FusedAccumulation fuse(const std::string& text) {
  ir::Graph g = ir::parseGraph(text);
  FusedAccumulation f = fuseAccumulation(g);
  ir::verify(f.graph);
  return f;
}

TEST(FuseAccumulation, AProductThroughAnEvenChainOfTransposesBecomesAddmm) {
  FusedAccumulation f = fuse(sumOf(
      "  %m: f32[2, 4] = aten::mm(%a, %b) {layer=\"fc\", phase=bwd, mb=1, "
      "cost={time_us=5.0, out=32, temp=0, persist=0}}\n"
      "  %t1: f32[4, 2] = aten::t(%m) {layer=\"fc\", phase=bwd, mb=1}\n"
      "  %t2: f32[2, 4] = aten::t(%t1) {layer=\"fc\", phase=bwd, mb=1}\n"
      "  %s: f32[2, 4] = aten::add.Tensor(%acc, %t2) {layer=\"fc\", phase=bwd, mb=1, "
      "cost={time_us=2.0, out=32, temp=0, persist=0}}\n"));
  EXPECT_EQ(f.num_fused, 1);
  EXPECT_EQ(f.graph.numNodes(), 1u);
  EXPECT_EQ(defining(f.graph, "s"),
            "%s: f32[2, 4] = aten::addmm(%acc, %a, %b) {layer=\"fc\", phase=bwd, mb=1, "
            "cost={time_us=7.0, out=32, temp=0, persist=0}}");
}

TEST(FuseAccumulation, AnOddChainMultipliesTheTransposesInTheOtherOrder) {
  // t(p @ q) = t(q) @ t(p); the product is the add's first operand here.
  FusedAccumulation f = fuse(
      "graph @g(%acc: f32[2, 4] input, %p: f32[4, 3] input, %q: f32[3, 2] input) {\n"
      "  %m: f32[4, 2] = aten::mm(%p, %q) {layer=\"fc\", phase=bwd, mb=3}\n"
      "  %mt: f32[2, 4] = aten::t(%m) {layer=\"fc\", phase=bwd, mb=3}\n"
      "  %s: f32[2, 4] = aten::add.Tensor(%mt, %acc) {layer=\"fc\", phase=bwd, mb=3}\n"
      "  return %s\n}\n");
  EXPECT_EQ(f.num_fused, 1);
  EXPECT_EQ(defining(f.graph, "q.t"), "%q.t: f32[2, 3] = aten::t(%q) {layer=\"fc\", phase=bwd, mb=3}");
  EXPECT_EQ(defining(f.graph, "p.t"), "%p.t: f32[3, 4] = aten::t(%p) {layer=\"fc\", phase=bwd, mb=3}");
  EXPECT_EQ(defining(f.graph, "s"),
            "%s: f32[2, 4] = aten::addmm(%acc, %q.t, %p.t) {layer=\"fc\", phase=bwd, mb=3}");
  EXPECT_EQ(defining(f.graph, "m"), "");
}

TEST(FuseAccumulation, LeavesAloneWhatIsNotASumOfAProductReadOnce) {
  const std::string mm = "  %m: f32[2, 4] = aten::mm(%a, %b)\n";
  const struct {
    const char* why;
    std::string text;
  } cases[] = {
      {"the product is read again", sumOf(mm +
           "  %s: f32[2, 4] = aten::add.Tensor(%acc, %m)\n"
           "  %u: f32[2, 4] = aten::relu(%m)\n", "%s, %u")},
      {"the product is a graph output", sumOf(mm +
           "  %s: f32[2, 4] = aten::add.Tensor(%acc, %m)\n", "%s, %m")},
      {"a transpose between is read again", sumOf(mm +
           "  %t1: f32[4, 2] = aten::t(%m)\n"
           "  %t2: f32[2, 4] = aten::t(%t1)\n"
           "  %s: f32[2, 4] = aten::add.Tensor(%acc, %t2)\n"
           "  %u: f32[4, 2] = aten::relu(%t1)\n", "%s, %u")},
      {"alpha scales the product", sumOf(mm +
           "  %s: f32[2, 4] = aten::add.Tensor(%acc, %m, alpha=2)\n")},
      {"the sum broadcasts", "graph @g(%acc: f32[4] input, %a: f32[2, 3] input, %b: f32[3, 4] input) {\n" +
           mm + "  %s: f32[2, 4] = aten::add.Tensor(%acc, %m)\n  return %s\n}\n"},
      {"the sum promotes", "graph @g(%acc: f64[2, 4] input, %a: f32[2, 3] input, %b: f32[3, 4] input) {\n" +
           mm + "  %s: f64[2, 4] = aten::add.Tensor(%acc, %m)\n  return %s\n}\n"},
      {"not a product", sumOf("  %s: f32[2, 4] = aten::add.Tensor(%acc, %d)\n")},
  };
  for (const auto& c : cases) {
    ir::Graph g = ir::parseGraph(c.text);
    FusedAccumulation f = fuseAccumulation(g);
    EXPECT_EQ(f.num_fused, 0) << c.why;
    EXPECT_EQ(ir::print(f.graph), ir::print(g)) << c.why;
  }
}

}  // namespace
}  // namespace modelpar::passes
