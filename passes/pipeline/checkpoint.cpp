// Pass `checkpoint` (checkpoint.h). Steps: 1. check the stages and choose
// the checkpointed (stage, micro-batch) groups; 2. per group, the recompute
// set: producers of values the backward reads, closed over their inputs from
// the same group, minus what must stay stored (Note [Recompute and
// randomness]); 3. the new graph, each group's copies before its first
// backward reader.
#include "passes/pipeline/checkpoint.h"

#include <algorithm>
#include <map>
#include <optional>

#include "ir/check.h"
#include "ir/node_copy.h"
#include "passes/option_names.h"
#include "ir/random_ops.h"
#include "passes/cost/op_family.h"

namespace modelpar::passes {
namespace {

using ir::NodeId;
using ir::Phase;
using ir::ValueId;

constexpr std::string_view kWho = "modelpar checkpoint";

using GroupKey = std::pair<int32_t, int>;  // stage, micro-batch

// The graph and the stage of each of its nodes.
struct Staged {
  const ir::Graph& g;
  const std::vector<int32_t>& stage_of_node;

  GroupKey groupOf(NodeId n) const {
    return GroupKey{stage_of_node[static_cast<size_t>(n)], *g.node(n).microbatch};
  }
  // Only a backward node on the value's own stage reads a recomputed copy:
  // on another stage the value is a stage input, which stays stored
  // (reading a copy would make that stage's backward wait for this stage's
  // recompute, which itself waits for the gradient from that stage).
  bool readsCopyOf(size_t reader, NodeId p) const {
    return g.nodes()[reader].phase == Phase::Backward && p != ir::kNoId &&
           stage_of_node[reader] == stage_of_node[static_cast<size_t>(p)];
  }
};

// 1. Stages and groups: every node has a stage, no node is a recompute node
// already (unless nothing is checkpointed). Returns the last micro-batch.
int checkStages(const Staged& s, const CheckpointOptions& options) {
  const ir::Graph& g = s.g;
  const size_t nn = g.numNodes();
  MP_CHECK(s.stage_of_node.size() == nn, ConfigError,
           "{}: graph @{} has {} nodes but {} stages were given (one per node)", kWho, g.name(),
           nn, s.stage_of_node.size());
  int last_mb = -1;
  for (size_t n = 0; n < nn; ++n) {
    const ir::Node& nd = g.nodes()[n];
    MP_CHECK(s.stage_of_node[n] >= 0, ConfigError, "{}: graph @{}: node {} has stage {}", kWho,
             g.name(), g.nodeRef(static_cast<NodeId>(n)), s.stage_of_node[n]);
    // A model that checkpoints its own activations (torch.utils.checkpoint,
    // transformers' gradient_checkpointing_enable), or AOTAutograd's min-cut
    // partitioner, brings recompute nodes of its own: they stay as they are,
    // and only `never` adds none.
    MP_CHECK(nd.phase != Phase::Recompute || options.mode == CheckpointMode::Never, ConfigError,
             "{}: graph @{}: node {} is already a recompute node: the model checkpoints its "
             "own activations (torch.utils.checkpoint, or transformers' "
             "gradient_checkpointing_enable), or partitioner='min_cut' recomputes part of the "
             "forward; checkpoint a graph once: use checkpoint='never' (what such a step runs "
             "when checkpoint is not given), or turn the other recomputation off", kWho, g.name(),
             g.nodeRef(static_cast<NodeId>(n)));
    if (nd.microbatch) last_mb = std::max(last_mb, *nd.microbatch);
  }
  return last_mb;
}

// 2a. The forward nodes of checkpointed micro-batches that may be
// recomputed: not random, not in place, touching no storage mutated before
// the backward (in-place ops outside the update).
std::vector<char> recomputeCandidates(const ir::Graph& g, const CheckpointOptions& options,
                                      int last_mb) {
  auto checkpointed = [&](int mb) {
    switch (options.mode) {
      case CheckpointMode::Always: return true;
      case CheckpointMode::ExceptLast: return mb != last_mb;
      case CheckpointMode::Never: return false;
    }
    return false;
  };
  std::vector<ValueId> root = storageRoots(g);
  std::vector<char> mutated(g.numValues(), 0);
  for (const ir::Node& nd : g.nodes()) {
    if (!isInPlaceOp(nd.op) || nd.phase == Phase::Update || nd.args.empty()) continue;
    nd.args[0].forEachValue([&](ValueId v) { mutated[static_cast<size_t>(root[static_cast<size_t>(v)])] = 1; });
  }
  auto touchesMutated = [&](const ir::Node& nd) {
    for (ValueId v : nd.inputs()) {
      if (mutated[static_cast<size_t>(root[static_cast<size_t>(v)])]) return true;
    }
    for (ValueId v : nd.outputs) {
      if (mutated[static_cast<size_t>(root[static_cast<size_t>(v)])]) return true;
    }
    return false;
  };
  auto chosenLayer = [&](const ir::Node& nd) {
    return !options.layers || options.layers->count(nd.layer) > 0;
  };
  std::vector<char> candidate(g.numNodes(), 0);
  for (size_t n = 0; n < g.numNodes(); ++n) {
    const ir::Node& nd = g.nodes()[n];
    candidate[n] = nd.phase == Phase::Forward && nd.microbatch && checkpointed(*nd.microbatch) &&
                   chosenLayer(nd) &&
                   !nd.outputs.empty() && !ir::isRandom(nd) && !isInPlaceOp(nd.op) &&
                   !touchesMutated(nd);
  }
  return candidate;
}

// 2b. Recompute set: candidate producers of values a backward node of their
// stage reads, and (walking backwards in graph order) candidate producers
// of their inputs in the same group.
std::vector<char> recomputeSet(const Staged& s, const std::vector<char>& candidate) {
  const ir::Graph& g = s.g;
  const size_t nn = g.numNodes();
  std::vector<char> recompute(nn, 0);
  for (size_t n = 0; n < nn; ++n) {
    for (ValueId v : g.nodes()[n].inputs()) {
      NodeId p = g.value(v).producer;
      if (s.readsCopyOf(n, p) && candidate[static_cast<size_t>(p)]) recompute[static_cast<size_t>(p)] = 1;
    }
  }
  for (size_t n = nn; n-- > 0;) {
    if (!recompute[n]) continue;
    for (ValueId v : g.nodes()[n].inputs()) {
      NodeId p = g.value(v).producer;
      if (p != ir::kNoId && candidate[static_cast<size_t>(p)] &&
          s.groupOf(p) == s.groupOf(static_cast<NodeId>(n))) {
        recompute[static_cast<size_t>(p)] = 1;
      }
    }
  }
  return recompute;
}

// The recompute groups and where each goes.
struct GroupPlacement {
  std::vector<std::vector<GroupKey>> groups_before;  // per node: groups emitted before it
  std::map<GroupKey, std::vector<NodeId>> members;
};

// 2c. Where each group goes: before the first backward node reading its
// values, which must come after the group's forward nodes.
GroupPlacement placeGroups(const Staged& s, const std::vector<char>& recompute) {
  const ir::Graph& g = s.g;
  const size_t nn = g.numNodes();
  std::map<GroupKey, size_t> first_reader;
  for (size_t n = 0; n < nn; ++n) {
    for (ValueId v : g.nodes()[n].inputs()) {
      NodeId p = g.value(v).producer;
      if (!s.readsCopyOf(n, p) || !recompute[static_cast<size_t>(p)]) continue;
      first_reader.try_emplace(s.groupOf(p), n);
    }
  }
  GroupPlacement gp;
  gp.groups_before.assign(nn, {});
  for (const auto& [key, n] : first_reader) gp.groups_before[n].push_back(key);
  for (size_t n = 0; n < nn; ++n) {
    if (recompute[n]) gp.members[s.groupOf(static_cast<NodeId>(n))].push_back(static_cast<NodeId>(n));
  }
  for (const auto& [key, n] : first_reader) {
    NodeId last = gp.members[key].back();
    MP_CHECK(static_cast<size_t>(last) < n, InvalidIrError,
             "{}: graph @{}: forward node {} (stage {}, micro-batch {}) comes after the backward "
             "node {} that reads that micro-batch's activations; order each micro-batch's "
             "forward before its backward",
             kWho, g.name(), g.nodeRef(last), key.first, key.second,
             g.nodeRef(static_cast<NodeId>(n)));
  }
  return gp;
}

// 3. The new graph: each group's copies before its first backward reader.
CheckpointResult buildCheckpointed(const Staged& s, GroupPlacement& gp) {
  const ir::Graph& g = s.g;
  const size_t nn = g.numNodes(), nv = g.numValues();
  CheckpointResult r{ir::Graph(g.name()), {}, {}};
  ir::Graph& out = r.graph;
  std::vector<ValueId> orig(nv, ir::kNoId), copy(nv, ir::kNoId);
  for (const ir::Input& in : g.inputs()) {
    const ir::Value& v = g.value(in.value);
    orig[static_cast<size_t>(in.value)] = out.addInput(v.name, v.type, in.role, in.device);
  }
  // A backward node reads the copies of its own stage; a recompute node those
  // of its own group (a value from another stage is a stored stage input).
  auto emit = [&](size_t n, bool as_recompute, std::optional<GroupKey> group) {
    ir::NodeCopyRules rules;
    rules.value = [&](ValueId v) {
      ValueId c = copy[static_cast<size_t>(v)];
      NodeId p = g.value(v).producer;
      bool use = c != ir::kNoId && (group ? s.groupOf(p) == *group : s.readsCopyOf(n, p));
      return use ? c : orig[static_cast<size_t>(v)];
    };
    if (as_recompute) {
      rules.name = [&](const std::string& base) {
        std::string name = base + ".rc";
        for (int i = 1; out.findValue(name) || g.findValue(name) || out.findLabel(name); ++i) {
          name = fmt::format("{}.rc{}", base, i);
        }
        return name;
      };
    }
    NodeId id = ir::copyNode(g, static_cast<NodeId>(n), out, rules, as_recompute ? &copy : &orig);
    ir::Node& c = out.node(id);
    if (as_recompute) c.phase = Phase::Recompute;
    // A recomputation holds no parameters of its own: the original node
    // already counts them (Note [Memory model]).
    if (as_recompute && c.cost) c.cost->persistent_bytes = 0;
    return id;
  };
  for (size_t n = 0; n < nn; ++n) {
    for (const GroupKey& key : gp.groups_before[n]) {
      RecomputeGroup grp{key.first, key.second, {}};
      for (NodeId m : gp.members[key]) {
        grp.nodes.push_back(emit(static_cast<size_t>(m), /*as_recompute=*/true, key));
        r.stage_of_node.push_back(key.first);
      }
      r.groups.push_back(std::move(grp));
    }
    emit(n, /*as_recompute=*/false, std::nullopt);
    r.stage_of_node.push_back(s.stage_of_node[n]);
  }
  std::vector<ValueId> outputs;
  for (ValueId v : g.outputs()) outputs.push_back(orig[static_cast<size_t>(v)]);
  out.setOutputs(std::move(outputs));
  return r;
}

}  // namespace

CheckpointMode parseCheckpointMode(std::string_view s) {
  checkOneOf(kCheckpointPassId, "checkpoint", s, kCheckpointModeNames);
  return s == "always" ? CheckpointMode::Always
         : s == "never" ? CheckpointMode::Never
                        : CheckpointMode::ExceptLast;
}

std::string_view name(CheckpointMode m) {
  switch (m) {
    case CheckpointMode::Always: return "always";
    case CheckpointMode::ExceptLast: return "except_last";
    case CheckpointMode::Never: return "never";
  }
  return "?";
}

CheckpointResult checkpoint(const ir::Graph& g, const std::vector<int32_t>& stage_of_node,
                            const CheckpointOptions& options) {
  const Staged s{g, stage_of_node};
  const int last_mb = checkStages(s, options);
  const std::vector<char> candidate = recomputeCandidates(g, options, last_mb);
  const std::vector<char> recompute = recomputeSet(s, candidate);
  GroupPlacement gp = placeGroups(s, recompute);
  return buildCheckpointed(s, gp);
}

}  // namespace modelpar::passes
