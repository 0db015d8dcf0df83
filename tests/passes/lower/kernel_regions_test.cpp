// Kernel regions (issue 38): runs between transfers become one node, what
// ends a run, frees inside a run, the region's inputs and outputs, the
// topological order of the rewritten graph, the one-device program, errors.
#include "passes/lower/kernel_regions.h"

#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "ir/error.h"
#include "ir/parser.h"
#include "ir/printer.h"

namespace modelpar::passes {
namespace {

// Device 0 computes a, b, c from x and w and sends c; device 1 computes d
// and e from c and v. Graph order interleaves the devices (p runs on 1
// between device 0's nodes).
constexpr const char* kProgram = R"(program devices=2
graph @g(%x: f32[4, 8] input {device=0}, %w: f32[8, 8] param {device=0}, %v: f32[4, 8] param {device=1}) {
  %a: f32[4, 8] = aten::mm(%x, %w) {device=0, phase=fwd, cost={time_us=2.0, out=128, temp=0, persist=0}}
  %p: f32[4, 8] = aten::relu(%v) {device=1, phase=fwd, cost={time_us=1.0, out=128, temp=0, persist=0}}
  %b: f32[4, 8] = aten::relu(%a) {device=0, phase=fwd, cost={time_us=1.0, out=128, temp=0, persist=0}}
  %c: f32[4, 8] = aten::add.Tensor(%b, %x) {device=0, phase=fwd, cost={time_us=1.0, out=128, temp=0, persist=0}}
  %d: f32[4, 8] = aten::mul.Tensor(%c, %p) {device=1, phase=fwd, cost={time_us=1.0, out=128, temp=0, persist=0}}
  %e: f32[4, 8] = aten::tanh(%d) {device=1, phase=fwd, cost={time_us=1.0, out=128, temp=0, persist=0}}
  return %e, %a
}
device 0 {
  run %a
  free %w
  run %b
  run %c
  free %b
  free %x
  send %c -> 1
  free %c
}
device 1 {
  run %p
  recv %c <- 0
  run %d
  free %c
  run %e
}
)";

std::vector<bool> all(const ir::Program& p) { return std::vector<bool>(p.graph().numNodes(), true); }

std::string schedulesOf(const ir::Program& p) {
  std::string text = ir::print(p);
  return text.substr(text.find("device 0 {"));
}

TEST(KernelRegions, EachRunBetweenTransfersBecomesOneNode) {
  ir::Program p = ir::parseProgram(kProgram);
  KernelRegions k = fuseKernelRegions(p, all(p));
  ASSERT_EQ(k.regions.size(), 2u);
  const ir::Graph& g = p.graph();
  auto ids = [&](std::vector<std::string> names) {
    std::vector<ir::ValueId> out;
    for (const std::string& n : names) out.push_back(*g.findValue(n));
    return out;
  };
  // Device 0: a, b, c; reads x and w; a is a graph output and c is sent.
  EXPECT_EQ(k.regions[0].device, 0);
  EXPECT_EQ(k.regions[0].nodes.size(), 3u);
  EXPECT_EQ(k.regions[0].inputs, ids({"x", "w"}));
  EXPECT_EQ(k.regions[0].outputs, ids({"a", "c"}));
  // Device 1: p stands before the recv, so the run after it is d, e.
  EXPECT_EQ(k.regions[1].device, 1);
  EXPECT_EQ(k.regions[1].nodes.size(), 2u);
  EXPECT_EQ(k.regions[1].inputs, ids({"c", "p"}));
  EXPECT_EQ(k.regions[1].outputs, ids({"e"}));
  EXPECT_EQ(k.regions[1].key, 1);

  const ir::Graph& out = k.program.graph();
  ASSERT_EQ(out.numNodes(), 3u);  // region 0, p, region 1
  EXPECT_FALSE(out.findValue("b"));  // internal values are gone
  EXPECT_FALSE(out.findValue("d"));
  const ir::Node& r0 = out.node(k.regions[0].node);
  EXPECT_EQ(r0.qualifiedName(), "modelpar_kernels::region");
  EXPECT_EQ(r0.args[0].toInt(), 0);
  ASSERT_EQ(r0.args[1].items().size(), 2u);
  EXPECT_EQ(r0.device, 0);
  EXPECT_EQ(r0.phase, ir::Phase::Forward);
  ASSERT_TRUE(r0.cost);
  EXPECT_DOUBLE_EQ(r0.cost->time_us, 4.0);      // 2 + 1 + 1
  EXPECT_EQ(r0.cost->output_bytes, 2 * 128);    // a and c
  EXPECT_EQ(out.outputs().size(), 2u);
  EXPECT_EQ(out.value(out.outputs()[1]).name, "a");

  // The free of w (an input) inside the run follows the region; the free
  // of b (internal) is gone; the send and the other frees stay. On device
  // 1 the free of c, inside the run, follows the region.
  EXPECT_EQ(schedulesOf(k.program),
            "device 0 {\n"
            "  run %a\n"
            "  free %w\n"
            "  free %x\n"
            "  send %c -> 1\n"
            "  free %c\n"
            "}\n"
            "device 1 {\n"
            "  run %p\n"
            "  recv %c <- 0\n"
            "  run %e\n"
            "  free %c\n"
            "}\n");
}

TEST(KernelRegions, AnUnfusibleNodeAPhaseChangeAndShortRunsEndRegions) {
  ir::Program p = ir::parseProgram(kProgram);
  std::vector<bool> mask = all(p);
  mask[2] = false;  // b
  // a alone, then c alone: both shorter than two nodes.
  KernelRegions k = fuseKernelRegions(p, mask);
  ASSERT_EQ(k.regions.size(), 1u);
  EXPECT_EQ(k.regions[0].device, 1);

  // min_nodes = 1: a and c are regions of their own (b between them), and
  // so is p (before the recv).
  KernelRegionOptions one;
  one.min_nodes = 1;
  one.first_key = 10;
  KernelRegions singles = fuseKernelRegions(p, mask, one);
  ASSERT_EQ(singles.regions.size(), 4u);
  EXPECT_EQ(singles.regions[0].key, 10);
  EXPECT_EQ(singles.regions[0].nodes, std::vector<ir::NodeId>{0});
  EXPECT_EQ(singles.regions[0].outputs.size(), 1u);  // a: read by b and returned
  EXPECT_EQ(singles.regions[2].nodes, std::vector<ir::NodeId>{1});  // p
  EXPECT_EQ(singles.regions[3].key, 13);

  // A phase change on device 1 ends the run: d fwd, e bwd.
  std::string text = kProgram;
  const std::string fwd = "aten::tanh(%d) {device=1, phase=fwd";
  text.replace(text.find(fwd), fwd.size(), "aten::tanh(%d) {device=1, phase=bwd");
  ir::Program phased = ir::parseProgram(text);
  KernelRegions k2 = fuseKernelRegions(phased, all(phased));
  ASSERT_EQ(k2.regions.size(), 1u);  // device 0 only: d and e are single runs
  EXPECT_EQ(k2.regions[0].device, 0);
}

TEST(KernelRegions, ContractedGraphIsTopologicallyOrdered) {
  // Device 0 runs q before a in its list although the graph lists a first;
  // the region {q, b} then needs a before it, and the graph order of the
  // result must put a's node first.
  constexpr const char* kReordered = R"(program devices=1
graph @g(%x: f32[4] input) {
  %a: f32[4] = aten::neg(%x)
  %q: f32[4] = aten::exp(%x)
  %b: f32[4] = aten::add.Tensor(%q, %a)
  %c: f32[4] = aten::sin(%b)
  return %c
}
device 0 {
  run %a
  run %q
  run %b
  run %c
}
)";
  ir::Program p = ir::parseProgram(kReordered);
  std::vector<bool> mask = all(p);
  mask[0] = false;  // a runs op by op
  KernelRegions k = fuseKernelRegions(p, mask);
  ASSERT_EQ(k.regions.size(), 1u);
  EXPECT_EQ(k.regions[0].nodes.size(), 3u);  // q, b, c
  const ir::Graph& out = k.program.graph();
  ASSERT_EQ(out.numNodes(), 2u);
  EXPECT_EQ(out.node(0).op, "aten::neg");
  EXPECT_EQ(out.node(1).op, "modelpar_kernels::region");
  EXPECT_EQ(out.node(1).outputs.size(), 1u);
  EXPECT_EQ(out.value(out.node(1).outputs[0]).name, "c");
}

