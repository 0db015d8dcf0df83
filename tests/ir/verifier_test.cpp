// verify(const Graph&): a well-formed graph passes, and each broken invariant
// raises InvalidIrError naming the graph, the node or value, and the problem.
// The parser and the Graph builder refuse most of these, so the tests parse a
// good graph and then break it through the mutable accessors, as a buggy pass
// would.
#include "ir/verifier.h"

#include <cmath>
#include <initializer_list>
#include <string>
#include <string_view>

#include <gtest/gtest.h>

#include "ir/error.h"
#include "ir/parser.h"

namespace modelpar::ir {
namespace {

//   %x        %w
//    |         |
//  relu -> %h  |
//     \       /
//      mm -> %y        ^zero = _foreach_zero_([%w])
//
// Value ids: %x 0, %w 1, %h 2, %y 3. Node ids: %h 0, %y 1, ^zero 2.
constexpr std::string_view kGraph = R"(
graph @g(%x: f32[4, 8] input, %w: f32[8, 2] param) {
  %h: f32[4, 8] = aten::relu(%x) {layer="act", device=0, mb=0}
  %y: f32[4, 2] = aten::mm(%h, %w) {device=1, cost={time_us=1.5, out=32, temp=0, persist=0}}
  ^zero = aten::_foreach_zero_([%w]) {phase=update}
  return %y
}
)";
constexpr ValueId kX = 0, kW = 1, kH = 2, kY = 3;
constexpr NodeId kRelu = 0, kMm = 1, kZero = 2;

// The message of the InvalidIrError that verify(g) throws, or a test failure.
std::string verifyError(const Graph& g) {
  try {
    verify(g);
  } catch (const InvalidIrError& e) {
    return e.what();
  }
  ADD_FAILURE() << "expected InvalidIrError";
  return {};
}

void expectContains(const std::string& msg, std::initializer_list<std::string_view> parts) {
  for (std::string_view part : parts) {
    EXPECT_NE(msg.find(part), std::string::npos) << "missing '" << part << "' in: " << msg;
  }
}

TEST(GraphVerifier, AcceptsWellFormedGraph) {
  EXPECT_NO_THROW(verify(parseGraph(kGraph)));
}

TEST(GraphVerifier, AcceptsSymbolicDimsAndScalars) {
  EXPECT_NO_THROW(verify(parseGraph(R"(
graph @sym(%x: f32[B, 8] input, %n: int input) {
  %y: f32[B, 8] = aten::mul.Scalar(%x, %n)
  return %y
})")));
}

TEST(GraphVerifier, RejectsUseBeforeDefinition) {
  Graph g = parseGraph(kGraph);
  g.node(kRelu).args = {Arg::value(kY)};  // %h now reads %y, which mm defines later
  expectContains(verifyError(g), {"modelpar verify: graph @g: ",
                                  "node %h (aten::relu) reads %y before it is defined"});
}

TEST(GraphVerifier, RejectsArgumentNamingMissingValue) {
  Graph g = parseGraph(kGraph);
  g.node(kMm).args.push_back(Arg::list({Arg::value(kW), Arg::value(99)}));
  expectContains(verifyError(g), {"node %y (aten::mm) reads value id 99 which does not exist"});
}

TEST(GraphVerifier, RejectsInputNamingMissingValue) {
  Graph g = parseGraph(kGraph);
  g.inputs().push_back(Input{42, InputRole::Input, std::nullopt});
  expectContains(verifyError(g), {"graph input names value id 42 which does not exist"});
}

TEST(GraphVerifier, RejectsInputListedTwice) {
  Graph g = parseGraph(kGraph);
  g.inputs().push_back(g.inputs()[0]);
  expectContains(verifyError(g), {"graph input %x is listed twice"});
}

TEST(GraphVerifier, RejectsInputThatIsAlsoProduced) {
  Graph g = parseGraph(kGraph);
  g.inputs()[1].value = kH;
  expectContains(verifyError(g), {"graph input %h is also produced by node 0"});
}

TEST(GraphVerifier, RejectsNegativeInputDevice) {
  Graph g = parseGraph(kGraph);
  g.inputs()[0].device = -1;
  expectContains(verifyError(g), {"graph input %x has device=-1; devices are >= 0"});
}

TEST(GraphVerifier, RejectsUnnamedValue) {
  Graph g = parseGraph(kGraph);
  g.value(kH).name = "";
  expectContains(verifyError(g), {"value id 2 has no name"});
}

TEST(GraphVerifier, RejectsValueDefinedTwice) {
  Graph g = parseGraph(kGraph);
  g.value(kY).name = "h";
  expectContains(verifyError(g), {"value %h is defined twice"});
}

TEST(GraphVerifier, RejectsValueWithoutProducerThatIsNoInput) {
  Graph g = parseGraph(kGraph);
  g.value(kH).producer = kNoId;
  expectContains(verifyError(g), {"value %h has no producer and is not a graph input"});
}

TEST(GraphVerifier, RejectsProducerOutOfRange) {
  Graph g = parseGraph(kGraph);
  g.value(kY).producer = 7;
  expectContains(verifyError(g), {"value %y names producer node 7 which does not exist",
                                  "the graph has 3 nodes"});
}

TEST(GraphVerifier, RejectsProducerThatDoesNotListTheValue) {
  Graph g = parseGraph(kGraph);
  g.value(kY).output_index = 1;
  expectContains(verifyError(g), {"value %y says it is output 1 of node #1 (aten::mm)"});
}

TEST(GraphVerifier, RejectsNodeListingForeignOutput) {
  Graph g = parseGraph(kGraph);
  g.node(kMm).outputs.push_back(kX);
  expectContains(verifyError(g), {"node #1 (aten::mm) lists %x as output 1",
                                  "does not name the node as its producer"});
}

TEST(GraphVerifier, RejectsScalarWithShape) {
  Graph g = parseGraph(kGraph);
  g.value(kX).type = Type{Type::Kind::Int, ScalarType::Int64, {Dim::fixed(2)}};
  expectContains(verifyError(g), {"value %x is a scalar but has a shape"});
}

TEST(GraphVerifier, RejectsNegativeDimension) {
  Graph g = parseGraph(kGraph);
  g.value(kH).type = Type::tensor(ScalarType::Float32, std::vector<int64_t>{4, -8});
  expectContains(verifyError(g), {"value %h has type f32[4, -8] with a negative dimension"});
}

TEST(GraphVerifier, RejectsNodeWithoutOperator) {
  Graph g = parseGraph(kGraph);
  g.node(kRelu).op = "";
  expectContains(verifyError(g), {"node %h has no operator name"});
}

TEST(GraphVerifier, RejectsUnlabelledNodeWithoutOutputs) {
  Graph g = parseGraph(kGraph);
  g.node(kZero).label = "";
  expectContains(verifyError(g), {"node #2 (aten::_foreach_zero_) has no outputs and no label"});
}

TEST(GraphVerifier, RejectsLabelUsedTwice) {
  Graph g = parseGraph(kGraph);
  NodeId again = g.addNode("aten::_foreach_zero_", {Arg::list({Arg::value(kW)})}, {});
  g.node(again).label = "zero";  // behind the builder's back, which would refuse
  expectContains(verifyError(g), {"label ^zero is used twice"});
}

TEST(GraphVerifier, RejectsNegativeNodeDevice) {
  Graph g = parseGraph(kGraph);
  g.node(kMm).device = -2;
  expectContains(verifyError(g), {"node %y (aten::mm) has device=-2; devices are >= 0"});
}

TEST(GraphVerifier, RejectsNegativeMicrobatch) {
  Graph g = parseGraph(kGraph);
  g.node(kRelu).microbatch = -1;
  expectContains(verifyError(g), {"node %h (aten::relu) has mb=-1"});
}

TEST(GraphVerifier, RejectsNegativeCost) {
  Graph g = parseGraph(kGraph);
  g.node(kMm).cost->temp_bytes = -4;
  expectContains(verifyError(g), {"node %y (aten::mm) has a negative or non-finite cost",
                                  "temp=-4"});
}

TEST(GraphVerifier, RejectsNanTime) {
  Graph g = parseGraph(kGraph);
  g.node(kMm).cost->time_us = std::nan("");
  expectContains(verifyError(g), {"node %y (aten::mm) has a negative or non-finite cost"});
}

}  // namespace
}  // namespace modelpar::ir
