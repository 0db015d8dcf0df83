// Graphviz export: structure of the DOT text for graphs and programs.
#include "ir/dot.h"

#include <gtest/gtest.h>

#include "ir/parser.h"

namespace modelpar::ir {
namespace {

bool contains(const std::string& s, std::string_view part) {
  return s.find(part) != std::string::npos;
}

size_t count(const std::string& s, std::string_view part) {
  size_t n = 0;
  for (size_t at = s.find(part); at != std::string::npos; at = s.find(part, at + 1)) ++n;
  return n;
}

//   %x   %w
//    |  /  \
//   %h /    |
//    \/     |
//    %y ----+--> return
//         ^l (reads %w)
constexpr std::string_view kGraph = R"(
graph @g(%x: f32[4, 8] input {device=0}, %w: f32[8, 8] param {device=1}) {
  %h: f32[4, 8] = aten::relu(%x) {layer="act", device=0}
  %y: f32[4, 8] = aten::mm(%h, %w) {device=1}
  ^l = aten::print(%w)
  return %y
}
)";

TEST(DotGraph, WritesDigraphWithOneBoxPerNodeAndEllipsePerInput) {
  std::string dot = toDot(parseGraph(kGraph));
  EXPECT_EQ(dot.rfind("digraph \"g\" {\n", 0), 0u) << dot;
  EXPECT_EQ(dot.substr(dot.size() - 2), "}\n");
  EXPECT_EQ(count(dot, "shape=box"), 3u);
  EXPECT_EQ(count(dot, "shape=ellipse"), 2u);
  EXPECT_TRUE(contains(dot, "n0 [label=\"%h\\naten::relu\\nact\\ndevice 0\", shape=box")) << dot;
  EXPECT_TRUE(contains(dot, "n2 [label=\"^l\\naten::print\", shape=box];")) << dot;
  EXPECT_TRUE(contains(dot, "v1 [label=\"%w\\nf32[8, 8]\\nparam\\ndevice 1\", shape=ellipse"));
}

TEST(DotGraph, DrawsOneEdgePerValueUseLabelledWithItsType) {
  std::string dot = toDot(parseGraph(kGraph));
  EXPECT_TRUE(contains(dot, "v0 -> n0 [label=\"f32[4, 8]\"];")) << dot;
  EXPECT_TRUE(contains(dot, "n0 -> n1 [label=\"f32[4, 8]\"];"));
  EXPECT_TRUE(contains(dot, "v1 -> n1 [label=\"f32[8, 8]\"];"));
  EXPECT_TRUE(contains(dot, "v1 -> n2 [label=\"f32[8, 8]\"];"));
  // 4 uses + 1 output edge.
  EXPECT_EQ(count(dot, " -> "), 5u);
}

TEST(DotGraph, DrawsOutputsAsDoubleCircles) {
  std::string dot = toDot(parseGraph(kGraph));
  EXPECT_TRUE(contains(dot, "out0 [label=\"%y\", shape=doublecircle];")) << dot;
  EXPECT_TRUE(contains(dot, "n1 -> out0"));
}

TEST(DotGraph, ColoursNodesByDeviceOnlyWhenSet) {
  std::string dot = toDot(parseGraph(kGraph));
  // %x and %h on device 0 share a colour; %w and %y on device 1 share another.
  EXPECT_EQ(count(dot, "fillcolor="), 4u);
  EXPECT_EQ(count(dot, "fillcolor=\"#a6cee3\""), 2u);
  EXPECT_EQ(count(dot, "fillcolor=\"#b2df8a\""), 2u);
}

TEST(DotGraph, EscapesQuotesAndBackslashesInLabels) {
  Graph g = parseGraph(
      "graph @g(%x: f32[2] input) {\n"
      "  %y: f32[2] = aten::neg(%x) {layer=\"say \\\"hi\\\" \\\\ bye\\nnext\"}\n"
      "  return %y\n}\n");
  std::string dot = toDot(g);
  EXPECT_TRUE(contains(dot, "say \\\"hi\\\" \\\\ bye\\nnext")) << dot;
  EXPECT_FALSE(contains(dot, "say \"hi")) << dot;
}

constexpr std::string_view kProgram = R"(program devices=3
graph @step(%x: f32[4] input {device=0}) {
  %h: f32[4] = aten::relu(%x) {device=0}
  %y: f32[4] = aten::neg(%h) {device=1}
  return %y
}
device 0 {
  run %h
  send %h -> 1
  free %h
}
device 1 {
  recv %h <- 0
  run %y
}
device 2 {
}
)";

TEST(DotProgram, WritesOneClusterPerDeviceIncludingEmptyOnes) {
  std::string dot = toDot(parseProgram(kProgram));
  EXPECT_EQ(dot.rfind("digraph \"step\" {\n", 0), 0u) << dot;
  EXPECT_EQ(count(dot, "subgraph cluster_d"), 3u);
  EXPECT_TRUE(contains(dot, "subgraph cluster_d2 {\n    label=\"device 2\";")) << dot;
}

TEST(DotProgram, ListsInstructionsInOrderInsideTheirCluster) {
  std::string dot = toDot(parseProgram(kProgram));
  EXPECT_TRUE(contains(dot, "d0_i0 [label=\"run %h\"];")) << dot;
  EXPECT_TRUE(contains(dot, "d0_i1 [label=\"send %h -> 1\"];"));
  EXPECT_TRUE(contains(dot, "d0_i2 [label=\"free %h\"];"));
  EXPECT_TRUE(contains(dot, "d1_i0 [label=\"recv %h <- 0\"];"));
  EXPECT_TRUE(contains(dot, "d0_i0 -> d0_i1;"));
  EXPECT_TRUE(contains(dot, "d0_i1 -> d0_i2;"));
  EXPECT_TRUE(contains(dot, "d1_i0 -> d1_i1;"));
  EXPECT_LT(dot.find("d0_i0 ["), dot.find("subgraph cluster_d1"));
}

TEST(DotProgram, DrawsDashedEdgeFromEachSendToItsReceive) {
  std::string dot = toDot(parseProgram(kProgram));
  EXPECT_TRUE(contains(dot, "d0_i1 -> d1_i0 [style=dashed")) << dot;
  EXPECT_EQ(count(dot, "style=dashed"), 1u);
}

TEST(DotProgram, PairsRepeatedSendsWithReceivesInOrder) {
  Program p = parseProgram(
      "program devices=2\ngraph @g(%x: f32[4] input {device=0}) {\n  return\n}\n"
      "device 0 {\n  send %x -> 1\n  send %x -> 1\n}\n"
      "device 1 {\n  recv %x <- 0\n  free %x\n  recv %x <- 0\n}\n");
  std::string dot = toDot(p);
  EXPECT_TRUE(contains(dot, "d0_i0 -> d1_i0 [style=dashed")) << dot;
  EXPECT_TRUE(contains(dot, "d0_i1 -> d1_i2 [style=dashed")) << dot;
  EXPECT_EQ(count(dot, "style=dashed"), 2u);
}

TEST(DotProgram, LeavesUnmatchedReceiveWithoutDashedEdge) {
  Program p = parseProgram(
      "program devices=2\ngraph @g(%x: f32[4] input {device=0}) {\n  return\n}\n"
      "device 0 {\n}\ndevice 1 {\n  recv %x <- 0\n}\n");
  EXPECT_EQ(count(toDot(p), "style=dashed"), 0u);
}

}  // namespace
}  // namespace modelpar::ir