TEST(KernelRegions, SizesARegionReadsComeAfterItsTensors) {
  // A view to a symbolic batch reads the int %B: the region gets it in its
  // second list. A float input is refused: the operator passes ints only.
  constexpr const char* kSized = R"(program devices=1
graph @g(%n: int input, %x: f32[B, 8] input, %s: float input) {
  %a: f32[B, 8] = aten::relu(%x)
  %v: f32[B, 2, 4] = aten::view(%a, [%n, 2, 4])
  %c: f32[B, 2, 4] = aten::neg(%v)
  %d: f32[B, 2, 4] = aten::mul.Tensor(%c, %s)
  return %d
}
device 0 {
  run %a
  run %v
  run %c
  run %d
}
)";
  ir::Program p = ir::parseProgram(kSized);
  std::vector<bool> mask = all(p);
  mask[3] = false;  // the mul reads a float
  KernelRegions k = fuseKernelRegions(p, mask);
  ASSERT_EQ(k.regions.size(), 1u);
  const ir::Graph& g = p.graph();
  EXPECT_EQ(k.regions[0].inputs, (std::vector<ir::ValueId>{*g.findValue("x"), *g.findValue("n")}));
  EXPECT_EQ(k.regions[0].num_tensor_inputs, 1u);
  const ir::Node& r = k.program.graph().node(k.regions[0].node);
  ASSERT_EQ(r.args.size(), 3u);
  EXPECT_EQ(r.args[1].items().size(), 1u);
  ASSERT_EQ(r.args[2].items().size(), 1u);
  EXPECT_EQ(k.program.graph().value(r.args[2].items()[0].toValue()).name, "n");
  EXPECT_THROW(fuseKernelRegions(p, all(p)), InvalidIrError);
}

TEST(KernelRegions, OneDeviceProgramRunsEveryNodeInOrder) {
  ir::Program p = ir::parseProgram(kProgram);
  ir::Program one = oneDeviceProgram(p.graph());
  EXPECT_EQ(one.numDevices(), 1);
  ASSERT_EQ(one.schedule(0).size(), p.graph().numNodes());
  EXPECT_EQ(one.schedule(0)[3], ir::Instruction::run(3));
}

TEST(KernelRegions, WrongMaskSizeIsAnError) {
  ir::Program p = ir::parseProgram(kProgram);
  EXPECT_THROW(fuseKernelRegions(p, std::vector<bool>(2, true)), InvalidIrError);
  KernelRegions none = fuseKernelRegions(p, std::vector<bool>(p.graph().numNodes(), false));
  EXPECT_TRUE(none.regions.empty());
  EXPECT_EQ(none.program, p);
}

}  // namespace
}  // namespace modelpar::passes
