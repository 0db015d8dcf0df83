// Parser: golden round trips (tests/ir/testdata/roundtrip/*.txt), what the
// parser builds from text, and the non-canonical text it accepts.
#include "ir/parser.h"

#include <gtest/gtest.h>

#include <cmath>
#include <fstream>
#include <sstream>

#include "ir/printer.h"

namespace modelpar::ir {
namespace {

struct GoldenCase {
  std::string file;
  int line = 0;  // line of the case's first text line in the file
  std::string text;
};

// Splits a file into cases at lines `// -----`, dropping the comment and
// blank lines that open each case (they describe it and do not print back).
std::vector<GoldenCase> readCases(const std::string& file) {
  std::ifstream in(std::string(MODELPAR_SOURCE_DIR) + "/tests/ir/testdata/roundtrip/" + file);
  EXPECT_TRUE(in.good()) << "cannot open " << file;
  std::vector<GoldenCase> cases(1, GoldenCase{file, 0, ""});
  std::string line;
  for (int n = 1; std::getline(in, line); ++n) {
    if (line == "// -----") {
      cases.push_back(GoldenCase{file, 0, ""});
      continue;
    }
    GoldenCase& c = cases.back();
    if (c.text.empty() && (line.empty() || line.rfind("//", 0) == 0)) continue;
    if (c.text.empty()) c.line = n;
    c.text += line + "\n";
  }
  std::erase_if(cases, [](const GoldenCase& c) { return c.text.empty(); });
  return cases;
}

TEST(ParserGolden, GraphCasesPrintBackExactly) {
  auto cases = readCases("graphs.txt");
  EXPECT_GE(cases.size(), 9u);
  for (const GoldenCase& c : cases) {
    SCOPED_TRACE(c.file + ":" + std::to_string(c.line));
    Graph g = parseGraph(c.text);
    std::string printed = print(g);
    EXPECT_EQ(printed, c.text);
    EXPECT_EQ(parseGraph(printed), g);
  }
}

TEST(ParserGolden, ProgramCasesPrintBackExactly) {
  auto cases = readCases("programs.txt");
  EXPECT_GE(cases.size(), 3u);
  for (const GoldenCase& c : cases) {
    SCOPED_TRACE(c.file + ":" + std::to_string(c.line));
    Program p = parseProgram(c.text);
    std::string printed = print(p);
    EXPECT_EQ(printed, c.text);
    EXPECT_EQ(parseProgram(printed), p);
  }
}

TEST(Parser, BuildsInputsNodesAndOutputsInTextOrder) {
  Graph g = parseGraph(R"(
    graph @lin(%x: f32[8, 16] input, %w: f32[32, 16] param {device=1}) {
      %wt: f32[16, 32] = aten::t(%w)
      %y: f32[8, 32] = aten::mm(%x, %wt) {layer="fc", phase=fwd, device=1, mb=2,
                                          cost={time_us=1.5, out=1024, temp=8, persist=0}}
      return %y
    })");
  EXPECT_EQ(g.name(), "lin");
  ASSERT_EQ(g.inputs().size(), 2u);
  EXPECT_EQ(g.inputs()[1].role, InputRole::Parameter);
  EXPECT_EQ(g.inputs()[1].device, 1);
  EXPECT_FALSE(g.inputs()[0].device.has_value());
  ASSERT_EQ(g.numNodes(), 2u);
  const Node& mm = g.node(1);
  EXPECT_EQ(mm.op, "aten::mm");
  EXPECT_EQ(mm.overload, "");
  EXPECT_EQ(mm.args, (std::vector<Arg>{Arg::value(0), Arg::value(2)}));
  EXPECT_EQ(mm.layer, "fc");
  EXPECT_EQ(mm.phase, Phase::Forward);
  EXPECT_EQ(mm.device, 1);
  EXPECT_EQ(mm.microbatch, 2);
  EXPECT_EQ(mm.cost, (Cost{1.5, 1024, 8, 0}));
  EXPECT_EQ(g.outputs(), std::vector<ValueId>{3});
  EXPECT_EQ(g.value(3).type, Type::tensor(ScalarType::Float32, {8, 32}));
}

TEST(Parser, ReadsKeywordArgumentsWithTheirKeyword) {
  Graph g = parseGraph(
      "graph @g(%x: f32[2, 3] input) {\n"
      "  %s: f32[2] = aten::sum.dim_IntList(%x, [1], keepdim=true, dtype=dtype.f64)\n"
      "  return %s\n}\n");
  const Node& n = g.node(0);
  EXPECT_EQ(n.op, "aten::sum");
  EXPECT_EQ(n.overload, "dim_IntList");
  ASSERT_EQ(n.args.size(), 4u);
  EXPECT_EQ(n.args[1], Arg::list({Arg::integer(1)}));
  EXPECT_EQ(n.args[2], Arg::boolean(true).withKeyword("keepdim"));
  EXPECT_EQ(n.args[3], Arg::dtype(ScalarType::Float64).withKeyword("dtype"));
}

TEST(Parser, ReadsSymbolicDimsAndZeroDimTensors) {
  Graph g = parseGraph("graph @g(%x: i64[B, 128] input, %s: f32[] input) {\n  return %x\n}");
  EXPECT_EQ(g.value(0).type,
            Type::tensor(ScalarType::Int64, std::vector<Dim>{Dim::symbolic("B"), Dim::fixed(128)}));
  EXPECT_TRUE(g.value(1).type.isTensor());
  EXPECT_TRUE(g.value(1).type.shape.empty());
}

TEST(Parser, ReadsBoolAsTensorDtypeOnlyBeforeBracket) {
  Graph g = parseGraph("graph @g(%m: bool[4] input, %b: bool input) {\n  return\n}");
  EXPECT_EQ(g.value(0).type, Type::tensor(ScalarType::Bool, std::vector<int64_t>{4}));
  EXPECT_EQ(g.value(1).type, Type::scalar(Type::Kind::Bool));
}

TEST(Parser, ReadsSpecialFloatsAndNegativeZero) {
  Graph g = parseGraph(
      "graph @g(%x: f32[1] input) {\n"
      "  %y: f32[1] = t::f(%x, inf, -inf, nan, -0.0, 1e-300, 2.5E+3)\n  return %y\n}");
  const auto& a = g.node(0).args;
  EXPECT_EQ(a[1].toDouble(), INFINITY);
  EXPECT_EQ(a[2].toDouble(), -INFINITY);
  EXPECT_TRUE(std::isnan(a[3].toDouble()));
  EXPECT_EQ(a[4].toDouble(), 0.0);
  EXPECT_TRUE(std::signbit(a[4].toDouble()));
  EXPECT_EQ(a[5].toDouble(), 1e-300);
  EXPECT_EQ(a[6].toDouble(), 2500.0);
  EXPECT_EQ(a[6].kind(), Arg::Kind::Float);
}

TEST(Parser, UnescapesStrings) {
  Graph g = parseGraph(
      "graph @g(%x: f32[1] input) {\n"
      "  %y: f32[1] = t::s(%x, \"q\\\"b\\\\n\\nt\\tx\\x41\\x7f\")\n  return %y\n}");
  EXPECT_EQ(g.node(0).args[1].toStringRef(), "q\"b\\n\nt\tx" "A\x7f");
}

TEST(Parser, KeepsLabelsOfZeroOutputNodes) {
  Graph g = parseGraph(
      "graph @g(%w: f32[2] param) {\n  ^a = t::u(%w)\n  ^n0 = t::u(%w)\n  return\n}");
  EXPECT_EQ(g.node(0).label, "a");
  EXPECT_EQ(g.node(1).label, "n0");
  EXPECT_EQ(g.findLabel("n0"), 1);
}

TEST(Parser, SkipsCommentsAndFreeWhitespace) {
  Graph g = parseGraph(
      "// leading comment\n"
      "graph@g  (  %x:f32[ 2 ,B ]input  )// trailing\n"
      "{ %y  :  f32[2,B]=aten::neg ( %x ){device=0}return %y}  // end\n");
  EXPECT_EQ(print(g),
            "graph @g(%x: f32[2, B] input) {\n"
            "  %y: f32[2, B] = aten::neg(%x) {device=0}\n"
            "  return %y\n"
            "}\n");
}

TEST(Parser, AcceptsIntegerCostTimeAndPrintsItAsFloat) {
  Graph g = parseGraph(
      "graph @g(%x: f32[2] input) {\n"
      "  %y: f32[2] = aten::neg(%x) {cost={time_us=3, out=8, temp=0, persist=0}}\n"
      "  return %y\n}\n");
  EXPECT_EQ(g.node(0).cost->time_us, 3.0);
  EXPECT_NE(print(g).find("time_us=3.0,"), std::string::npos);
}

TEST(Parser, KeepsOutOfRangeAttributesForTheVerifier) {
  // Negative devices, micro-batches and costs are the verifier's to reject,
  // so that verifier tests can be written as text.
  Graph g = parseGraph(
      "graph @g(%x: f32[-1] input {device=-1}) {\n"
      "  %y: f32[2] = aten::neg(%x) {device=-2, mb=-3, cost={time_us=-1.0, out=-1, temp=-2, "
      "persist=-3}}\n  return %y\n}\n");
  EXPECT_EQ(g.inputs()[0].device, -1);
  EXPECT_EQ(g.value(0).type.shape[0].size, -1);
  EXPECT_EQ(g.node(0).device, -2);
  EXPECT_EQ(g.node(0).microbatch, -3);
  EXPECT_EQ(g.node(0).cost, (Cost{-1.0, -1, -2, -3}));
  EXPECT_EQ(parseGraph(print(g)), g);
}

TEST(Parser, BuildsProgramSchedules) {
  Program p = parseProgram(R"(program devices=2
    graph @s(%x: f32[2] input {device=0}) {
      %y: f32[2] = aten::neg(%x) {device=0}
      %z: f32[2], %w: f32[2] = aten::split(%y, 1) {device=1}
      ^l = aten::print(%z) {device=1}
      return %z
    }
    device 1 { recv %y <- 0  run %z  run ^l }
    device 0 { run %y send %y -> 1 free %y })");
  ASSERT_EQ(p.numDevices(), 2);
  EXPECT_EQ(p.schedule(0),
            (std::vector<Instruction>{Instruction::run(0), Instruction::send(1, 1),
                                      Instruction::free(1)}));
  EXPECT_EQ(p.schedule(1),
            (std::vector<Instruction>{Instruction::recv(1, 0), Instruction::run(1),
                                      Instruction::run(2)}));
}

TEST(Parser, LeavesMissingDeviceBlocksEmpty) {
  Program p = parseProgram(
      "program devices=3\ngraph @g(%x: f32[2] input) {\n  return %x\n}\ndevice 1 {\n}\n");
  EXPECT_EQ(p.numDevices(), 3);
  for (int d = 0; d < 3; ++d) EXPECT_TRUE(p.schedule(d).empty());
  EXPECT_NE(print(p).find("device 2 {\n}\n"), std::string::npos);
}

TEST(Parser, RoundTripsGraphBuiltThroughTheApi) {
  Graph g("api");
  ValueId x = g.addInput("x", Type::tensor(ScalarType::BFloat16, {Dim::symbolic("S"), Dim::fixed(4)}),
                         InputRole::Input, 0);
  ValueId w = g.addInput("w", Type::scalar(Type::Kind::Float), InputRole::Buffer);
  NodeId n = g.addNode("aten::mul.Scalar", {Arg::value(x), Arg::value(w).withKeyword("other")},
                       {{"y", g.value(x).type}, {"y2", Type::scalar(Type::Kind::Int)}});
  g.node(n).cost = Cost{0.1 + 0.2, 1, 2, 3};
  g.node(n).phase = Phase::Recompute;
  NodeId l = g.addNode("aten::foo", {Arg::floating(-0.0), Arg::string("\x02\"")}, {});
  g.node(l).layer = "a\nb";
  g.setOutputs({g.node(n).outputs[1]});
  EXPECT_EQ(parseGraph(print(g)), g);

  Program p(g, 2);
  p.append(1, Instruction::run(l));
  p.append(0, Instruction::run(n));
  p.append(0, Instruction::send(g.node(n).outputs[0], 1));
  p.append(1, Instruction::recv(g.node(n).outputs[0], 0));
  EXPECT_EQ(parseProgram(print(p)), p);
}

}  // namespace
}  // namespace modelpar::ir
