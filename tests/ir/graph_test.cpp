// Graph construction: ids, lookups, labels and the errors the builder raises.
#include "ir/graph.h"
#include "ir/program.h"

#include <gtest/gtest.h>

#include "ir/error.h"

namespace modelpar::ir {
namespace {

Type f32(std::vector<int64_t> sizes) { return Type::tensor(ScalarType::Float32, sizes); }

//   %x  %w
//    \  /
//    mm -> %y
TEST(Graph, BuildsValuesInTextOrder) {
  Graph g("lin");
  ValueId x = g.addInput("x", f32({4, 8}), InputRole::Input);
  ValueId w = g.addInput("w", f32({8, 2}), InputRole::Parameter, 1);
  NodeId mm = g.addNode("aten::mm", {Arg::value(x), Arg::value(w)}, {{"y", f32({4, 2})}});
  g.setOutputs({g.node(mm).outputs[0]});
  EXPECT_EQ(x, 0);
  EXPECT_EQ(w, 1);
  EXPECT_EQ(g.node(mm).outputs[0], 2);
  EXPECT_EQ(g.node(mm).op, "aten::mm");
  EXPECT_EQ(g.node(mm).overload, "");
  EXPECT_EQ(g.value(2).producer, mm);
  EXPECT_EQ(g.inputs()[1].device, 1);
  EXPECT_EQ(*g.findValue("y"), 2);
  EXPECT_FALSE(g.findValue("nope").has_value());
  EXPECT_EQ(g.nodeRef(mm), "%y");
  EXPECT_EQ(g.users()[static_cast<size_t>(x)], std::vector<NodeId>{mm});
}

TEST(Graph, SplitsOverloadFromQualifiedName) {
  Graph g;
  ValueId x = g.addInput("x", f32({2}), InputRole::Input);
  NodeId n = g.addNode("aten::add.Tensor", {Arg::value(x), Arg::value(x)}, {{"y", f32({2})}});
  EXPECT_EQ(g.node(n).op, "aten::add");
  EXPECT_EQ(g.node(n).overload, "Tensor");
  EXPECT_EQ(g.node(n).qualifiedName(), "aten::add.Tensor");
  EXPECT_EQ(g.node(n).inputs(), (std::vector<ValueId>{x, x}));
  EXPECT_EQ(g.users()[static_cast<size_t>(x)].size(), 1u);
}

TEST(Graph, LabelsNodesWithoutOutputs) {
  Graph g;
  ValueId x = g.addInput("x", f32({2}), InputRole::Buffer);
  NodeId n = g.addNode("aten::_foreach_zero_", {Arg::list({Arg::value(x)})}, {});
  EXPECT_EQ(g.node(n).label, "n0");
  EXPECT_EQ(g.nodeRef(n), "^n0");
  g.setLabel(n, "zero_grads");
  EXPECT_EQ(*g.findLabel("zero_grads"), n);
  EXPECT_FALSE(g.findLabel("n0").has_value());
}

TEST(Graph, RejectsDuplicateValueNames) {
  Graph g("dup");
  g.addInput("x", f32({2}), InputRole::Input);
  try {
    g.addInput("x", f32({2}), InputRole::Input);
    FAIL() << "expected InvalidIrError";
  } catch (const InvalidIrError& e) {
    EXPECT_NE(std::string(e.what()).find("%x is defined twice"), std::string::npos) << e.what();
  }
}

TEST(Graph, RejectsInputAfterNodeAndLeavesGraphIntact) {
  Graph g;
  ValueId x = g.addInput("x", f32({2}), InputRole::Input);
  g.addNode("aten::relu", {Arg::value(x)}, {{"y", f32({2})}});
  EXPECT_THROW(g.addInput("late", f32({2}), InputRole::Input), InvalidIrError);
  EXPECT_EQ(g.numValues(), 2u);
  EXPECT_FALSE(g.findValue("late").has_value());
}

TEST(Graph, RejectsArgumentNamingMissingValueWithoutAddingOutputs) {
  Graph g;
  g.addInput("x", f32({2}), InputRole::Input);
  EXPECT_THROW(g.addNode("aten::relu", {Arg::value(7)}, {{"y", f32({2})}}), InvalidIrError);
  EXPECT_EQ(g.numNodes(), 0u);
  EXPECT_FALSE(g.findValue("y").has_value());
}

TEST(Graph, LabelOnNodeWithOutputsIsRejected) {
  Graph g;
  ValueId x = g.addInput("x", f32({2}), InputRole::Input);
  NodeId n = g.addNode("aten::relu", {Arg::value(x)}, {{"y", f32({2})}});
  EXPECT_THROW(g.setLabel(n, "r"), InvalidIrError);
}

TEST(Type, CountsBytesAndNamesDims) {
  Type t = f32({2, 3});
  EXPECT_EQ(*t.numel(), 6);
  EXPECT_EQ(*t.bytes(), 24);
  EXPECT_EQ(toString(t), "f32[2, 3]");
  Type s = Type::tensor(ScalarType::BFloat16, {Dim::symbolic("B"), Dim::fixed(4)});
  EXPECT_FALSE(s.numel().has_value());
  EXPECT_EQ(toString(s), "bf16[B, 4]");
  EXPECT_EQ(toString(Type::tensor(ScalarType::Int64, std::vector<int64_t>{})), "i64[]");
  EXPECT_EQ(*parseScalarType("f8e5m2"), ScalarType::Float8E5M2);
  EXPECT_FALSE(parseScalarType("float").has_value());
}

TEST(Program, RejectsZeroDevices) {
  try {
    Program p(Graph{}, 0);
    FAIL() << "expected InvalidIrError";
  } catch (const InvalidIrError& e) {
    EXPECT_NE(std::string(e.what()).find("at least one device, got 0"), std::string::npos);
  }
}

TEST(Program, RejectsOutOfRangeDevice) {
  Program p(Graph{}, 2);
  EXPECT_THROW(p.append(2, Instruction::free(0)), InvalidIrError);
  EXPECT_THROW(p.schedule(-1), InvalidIrError);
}

}  // namespace
}  // namespace modelpar::ir
