// Pass `schedule` (schedule.h): the task dependencies and Note [Global clock]
// (in schedule.h), run over any set of lanes: a lane per stage for GPipe,
// 1F1B and 1F1B*, a lane per device for interleaved 1F1B.
#include <algorithm>

#include "ir/check.h"
#include "passes/pipeline/schedule_impl.h"

namespace modelpar::passes::schedule_detail {

TaskEdges taskEdges(const ir::Graph& g, const Pipeline& P) {
  const size_t nt = P.numTasks();
  TaskEdges e;
  e.succ.assign(nt, {});
  e.num_preds.assign(nt, 0);
  e.in_edges.assign(nt, {});
  for (size_t i = 0; i < g.numNodes(); ++i) {
    const int32_t tv = P.task[i];
    if (tv < 0) continue;
    for (ir::ValueId v : g.nodes()[i].inputs()) {
      const ir::NodeId u = g.value(v).producer;
      if (u == ir::kNoId || P.task[static_cast<size_t>(u)] < 0) continue;
      const int32_t tu = P.task[static_cast<size_t>(u)];
      if (tu == tv) continue;
      e.succ[static_cast<size_t>(tu)].push_back(tv);
      ++e.num_preds[static_cast<size_t>(tv)];
      e.in_edges[static_cast<size_t>(tv)].emplace_back(u, static_cast<ir::NodeId>(i));
    }
  }
  return e;
}

namespace {

// Each stuck lane's next task and an edge it waits on (from a task that has
// not run).
std::string describeBlocked(const ir::Graph& g, const Pipeline& P, const TaskEdges& e,
                            const std::vector<std::vector<int32_t>>& lanes,
                            const std::vector<size_t>& pos, const std::vector<int32_t>& tick) {
  std::string blocked;
  for (size_t l = 0; l < lanes.size(); ++l) {
    if (pos[l] == lanes[l].size()) continue;
    const int32_t t = lanes[l][pos[l]];
    const auto& in = e.in_edges[static_cast<size_t>(t)];
    auto waiting = std::find_if(in.begin(), in.end(), [&](const auto& edge) {
      return tick[static_cast<size_t>(P.task[static_cast<size_t>(edge.first)])] < 0;
    });
    MP_INTERNAL_ASSERT(waiting != in.end(), "schedule: {} is stuck with nothing to wait for",
                       P.taskName(t));
    auto [u, v] = *waiting;
    blocked += fmt::format("; {} waits ({} reads {} of {})", P.taskName(t), g.nodeRef(v),
                           g.nodeRef(u), P.taskName(P.task[static_cast<size_t>(u)]));
  }
  return blocked;
}

}  // namespace

ClockRun runClock(const ir::Graph& g, const Pipeline& P, const TaskEdges& e,
                  const std::vector<std::vector<int32_t>>& lanes) {
  ClockRun run;
  run.tick.assign(P.numTasks(), -1);
  std::vector<int32_t> pending = e.num_preds;
  std::vector<size_t> pos(lanes.size(), 0);
  size_t left = 0;
  for (const auto& q : lanes) left += q.size();
  std::vector<int32_t> fired;
  for (int32_t t = 0; left > 0; ++t) {
    // Fire first, then release the readers: a task waits at least a tick
    // for what it reads (one task per lane per tick).
    fired.clear();
    for (size_t l = 0; l < lanes.size(); ++l) {
      const auto& q = lanes[l];
      size_t& p = pos[l];
      if (p < q.size() && pending[static_cast<size_t>(q[p])] == 0) fired.push_back(q[p++]);
    }
    if (fired.empty()) {
      run.blocked = describeBlocked(g, P, e, lanes, pos, run.tick);
      MP_INTERNAL_ASSERT(!run.blocked.empty(), "schedule: the clock stopped with tasks left");
      return run;
    }
    for (int32_t task : fired) {
      run.tick[static_cast<size_t>(task)] = t;
      for (int32_t v : e.succ[static_cast<size_t>(task)]) --pending[static_cast<size_t>(v)];
    }
    left -= fired.size();
  }
  return run;
}

}  // namespace modelpar::passes::schedule_detail
