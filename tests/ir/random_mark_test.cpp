// The `random` mark of a node (ir::Node::random, text `random=true`): set by
// the importers from the schema's nondeterministic_seeded tag, it makes a
// node random whatever its op's name (isRandom), and round-trips through the
// text.
#include <gtest/gtest.h>

#include "ir/error.h"
#include "ir/parser.h"
#include "ir/printer.h"
#include "ir/random_ops.h"

namespace modelpar::ir {
namespace {

Graph markedGraph() {
  return parseGraph(R"(
graph @g(%x: f32[4] input) {
  %y: f32[4] = mylib::sample(%x) {layer="s", phase=fwd, random=true}
  %z: f32[4] = aten::exp(%y) {phase=fwd}
  return %z
})");
}

TEST(RandomMark, ANodeMarkedRandomIsRandomWhateverItsName) {
  const Graph g = markedGraph();
  EXPECT_TRUE(g.node(0).random);
  EXPECT_TRUE(isRandom(g.node(0)));   // unknown name, marked
  EXPECT_FALSE(isRandom(g.node(1)));  // aten::exp, unmarked
  Node dropout = g.node(1);
  dropout.op = "aten::native_dropout";
  EXPECT_TRUE(isRandom(dropout));  // by name, unmarked
}

TEST(RandomMark, TheMarkRoundTripsThroughTheText) {
  const Graph g = markedGraph();
  const std::string text = print(g);
  EXPECT_NE(text.find("mylib::sample(%x) {layer=\"s\", phase=fwd, random=true}"), std::string::npos)
      << text;
  EXPECT_EQ(text.find("aten::exp(%y) {phase=fwd, random"), std::string::npos) << text;
  EXPECT_EQ(parseGraph(text), g);
}

TEST(RandomMark, TheMarkTakesOnlyTrue) {
  try {
    parseGraph("graph @g(%x: f32[4] input) {\n  %y: f32[4] = mylib::s(%x) {random=false}\n  return %y\n}");
    FAIL() << "random=false parsed";
  } catch (const ParseError& e) {
    EXPECT_NE(std::string(e.what()).find("random=true"), std::string::npos) << e.what();
  }
}

}  // namespace
}  // namespace modelpar::ir
