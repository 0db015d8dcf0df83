// makeBatchSymbolic: a captured step's batch size becomes the symbol B in the
// types of the values computed from the batched inputs and in their size
// arguments (read from `%B: int input`); the backward seed recorded before
// the backward gets phase bwd; sizes that cannot be told apart are refused.
#include <gtest/gtest.h>

#include <string>

#include "backend/symbolic_batch.h"
#include "ir/error.h"
#include "ir/parser.h"
#include "ir/printer.h"

namespace {

using modelpar::backend::makeBatchSymbolic;
using modelpar::backend::SymbolicBatch;

// x[6, 4] ──mm(w)── h[6, 5] ── view [6, 5] ── sum ── loss ── ones_like ─► backward
//                  (w: 5 columns, so 6 is only ever the batch)
constexpr char kStep[] = R"(graph @step(%w: f32[4, 5] param, %x: f32[6, 4] input, %y: f32[6, 5] input) {
  %h: f32[6, 5] = aten::mm(%x, %w) {layer="fc", phase=fwd}
  %r: f32[6, 5] = aten::view(%h, [6, 5]) {layer="fc", phase=fwd}
  %d: f32[6, 5] = aten::sub.Tensor(%r, %y) {layer="fc", phase=fwd}
  %loss: f32[] = aten::sum(%d) {layer="fc", phase=fwd}
  %seed: f32[] = aten::ones_like(%loss) {layer="fc", phase=fwd}
  %g: f32[6, 5] = aten::expand(%seed, [6, 5]) {layer="fc", phase=bwd}
  %xt: f32[4, 6] = aten::t(%x) {layer="fc", phase=bwd}
  %gw: f32[4, 5] = aten::mm(%xt, %g) {layer="fc", phase=bwd}
  return %loss, %gw
})";

constexpr char kSymbolic[] = R"(graph @step(%w: f32[4, 5] param, %x: f32[B, 4] input, %y: f32[B, 5] input, %B: int input) {
  %h: f32[B, 5] = aten::mm(%x, %w) {layer="fc", phase=fwd}
  %r: f32[B, 5] = aten::view(%h, [%B, 5]) {layer="fc", phase=fwd}
  %d: f32[B, 5] = aten::sub.Tensor(%r, %y) {layer="fc", phase=fwd}
  %loss: f32[] = aten::sum(%d) {layer="fc", phase=fwd}
  %seed: f32[] = aten::ones_like(%loss) {layer="fc", phase=bwd}
  %g: f32[B, 5] = aten::expand(%seed, [%B, 5]) {layer="fc", phase=bwd}
  %xt: f32[4, B] = aten::t(%x) {layer="fc", phase=bwd}
  %gw: f32[4, 5] = aten::mm(%xt, %g) {layer="fc", phase=bwd}
  return %loss, %gw
})";

std::string replace(std::string s, const std::string& from, const std::string& to) {
  s.replace(s.find(from), from.size(), to);
  return s;
}

TEST(BackendSymbolicBatch, WritesBForTheBatchInTypesAndSizeArguments) {
  const modelpar::ir::Graph g = modelpar::ir::parseGraph(kStep);
  const SymbolicBatch s = makeBatchSymbolic(g, {});
  EXPECT_EQ(s.batch_size, 6);
  EXPECT_EQ(s.batched_inputs, (std::vector<std::string>{"x", "y"}));
  EXPECT_TRUE(s.has_size_input);
  EXPECT_EQ(s.seed_nodes, 1);
  EXPECT_EQ(modelpar::ir::print(s.graph), modelpar::ir::print(modelpar::ir::parseGraph(kSymbolic)));
  EXPECT_EQ(modelpar::ir::print(g), modelpar::ir::print(modelpar::ir::parseGraph(kStep)));  // unchanged
}

TEST(BackendSymbolicBatch, BatchedInputsGivenByName) {
  const modelpar::ir::Graph g = modelpar::ir::parseGraph(kStep);
  const SymbolicBatch s = makeBatchSymbolic(g, {"x", "y"});
  EXPECT_EQ(modelpar::ir::print(s.graph), modelpar::ir::print(modelpar::ir::parseGraph(kSymbolic)));
}

struct Refused {
  const char* what;
  std::string graph;
  std::vector<std::string> batched;
  const char* message;
};

TEST(BackendSymbolicBatch, RefusesWhatItCannotTellApartNamingIt) {
  const Refused cases[] = {
      {"different leading sizes", replace(kStep, "%y: f32[6, 5] input", "%y: f32[7, 5] input"), {},
       "the step's data inputs have different leading sizes (%x: f32[6, 4], %y: f32[7, 5]); say "
       "which inputs are batched with the pipeline option batched_inputs"},
      {"an unknown name", kStep, {"images"},
       "batched_inputs names 'images', which is not a data input"},
      {"a parameter's name", kStep, {"w"}, "batched_inputs names 'w'"},
      {"a parameter dimension equal to B", replace(kStep, "%w: f32[4, 5] param", "%w: f32[4, 6] param"),
       {}, "the batch size 6 is also a dimension of %w: f32[4, 6]"},
      {"no data input", "graph @g(%w: f32[4] param) {\n  %a: f32[4] = aten::relu(%w)\n  return %a\n}",
       {}, "has no data input with a leading (batch) dimension"},
      {"a batch no larger than the rank",
       replace(replace(replace(kStep, "f32[6, 4] input", "f32[2, 4] input"), "f32[6, 5] input",
                       "f32[2, 5] input"),
               "%h: f32[6, 5]", "%h: f32[2, 5]"),
       {}, "the batch size 2 is not larger than the rank of %h: f32[2, 5]"},
  };
  for (const Refused& c : cases) {
    try {
      makeBatchSymbolic(modelpar::ir::parseGraph(c.graph), c.batched);
      ADD_FAILURE() << c.what << ": no error";
    } catch (const modelpar::ConfigError& e) {
      EXPECT_NE(std::string(e.what()).find(c.message), std::string::npos) << c.what << ": " << e.what();
    }
  }
}

}  // namespace
