// copyNode: arguments remapped (or replaced by constants), names and types
// mapped, every annotation kept, cost kept or dropped, output map filled.
#include "ir/node_copy.h"

#include <gtest/gtest.h>

#include "ir/parser.h"
#include "ir/printer.h"

namespace modelpar::ir {
namespace {

constexpr const char* kSource = R"(
graph @src(%x: f32[B, 4] input, %w: f32[4, 4] param) {
  %a: f32[B, 4] = aten::mm(%x, %w) {layer="l1", phase=fwd, device=1, mb=2, cost={time_us=3.0, out=64, temp=0, persist=64}}
  ^zero = aten::zero_(%w) {layer="l1"}
  return %a
}
)";

TEST(NodeCopy, KeepsEveryAnnotationAndMapsArgumentsAndOutputs) {
  Graph src = parseGraph(kSource);
  Graph dst("dst");
  ValueId y = dst.addInput("y", src.value(0).type, InputRole::Input);
  ValueId v = dst.addInput("v", src.value(1).type, InputRole::Parameter);
  std::vector<ValueId> map = {y, v, kNoId};
  NodeCopyRules rules;
  rules.value = [&](ValueId id) { return map[static_cast<size_t>(id)]; };
  rules.name = [](const std::string& s) { return s + ".copy"; };
  NodeId c = copyNode(src, 0, dst, rules, &map);
  const Node& n = dst.node(c);
  EXPECT_EQ(printNode(dst, c),
            "%a.copy: f32[B, 4] = aten::mm(%y, %v) {layer=\"l1\", phase=fwd, device=1, mb=2, "
            "cost={time_us=3.0, out=64, temp=0, persist=64}}");
  EXPECT_EQ(map[2], n.outputs[0]);
  // A node without outputs keeps its label, renamed by the same rule.
  NodeId l = copyNode(src, 1, dst, rules);
  EXPECT_EQ(dst.node(l).label, src.node(1).label + ".copy");
}

TEST(NodeCopy, ReplacesArgumentsByConstantsMapsTypesAndDropsTheCostWhenAsked) {
  Graph src = parseGraph(kSource);
  Graph dst("dst");
  ValueId w = dst.addInput("w", src.value(1).type, InputRole::Parameter);
  NodeCopyRules rules;
  // %x becomes the constant 7 (as microbatch turns the batch-size input into b_k).
  rules.arg = [&](ValueId id) { return id == 0 ? Arg::integer(7) : Arg::value(w); };
  rules.type = [](const Type&) { return Type::tensor(ScalarType::Float32, std::vector<int64_t>{2, 4}); };
  rules.keep_cost = false;
  NodeId c = copyNode(src, 0, dst, rules);
  EXPECT_EQ(printNode(dst, c),
            "%a: f32[2, 4] = aten::mm(7, %w) {layer=\"l1\", phase=fwd, device=1, mb=2}");
}

}  // namespace
}  // namespace modelpar::ir
