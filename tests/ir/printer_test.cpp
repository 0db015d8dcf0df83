// Printer: exact text of floats, arguments, nodes, instructions, graph
// headers and programs.
#include "ir/printer.h"

#include <gtest/gtest.h>

#include <cmath>
#include <limits>

namespace modelpar::ir {
namespace {

Type f32(std::vector<int64_t> sizes) { return Type::tensor(ScalarType::Float32, sizes); }

TEST(PrintFloat, WritesShortestTextWithAPointOrExponent) {
  EXPECT_EQ(printFloat(1.0), "1.0");
  EXPECT_EQ(printFloat(-3.0), "-3.0");
  EXPECT_EQ(printFloat(0.0), "0.0");
  EXPECT_EQ(printFloat(-0.0), "-0.0");
  EXPECT_EQ(printFloat(0.1), "0.1");
  EXPECT_EQ(printFloat(1.5), "1.5");
  EXPECT_EQ(printFloat(1e-05), "1e-05");
  EXPECT_EQ(printFloat(1e-300), "1e-300");
  EXPECT_EQ(printFloat(1e16), "1e+16");
  EXPECT_EQ(printFloat(0.1 + 0.2), "0.30000000000000004");
  EXPECT_EQ(printFloat(std::numeric_limits<double>::denorm_min()), "5e-324");
}

TEST(PrintFloat, WritesSpecialValuesByName) {
  EXPECT_EQ(printFloat(INFINITY), "inf");
  EXPECT_EQ(printFloat(-INFINITY), "-inf");
  EXPECT_EQ(printFloat(std::nan("")), "nan");
  EXPECT_EQ(printFloat(-std::nan("")), "nan");  // NaN sign is not kept
}

TEST(PrintArg, WritesEveryArgumentKind) {
  Graph g;
  ValueId x = g.addInput("x.0", f32({2}), InputRole::Input);
  EXPECT_EQ(printArg(g, Arg::none()), "None");
  EXPECT_EQ(printArg(g, Arg::boolean(true)), "true");
  EXPECT_EQ(printArg(g, Arg::boolean(false)), "false");
  EXPECT_EQ(printArg(g, Arg::integer(-7)), "-7");
  EXPECT_EQ(printArg(g, Arg::floating(2.0)), "2.0");
  EXPECT_EQ(printArg(g, Arg::string("a\"b\\c\nd\te\x01")), "\"a\\\"b\\\\c\\nd\\te\\x01\"");
  EXPECT_EQ(printArg(g, Arg::dtype(ScalarType::Float8E4M3FN)), "dtype.f8e4m3fn");
  EXPECT_EQ(printArg(g, Arg::layout(Layout::SparseCsr)), "layout.sparse_csr");
  EXPECT_EQ(printArg(g, Arg::memoryFormat(MemoryFormat::ChannelsLast3d)),
            "memory_format.channels_last_3d");
  EXPECT_EQ(printArg(g, Arg::device("cuda:1")), "device(\"cuda:1\")");
  EXPECT_EQ(printArg(g, Arg::value(x)), "%x.0");
  EXPECT_EQ(printArg(g, Arg::list({Arg::none(), Arg::value(x), Arg::list({})})), "[None, %x.0, []]");
  EXPECT_EQ(printArg(g, Arg::integer(1).withKeyword("dim")), "dim=1");
}

TEST(PrintNode, WritesResultsOpArgsAndAttributesInFixedOrder) {
  Graph g;
  ValueId x = g.addInput("x", f32({4}), InputRole::Input);
  NodeId n = g.addNode("aten::split.Tensor", {Arg::value(x), Arg::integer(2)},
                       {{"a", f32({2})}, {"b", f32({2})}});
  Node& nd = g.node(n);
  nd.cost = Cost{2.0, 16, 0, 0};
  nd.microbatch = 1;
  nd.device = 0;
  nd.phase = Phase::Backward;
  nd.layer = "l.0";
  EXPECT_EQ(printNode(g, n),
            "%a: f32[2], %b: f32[2] = aten::split.Tensor(%x, 2) {layer=\"l.0\", phase=bwd, "
            "device=0, mb=1, cost={time_us=2.0, out=16, temp=0, persist=0}}");
}

TEST(PrintNode, WritesLabelOfZeroOutputNodeAndOmitsUnsetAttributes) {
  Graph g;
  ValueId x = g.addInput("x", f32({4}), InputRole::Input);
  NodeId n = g.addNode("aten::print", {Arg::value(x)}, {});
  EXPECT_EQ(printNode(g, n), "^n0 = aten::print(%x)");
  g.setLabel(n, "log");
  g.node(n).microbatch = 0;
  EXPECT_EQ(printNode(g, n), "^log = aten::print(%x) {mb=0}");
}

TEST(PrintGraph, KeepsUpToTwoInputsOnTheHeaderLine) {
  Graph g("two");
  ValueId a = g.addInput("a", f32({}), InputRole::Input);
  g.addInput("b", Type::scalar(Type::Kind::Int), InputRole::Buffer, 3);
  g.setOutputs({a});
  EXPECT_EQ(print(g),
            "graph @two(%a: f32[] input, %b: int buffer {device=3}) {\n"
            "  return %a\n"
            "}\n");
}

TEST(PrintGraph, PutsEachOfThreeInputsOnItsOwnLine) {
  Graph g("three");
  ValueId a = g.addInput("a", f32({2}), InputRole::Input);
  ValueId b = g.addInput("b", f32({2}), InputRole::Parameter, 0);
  g.addInput("c", Type::scalar(Type::Kind::Bool), InputRole::Buffer);
  NodeId n = g.addNode("aten::add.Tensor", {Arg::value(a), Arg::value(b)}, {{"y", f32({2})}});
  g.setOutputs({g.node(n).outputs[0], a});
  EXPECT_EQ(print(g),
            "graph @three(\n"
            "    %a: f32[2] input,\n"
            "    %b: f32[2] param {device=0},\n"
            "    %c: bool buffer\n"
            ") {\n"
            "  %y: f32[2] = aten::add.Tensor(%a, %b)\n"
            "  return %y, %a\n"
            "}\n");
}

TEST(PrintGraph, WritesBareReturnForGraphWithoutOutputs) {
  EXPECT_EQ(print(Graph("e")), "graph @e() {\n  return\n}\n");
}

TEST(PrintInstruction, WritesEveryKind) {
  Graph g;
  ValueId x = g.addInput("x", f32({2}), InputRole::Input);
  NodeId y = g.addNode("aten::neg", {Arg::value(x)}, {{"y", f32({2})}});
  NodeId l = g.addNode("aten::print", {Arg::value(x)}, {});
  EXPECT_EQ(printInstruction(g, Instruction::run(y)), "run %y");
  EXPECT_EQ(printInstruction(g, Instruction::run(l)), "run ^n1");
  EXPECT_EQ(printInstruction(g, Instruction::send(x, 3)), "send %x -> 3");
  EXPECT_EQ(printInstruction(g, Instruction::recv(x, 0)), "recv %x <- 0");
  EXPECT_EQ(printInstruction(g, Instruction::free(x)), "free %x");
}

TEST(PrintProgram, WritesHeaderGraphAndEveryDeviceBlockIncludingEmptyOnes) {
  Graph g("p");
  ValueId x = g.addInput("x", f32({2}), InputRole::Input, 0);
  NodeId y = g.addNode("aten::neg", {Arg::value(x)}, {{"y", f32({2})}});
  g.node(y).device = 0;
  g.setOutputs({g.node(y).outputs[0]});
  Program p(g, 3);
  p.append(0, Instruction::run(y));
  p.append(0, Instruction::send(g.node(y).outputs[0], 2));
  p.append(2, Instruction::recv(g.node(y).outputs[0], 0));
  EXPECT_EQ(print(p),
            "program devices=3\n"
            "graph @p(%x: f32[2] input {device=0}) {\n"
            "  %y: f32[2] = aten::neg(%x) {device=0}\n"
            "  return %y\n"
            "}\n"
            "device 0 {\n"
            "  run %y\n"
            "  send %y -> 2\n"
            "}\n"
            "device 1 {\n"
            "}\n"
            "device 2 {\n"
            "  recv %y <- 0\n"
            "}\n");
}

TEST(PrintGraph, IsDeterministic) {
  Graph g("d");
  ValueId x = g.addInput("x", f32({2}), InputRole::Input);
  g.addNode("aten::neg", {Arg::value(x)}, {{"y", f32({2})}});
  EXPECT_EQ(print(g), print(g));
  Graph copy = g;
  EXPECT_EQ(print(copy), print(g));
}

}  // namespace
}  // namespace modelpar::ir
