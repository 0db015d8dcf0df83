// Portals and relaying on a U-Net-like step over 4 stages: with portals (the
// default) the skip tensor goes straight from stage 0 to stage 3 and its
// gradient straight back; with pass `relay-skips` both go stage by stage.
#include "passes/pipeline/relay_skips.h"

#include <fmt/format.h>
#include <gtest/gtest.h>

#include <string>

#include "ir/error.h"
#include "ir/parser.h"
#include "ir/verifier.h"
#include "passes/lower/simulate.h"
#include "passes/pipeline/schedule.h"
#include "tests/passes/test_graphs.h"
#include "tests/support/expect_error.h"

namespace modelpar::passes {
namespace {

using Kind = ir::Instruction::Kind;

// Per micro-batch k (stage in brackets):
//
//   %x -> e0 [0] -> p0 [0] -> e1 [1] -> e2 [2] -> d3 = cat(e2, e0) [3]
//          '------------- skip ---------------------^
//   backward: gd3 [3] -> gs [3] (the skip's gradient) ----------.
//             gd3 -> ge2 [2] -> ge1 [1] -> gp0 [0] -> ge0 = cat(gp0, gs) [0]
std::string unetText(int m) {
  auto c = [](int64_t out) { return fmt::format("cost={{time_us=10.0, out={}, temp=0, persist=0}}", out); };
  std::string s = "graph @unet(%x: f32[256] input) {\n";
  for (int k = 0; k < m; ++k) {
    auto node = [&](const std::string& out, int words, const std::string& call, int st, const char* ph) {
      s += fmt::format("  %{}_{}: f32[{}] = {} {{layer=\"s{}\", phase={}, mb={}, {}}}\n", out, k, words,
                       call, st, ph, k, c(4 * words));
    };
    auto v = [&](const char* name) { return fmt::format("%{}_{}", name, k); };
    node("e0", 256, "aten::relu(%x)", 0, "fwd");
    node("p0", 64, fmt::format("aten::relu({})", v("e0")), 0, "fwd");
    node("e1", 64, fmt::format("aten::relu({})", v("p0")), 1, "fwd");
    node("e2", 64, fmt::format("aten::relu({})", v("e1")), 2, "fwd");
    node("d3", 320, fmt::format("aten::cat([{}, {}])", v("e2"), v("e0")), 3, "fwd");
    node("gd3", 320, fmt::format("aten::threshold_backward({}, {}, 0)", v("d3"), v("d3")), 3, "bwd");
    node("gs", 256, fmt::format("aten::relu({})", v("gd3")), 3, "bwd");
    node("ge2", 64, fmt::format("aten::threshold_backward({}, {}, 0)", v("gd3"), v("e2")), 2, "bwd");
    node("ge1", 64, fmt::format("aten::threshold_backward({}, {}, 0)", v("ge2"), v("e1")), 1, "bwd");
    node("gp0", 64, fmt::format("aten::threshold_backward({}, {}, 0)", v("ge1"), v("p0")), 0, "bwd");
    node("ge0", 320, fmt::format("aten::cat([{}, {}])", v("gp0"), v("gs")), 0, "bwd");
  }
  return s + "  return\n}\n";
}

std::vector<int32_t> stagesFromLayers(const ir::Graph& g) {
  std::vector<int32_t> s;
  for (const ir::Node& n : g.nodes()) s.push_back(std::stoi(n.layer.substr(1)));
  return s;
}

// "d:send->e" for every send of a value whose name starts with `prefix`.
std::vector<std::string> sendsOf(const ir::Program& p, const std::string& prefix) {
  std::vector<std::string> out;
  for (int d = 0; d < p.numDevices(); ++d) {
    for (const ir::Instruction& i : p.schedule(d)) {
      if (i.kind == Kind::Send && p.graph().value(i.value).name.rfind(prefix, 0) == 0) {
        out.push_back(fmt::format("{}->{}", d, i.peer));
      }
    }
  }
  return out;
}

// Whether device d mentions value v at all: a run reading it or a send,
// recv or free of it.
bool touches(const ir::Program& p, int d, ir::ValueId v) {
  for (const ir::Instruction& i : p.schedule(d)) {
    if (i.kind == Kind::Run) {
      for (ir::ValueId in : p.graph().node(i.node).inputs()) {
        if (in == v) return true;
      }
    } else if (i.value == v) {
      return true;
    }
  }
  return false;
}

PipelineProgram lowerUnet(const ir::Graph& g, const char* kind, bool relay) {
  PipelineScheduleOptions o;
  o.kind = kind;
  o.stage_of_node = stagesFromLayers(g);
  o.relay_skips = relay;
  PipelineProgram pp = lowerPipeline(g, o);
  ir::verify(pp.program);
  return pp;
}

TEST(RelaySkips, PortalsSendTheSkipAndItsGradientStraightAcross) {
  ir::Graph g = ir::parseGraph(unetText(2));
  for (const char* kind : {"gpipe", "1f1b"}) {
    SCOPED_TRACE(kind);
    PipelineProgram pp = lowerUnet(g, kind, false);
    EXPECT_EQ(pp.graph, g);
    for (int k = 0; k < 2; ++k) {
      EXPECT_EQ(sendsOf(pp.program, fmt::format("e0_{}", k)), std::vector<std::string>{"0->3"});
      EXPECT_EQ(sendsOf(pp.program, fmt::format("gs_{}", k)), std::vector<std::string>{"3->0"});
      for (int d : {1, 2}) {
        EXPECT_FALSE(touches(pp.program, d, *g.findValue(fmt::format("e0_{}", k)))) << "device " << d;
        EXPECT_FALSE(touches(pp.program, d, *g.findValue(fmt::format("gs_{}", k)))) << "device " << d;
      }
    }
    // Per micro-batch: p0, e1, e2, e0 forward; gd3, ge2, ge1, gs backward.
    EXPECT_EQ(simulate(pp.program, testing::machine(4)).num_transfers, 16);
  }
}

TEST(RelaySkips, RelayingForwardsTheSkipStageByStage) {
  ir::Graph g = ir::parseGraph(unetText(2));
  PipelineProgram portal = lowerUnet(g, "1f1b", false);
  PipelineProgram relay = lowerUnet(g, "1f1b", true);
  for (int k = 0; k < 2; ++k) {
    EXPECT_EQ(sendsOf(relay.program, fmt::format("e0_{}", k)),
              (std::vector<std::string>{"0->1", "1->2", "2->3"}));
    EXPECT_EQ(sendsOf(relay.program, fmt::format("gs_{}", k)),
              (std::vector<std::string>{"1->0", "2->1", "3->2"}));
  }
  // Three transfers instead of one, twice per micro-batch: 16 + 2 * 2 * 2.
  SimulationReport rp = simulate(portal.program, testing::machine(4));
  SimulationReport rr = simulate(relay.program, testing::machine(4));
  EXPECT_EQ(rr.num_transfers, 24);
  // Devices 1 and 2 each receive two more 1 KiB values per micro-batch (the
  // skip and its gradient), each holding the receive channel for its bytes,
  // 1 us on machine(4) (the 2 us latency does not hold it): 4 us more.
  for (int d : {1, 2}) {
    EXPECT_DOUBLE_EQ(rr.devices[static_cast<size_t>(d)].recv_busy_us,
                     rp.devices[static_cast<size_t>(d)].recv_busy_us + 4.0)
        << "device " << d;
  }
  // Device 1 (1F1B, both micro-batches in flight): with portals it peaks at
  // its two stashed 256 B activations + a received 256 B gradient + its own
  // = 1 KiB; relaying, at the two stashed activations + a relayed 1 KiB copy
  // of the skip's gradient = 1.5 KiB (a relayed copy is released once sent).
  EXPECT_EQ(rp.devices[1].peak_bytes, 1024);
  EXPECT_EQ(rr.devices[1].peak_bytes, 1536);
}

TEST(RelaySkips, InsertsAliasCopiesOnTheIntermediateStages) {
  ir::Graph g = ir::parseGraph(unetText(1));
  ir::Graph before = g;
  RelayedGraph r = relaySkips(g, stagesFromLayers(g));
  EXPECT_EQ(g, before);
  ir::verify(r.graph);
  EXPECT_EQ(r.num_copies, 4);
  ASSERT_EQ(r.graph.numNodes(), g.numNodes() + 4);
  ASSERT_EQ(r.stage_of_node.size(), r.graph.numNodes());
  auto node = [&](const char* name) { return r.graph.value(*r.graph.findValue(name)).producer; };
  for (auto [name, stage] : {std::pair{"e0_0.relay1", 1}, {"e0_0.relay2", 2}, {"gs_0.relay2", 2}, {"gs_0.relay1", 1}}) {
    SCOPED_TRACE(name);
    ir::NodeId n = node(name);
    EXPECT_EQ(r.graph.node(n).op, "aten::alias");
    EXPECT_EQ(r.stage_of_node[static_cast<size_t>(n)], stage);
    EXPECT_EQ(r.graph.node(n).microbatch, 0);
  }
  EXPECT_EQ(r.graph.node(node("e0_0.relay2")).phase, ir::Phase::Forward);
  EXPECT_EQ(r.graph.node(node("gs_0.relay1")).phase, ir::Phase::Backward);
  // The readers read the copy one stage before theirs; near readers the original.
  EXPECT_EQ(r.graph.node(node("d3_0")).inputs()[1], *r.graph.findValue("e0_0.relay2"));
  EXPECT_EQ(r.graph.node(node("ge0_0")).inputs()[1], *r.graph.findValue("gs_0.relay1"));
  EXPECT_EQ(r.graph.node(node("p0_0")).inputs()[0], *r.graph.findValue("e0_0"));
}

// A micro-batch's size read three stages on (GPT's view sizes, 1F1B without
// portals on 3 devices) goes straight across: `alias` of an int is a 0-dim
// tensor, which the executor refused as not the IR's int. Tensors still relay.
TEST(RelaySkips, AScalarThatSkipsStagesGoesStraightAcross) {
  ir::Graph g = ir::parseGraph(R"(
graph @sizes(%x: f32[B, 4] input, %b: int input) {
  %n: int = modelpar::sym_mul(%b, 4) {layer="s0", phase=fwd, mb=0}
  %h: f32[B, 4] = aten::relu(%x) {layer="s0", phase=fwd, mb=0}
  %h1: f32[B, 4] = aten::relu(%h) {layer="s1", phase=fwd, mb=0}
  %v: f32[e_4xB] = aten::view(%h1, [%n]) {layer="s2", phase=fwd, mb=0}
  %w: f32[e_4xB] = aten::view(%h, [%n]) {layer="s2", phase=fwd, mb=0}
  return %v, %w
}
)");
  RelayedGraph r = relaySkips(g, {0, 0, 1, 2, 2});
  ir::verify(r.graph);
  EXPECT_EQ(r.num_copies, 1);  // %h on stage 1; not %n
  EXPECT_FALSE(r.graph.findValue("n.relay1").has_value());
  ASSERT_TRUE(r.graph.findValue("h.relay1").has_value());
  const ir::Node& w = r.graph.node(r.graph.value(*r.graph.findValue("w")).producer);
  EXPECT_EQ(w.inputs()[0], *r.graph.findValue("h.relay1"));
  EXPECT_EQ(w.inputs()[1], *r.graph.findValue("n"));
}

TEST(RelaySkips, RejectsAStageListOfTheWrongSize) {
  ir::Graph g = ir::parseGraph(unetText(1));
  EXPECT_HAS(modelpar::testing::messageOf<ConfigError>([&] { relaySkips(g, {0, 1}); }),
             "stage_of_node has 2 entries for the 11 nodes");
}

}  // namespace
}  // namespace modelpar::passes
