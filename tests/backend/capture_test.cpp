// capture/: building a step's graph from a trace (dead code, input order and
// names, the structural key), layer attribution, and IR arguments from boxed
// calls.
#include <gtest/gtest.h>

#include <ATen/EmptyTensor.h>
#include <ATen/core/dispatch/Dispatcher.h>

#include "capture/capture.h"
#include "ir/error.h"
#include "ir/parser.h"
#include "ir/printer.h"

namespace modelpar::capture {
namespace {

using ir::Arg;
using ir::InputRole;
using ir::Type;

Type f32(std::vector<int64_t> shape) { return Type::tensor(ir::ScalarType::Float32, shape); }

TracedInput input(InputRole role, std::string name, std::string owner = {}) {
  TracedInput in;
  in.role = role;
  in.name = std::move(name);
  in.owner = std::move(owner);
  return in;
}

//   w (param fc.weight) ──► t ──► mm ──► relu ──► out
//   x (input) ─────────────────────┘
//   unused (input)        dead: neg(x)
TEST(BackendCapture, BuildKeepsWhatOutputsNeedAndNamesInputs) {
  Trace t;
  ir::ValueId unused = t.addInput(f32({2}), input(InputRole::Input, ""));
  ir::ValueId w = t.addInput(f32({3, 4}), input(InputRole::Parameter, "fc.weight", "fc"));
  ir::ValueId x = t.addInput(f32({2, 4}), input(InputRole::Input, "v0"));  // would clash with %v0
  ir::ValueId wt = t.addNode("aten::t", {Arg::value(w)}, {f32({4, 3})})[0];
  t.addNode("aten::neg", {Arg::value(x)}, {f32({2, 4})});
  ir::ValueId mm = t.addNode("aten::mm", {Arg::value(x), Arg::value(wt)}, {f32({2, 3})})[0];
  ir::ValueId out = t.addNode("aten::relu", {Arg::value(mm)}, {f32({2, 3})}, "", ir::Phase::Forward)[0];
  (void)unused;

  BuiltGraph b = t.build({out});
  EXPECT_EQ(ir::print(b.graph),
            "graph @step(%fc.weight: f32[3, 4] param, %v0_1: f32[2, 4] input) {\n"
            "  %v0: f32[4, 3] = aten::t(%fc.weight) {layer=\"fc\"}\n"
            "  %v1: f32[2, 3] = aten::mm(%v0_1, %v0) {layer=\"fc\"}\n"
            "  %v2: f32[2, 3] = aten::relu(%v1) {layer=\"fc\", phase=fwd}\n"
            "  return %v2\n"
            "}\n");
  EXPECT_EQ(b.input_slots, (std::vector<size_t>{1, 2}));
  EXPECT_EQ(ir::parseGraph(ir::print(b.graph)), b.graph);
}

TEST(BackendCapture, KeyDiffersByInputNotesOnly) {
  auto make = [](const std::string& note) {
    Trace t;
    TracedInput s = input(InputRole::Input, "s");
    s.key_note = note;
    ir::ValueId v = t.addInput(f32({}), s);
    return t.build({t.addNode("aten::neg", {Arg::value(v)}, {f32({})})[0]});
  };
  EXPECT_EQ(make("").key, make("").key);
  EXPECT_NE(make("").key, make("wrapped").key);
  EXPECT_EQ(ir::print(make("").graph), ir::print(make("wrapped").graph));
}

TEST(BackendCapture, BuildRejectsUnknownOutputs) {
  Trace t;
  EXPECT_THROW(t.build({3}), InvalidIrError);
}

TEST(BackendCapture, OwnerOfStripsTheLastComponent) {
  EXPECT_EQ(ownerOf("layer1.0.conv1.weight"), "layer1.0.conv1");
  EXPECT_EQ(ownerOf("weight"), "");
}

// Forward: conv (reads conv.weight) -> relu (inherits) -> fc (reads fc.weight).
// Backward: the weight-gradient node reads a saved forward value of "conv"
// and the incoming gradient of "fc": it belongs to "conv".
TEST(BackendCapture, AttributeLayersFromParametersAndInheritance) {
  ir::Graph g = ir::parseGraph(R"(
    graph @g(%x: f32[2, 4] input, %cw: f32[4, 4] param, %fw: f32[4, 4] param) {
      %h: f32[2, 4] = aten::mm(%x, %cw) {phase=fwd}
      %r: f32[2, 4] = aten::relu(%h) {phase=fwd}
      %y: f32[2, 4] = aten::mm(%r, %fw) {phase=fwd}
      %s: f32[2, 4] = aten::tanh(%y) {layer="head", phase=fwd}
      %gy: f32[2, 4] = aten::ones_like(%s) {phase=bwd}
      %gr: f32[2, 4] = aten::mm(%gy, %fw) {phase=bwd}
      %gh: f32[2, 4] = aten::threshold_backward(%gr, %r, 0) {phase=bwd}
      %z: f32[2, 4] = aten::zeros_like(%gh)
      return %gh, %z
    })");
  attributeLayers(g, {"", "conv", "fc"});
  auto layer = [&](const char* v) { return g.node(g.value(*g.findValue(v)).producer).layer; };
  EXPECT_EQ(layer("h"), "conv");
  EXPECT_EQ(layer("r"), "conv");
  EXPECT_EQ(layer("y"), "fc");
  EXPECT_EQ(layer("s"), "head");  // named by a scope: kept
  EXPECT_EQ(layer("gy"), "head");
  EXPECT_EQ(layer("gr"), "fc");
  EXPECT_EQ(layer("gh"), "conv");  // saved forward value wins over the incoming gradient
  EXPECT_EQ(layer("z"), "conv");
}

// The weight gradient of fc reads a saved activation of "conv" (%r) and the
// incoming gradient: by inheritance alone it would land in "conv"; its
// autograd sequence number (that of fc's forward mm, 7) puts it in "fc".
TEST(BackendCapture, BackwardNodesTakeTheLayerOfTheForwardOpTheyDifferentiate) {
  ir::Graph g = ir::parseGraph(R"(
    graph @g(%x: f32[2, 4] input, %cw: f32[4, 4] param, %fw: f32[4, 4] param, %gy: f32[2, 4] input) {
      %h: f32[2, 4] = aten::mm(%x, %cw) {phase=fwd}
      %r: f32[2, 4] = aten::relu(%h) {phase=fwd}
      %y: f32[2, 4] = aten::mm(%r, %fw) {phase=fwd}
      %rt: f32[4, 2] = aten::t(%r) {phase=bwd}
      %gw: f32[4, 4] = aten::mm(%rt, %gy) {phase=bwd}
      %gh: f32[2, 4] = aten::threshold_backward(%gy, %r, 0) {phase=bwd}
      return %y, %gw, %gh
    })");
  attributeLayers(g, {"", "conv", "fc", ""}, {5, 6, 7, 7, 7, 6});
  auto layer = [&](const char* v) { return g.node(g.value(*g.findValue(v)).producer).layer; };
  EXPECT_EQ(layer("rt"), "fc");
  EXPECT_EQ(layer("gw"), "fc");
  EXPECT_EQ(layer("gh"), "conv");  // relu's gradient: relu inherited "conv"
}

TEST(BackendCapture, ArgsLeaveOutDefaultsAndUseKeywordsForKeywordOnly) {
  auto& d = c10::Dispatcher::singleton();
  ArgContext ctx;
  ctx.tensor = [](const at::Tensor&) { return ir::ValueId{7}; };
  auto args = [&](const char* op, const char* overload, std::vector<c10::IValue> values) {
    ir::Graph g;
    for (int i = 0; i < 8; ++i) g.addInput("a" + std::to_string(i), f32({}), InputRole::Input);
    std::string s;
    for (const Arg& a : toArgs(d.findSchemaOrThrow(op, overload).schema(), values, ctx)) {
      s += (s.empty() ? "" : ", ") + ir::printArg(g, a);
    }
    return s;
  };
  const at::Tensor x(at::detail::empty_cpu({}, c10::ScalarType::Float));  // written as %a7
  // add.Tensor(Tensor self, Tensor other, *, Scalar alpha=1)
  EXPECT_EQ(args("aten::add", "Tensor", {x, x, c10::IValue(int64_t{1})}), "%a7, %a7");
  EXPECT_EQ(args("aten::add", "Tensor", {x, x, c10::IValue(0.5)}), "%a7, %a7, alpha=0.5");
  // sum.dim_IntList(Tensor self, int[1]? dim, bool keepdim=False, *, ScalarType? dtype=None)
  EXPECT_EQ(args("aten::sum", "dim_IntList",
                 {x, c10::IValue(std::vector<int64_t>{0, 1}), c10::IValue(false), c10::IValue()}),
            "%a7, [0, 1]");
  EXPECT_EQ(args("aten::sum", "dim_IntList",
                 {x, c10::IValue(std::vector<int64_t>{1}), c10::IValue(true),
                  c10::IValue(c10::ScalarType::Double)}),
            "%a7, [1], true, dtype=dtype.f64");
  // zeros(SymInt[] size, *, ScalarType? dtype, Layout? layout, Device? device, bool? pin_memory)
  EXPECT_EQ(args("aten::zeros", "",
                 {c10::IValue(std::vector<int64_t>{2}), c10::IValue(), c10::IValue(),
                  c10::IValue(c10::Device(c10::DeviceType::PrivateUse1, 0)), c10::IValue()}),
            "[2], device=device(\"cpu\")");
}

}  // namespace
}  // namespace modelpar::capture
