// Pass `relay-skips` (relay_skips.h).
#include "passes/pipeline/relay_skips.h"

#include <algorithm>
#include <string>

#include "ir/check.h"
#include "ir/node_copy.h"

namespace modelpar::passes {
namespace {

bool isForward(const ir::Node& n) { return !n.phase || *n.phase == ir::Phase::Forward; }
bool isBackward(const ir::Node& n) {
  return n.phase == ir::Phase::Backward || n.phase == ir::Phase::Recompute;
}

}  // namespace

RelayedGraph relaySkips(const ir::Graph& g, const std::vector<int32_t>& stage_of_node) {
  MP_CHECK(stage_of_node.size() == g.numNodes(), ConfigError,
           "modelpar {}: stage_of_node has {} entries for the {} nodes of graph @{}",
           kRelaySkipsPassId, stage_of_node.size(), g.numNodes(), g.name());
  auto stageOf = [&](ir::NodeId n) { return stage_of_node[static_cast<size_t>(n)]; };

  // 1. Per value, the farthest stage its relay chain reaches (-1: none).
  //    Forward values go up, backward values down.
  const size_t nv = g.numValues();
  std::vector<int32_t> reach(nv, -1);
  std::vector<std::vector<ir::NodeId>> users = g.users();
  for (size_t v = 0; v < nv; ++v) {
    ir::NodeId pr = g.values()[v].producer;
    if (pr == ir::kNoId || !g.node(pr).microbatch) continue;
    if (!g.values()[v].type.isTensor()) continue;  // a size goes straight to its reader
    const ir::Node& pn = g.node(pr);
    int32_t p = stageOf(pr);
    for (ir::NodeId r : users[v]) {
      int32_t s = stageOf(r);
      if (s < 0) continue;
      if (isForward(pn) && s > p + 1) reach[v] = std::max(reach[v], s - 1);
      if (isBackward(pn) && s >= 0 && s < p - 1) reach[v] = reach[v] < 0 ? s + 1 : std::min(reach[v], s + 1);
    }
  }

  // 2. Rebuild the graph, each relayed value followed by its copies.
  RelayedGraph out{ir::Graph(g.name()), {}, 0};
  ir::Graph& ng = out.graph;
  std::vector<ir::ValueId> remap(nv, ir::kNoId);
  std::vector<std::vector<ir::ValueId>> copies(nv);  // per stage step away from the producer
  for (const ir::Input& in : g.inputs()) {
    const ir::Value& val = g.value(in.value);
    remap[static_cast<size_t>(in.value)] = ng.addInput(val.name, val.type, in.role, in.device);
  }
  for (size_t i = 0; i < g.numNodes(); ++i) {
    const ir::Node& n = g.nodes()[i];
    int32_t s = stage_of_node[i];
    ir::NodeCopyRules rules;
    rules.value = [&](ir::ValueId v) {
      auto vi = static_cast<size_t>(v);
      if (copies[vi].empty() || s < 0) return remap[vi];
      int32_t p = stageOf(g.value(v).producer);
      int32_t step = std::abs(s - p) - 1;  // the copy one stage before the reader's
      bool along = (s > p) == isForward(g.node(g.value(v).producer));
      if (!along || step < 1) return remap[vi];
      return copies[vi][static_cast<size_t>(step - 1)];
    };
    ir::NodeId id = ir::copyNode(g, static_cast<ir::NodeId>(i), ng, rules);
    out.stage_of_node.push_back(s);
    for (size_t k = 0; k < n.outputs.size(); ++k) {
      auto vi = static_cast<size_t>(n.outputs[k]);
      remap[vi] = ng.node(id).outputs[k];
      if (reach[vi] < 0) continue;
      int32_t dir = isForward(n) ? 1 : -1;
      ir::ValueId prev = remap[vi];
      for (int32_t c = s + dir; c != reach[vi] + dir; c += dir) {
        std::string name = fmt::format("{}.relay{}", g.value(n.outputs[k]).name, c);
        while (ng.findValue(name) || g.findValue(name)) name += "_";
        ir::NodeId cid = ng.addNode("aten::alias", {ir::Arg::value(prev)}, {{name, g.value(n.outputs[k]).type}});
        ir::Node& cn = ng.node(cid);
        cn.layer = n.layer;
        cn.phase = n.phase;
        cn.microbatch = n.microbatch;
        cn.cost = ir::Cost{0.0, 0, 0, 0};
        out.stage_of_node.push_back(c);
        prev = cn.outputs[0];
        copies[vi].push_back(prev);
        ++out.num_copies;
      }
    }
  }
  std::vector<ir::ValueId> outputs;
  for (ir::ValueId v : g.outputs()) outputs.push_back(remap[static_cast<size_t>(v)]);
  ng.setOutputs(std::move(outputs));
  return out;
}

}  // namespace modelpar::passes
