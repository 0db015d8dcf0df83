// The backward split (backward_split.h, Note [Backward split]).
#include "passes/pipeline/backward_split.h"

#include "ir/check.h"

namespace modelpar::passes {

// Note [Backward split]
// ~~~~~~~~~~~~~~~~~~~~~
// Zero-bubble schedules (Qi et al. 2024, §2) run a backward in two parts: B,
// which computes the gradient the previous stage waits for, and W, which
// computes the weight gradients and can wait. In a captured training step
// both are nodes of one task (stage s, micro-batch k, phase bwd or
// recompute); the split is a property of the task's data flow:
//
//   B = the nodes of the task from which some value read by another stage's
//       task is reachable inside the task (the node itself included);
//   W = the rest of the task.
//
// The values another stage's task reads are what stage s sends back: the
// input gradient of its first layer (and the gradients of skip connections
// that enter it). Everything they depend on inside the task, recompute nodes
// included, must run before the send, so it is B. What is left feeds only
// weight gradients: `mm(gyᵀ, x)` of a linear layer, the bias's `sum`, and the
// accumulation acc_k = acc_(k-1) + g_k (a node with mb=k, read by the next
// micro-batch's accumulation on the same stage or by the final combination,
// never by another stage's task), so these land in W. Stage 0 sends nothing
// back: its whole task is W, and the zb-h1 order runs it as late as W's run.
//
// Nothing is computed twice: each node of a task is in exactly one part,
// decided once. A node both parts need (the upstream gradient through a
// layer's activation derivative, read by the input-gradient mm and by the
// weight-gradient mm; a recomputed activation) reaches a B reader, so it is
// in B, and W reads its value as any later node reads an earlier one: the
// value stays alive until W runs (lowering's liveness keeps it). That is the
// memory W costs: the values its nodes read, held from B to W.
//
// One pass over the nodes in reverse graph order decides it: a node's readers
// come after it, so when it is visited every reader is decided.
BackwardSplit splitBackward(const ir::Graph& g, std::span<const int32_t> stage_of_node) {
  const size_t nn = g.numNodes();
  MP_CHECK(stage_of_node.size() == nn, ConfigError,
           "modelpar {}: stage_of_node has {} entries for the {} nodes of graph @{}",
           kBackwardSplitId, stage_of_node.size(), nn, g.name());
  auto inBackwardTask = [&](const ir::Node& n) {
    return n.microbatch.has_value() &&
           (n.phase == ir::Phase::Backward || n.phase == ir::Phase::Recompute);
  };
  const std::vector<std::vector<ir::NodeId>> users = g.users();
  BackwardSplit out;
  out.part.assign(nn, BackwardPart::None);
  for (size_t i = nn; i-- > 0;) {
    const ir::Node& n = g.nodes()[i];
    if (!inBackwardTask(n)) continue;
    bool b = false;
    for (ir::ValueId v : n.outputs) {
      for (ir::NodeId r : users[static_cast<size_t>(v)]) {
        const auto ri = static_cast<size_t>(r);
        const ir::Node& reader = g.nodes()[ri];
        if (!reader.microbatch) continue;  // final (or shared) readers wait for the step
        const bool other_stage = stage_of_node[ri] != stage_of_node[i];
        const bool same_task = !other_stage && *reader.microbatch == *n.microbatch &&
                               inBackwardTask(reader);
        b = b || other_stage || (same_task && out.part[ri] == BackwardPart::B);
      }
    }
    out.part[i] = b ? BackwardPart::B : BackwardPart::W;
    ++(b ? out.num_b : out.num_w);
  }
  return out;
}

}  // namespace modelpar::passes
