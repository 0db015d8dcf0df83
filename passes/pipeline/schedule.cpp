// Pass `schedule` (pipeline/schedule.h).
#include "passes/pipeline/schedule.h"

#include <algorithm>
#include <cmath>
#include <numeric>

#include "ir/check.h"
#include "passes/cost/op_family.h"
#include "passes/option_names.h"
#include "passes/pipeline/backward_split.h"
#include "passes/pipeline/relay_skips.h"
#include "passes/pipeline/schedule_impl.h"

namespace modelpar::passes::schedule_detail {
namespace {

std::string mbText(const ir::Node& n) { return n.microbatch ? fmt::format("mb={}", *n.microbatch) : "no mb"; }

// 1a. Interleaved 1F1B's placement: n = p·v stages looping over the p
// devices, stage s on device s % p (Note [Interleaved 1F1B]).
void checkLoopingPlacement(Pipeline& P) {
  const auto id = kSchedulePassId;
  const int p = P.num_devices;
  for (int s = 0; s < P.n; ++s) {
    const int d = P.device_of_stage[static_cast<size_t>(s)];
    MP_CHECK(d == s % p, ConfigError,
             "modelpar {}: schedule 'interleaved' places stage s on device s % p (looping over "
             "the {} devices), but stage {} is on device {}; give device_of_stage[{}] = {}",
             id, p, s, d, s, s % p);
  }
  MP_CHECK(P.n % p == 0, ConfigError,
           "modelpar {}: schedule 'interleaved' needs v stages on each of the {} devices (n = p * "
           "v), but device_of_stage has {} entries; give a multiple of {}", id, p, P.n, p);
  P.interleaved = true;
  P.virtual_stages = P.n / p;
}

// 1a. ZB-H1 runs one stage per device (Note [ZB-H1]).
void checkOneStagePerDevice(const Pipeline& P) {
  std::vector<int> stage_on(static_cast<size_t>(P.num_devices), -1);
  for (int s = 0; s < P.n; ++s) {
    int& other = stage_on[static_cast<size_t>(P.device_of_stage[static_cast<size_t>(s)])];
    MP_CHECK(other < 0, ConfigError,
             "modelpar {}: schedule 'zb-h1' runs one stage per device, but stages {} and {} are "
             "both on device {}; give each stage its own device (or use '1f1b*' or "
             "'interleaved' for stages that share one)",
             kSchedulePassId, other, s, P.device_of_stage[static_cast<size_t>(s)]);
    other = s;
  }
}

// 1. The schedule kind, relay_skips, and one stage per node.
void checkOptions(const ir::Graph& g, const PipelineScheduleOptions& o) {
  const auto id = kSchedulePassId;
  MP_CHECK(o.kind == "gpipe" || o.kind == "1f1b" || o.kind == "1f1b*" || o.kind == "interleaved" ||
               o.kind == "zb-h1" || o.kind == "zb-v",
           ConfigError,
           "modelpar {}: unknown schedule '{}'; use \"gpipe\", \"1f1b\", \"1f1b*\", "
           "\"interleaved\", \"zb-h1\" or \"zb-v\"", id, o.kind);
  MP_CHECK(!o.relay_skips, ConfigError,
           "modelpar {}: relay_skips rewrites the graph; call lowerPipeline (or relaySkips first)", id);
  const size_t nn = g.numNodes();
  MP_CHECK(o.stage_of_node.size() == nn, ConfigError,
           "modelpar {}: stage_of_node has {} entries for the {} nodes of graph @{}", id,
           o.stage_of_node.size(), nn, g.name());
}

// 1. Each node's role and stage, and the number of micro-batches; returns the
// largest stage of a node that is not shared.
int assignRoles(const ir::Graph& g, Pipeline& P) {
  const auto id = kSchedulePassId;
  const size_t nn = g.numNodes();
  int max_stage = -1;
  for (size_t i = 0; i < nn; ++i) {
    const ir::Node& n = g.nodes()[i];
    auto ni = static_cast<ir::NodeId>(i);
    if (n.microbatch) {
      MP_CHECK(*n.microbatch >= 0, ConfigError, "modelpar {}: node {} has mb={}; micro-batches count from 0",
               id, g.nodeRef(ni), *n.microbatch);
      MP_CHECK(n.phase != ir::Phase::Update, ConfigError,
               "modelpar {}: update node {} has mb={}; updates run once per step (drop its mb)", id,
               g.nodeRef(ni), *n.microbatch);
      P.m = std::max(P.m, *n.microbatch + 1);
    } else {
      bool fin = n.phase == ir::Phase::Update;
      for (ir::ValueId v : n.inputs()) {
        ir::NodeId pr = g.value(v).producer;
        fin = fin || (pr != ir::kNoId && P.role[static_cast<size_t>(pr)] != Role::Shared);
      }
      P.role[i] = fin ? Role::Final : Role::Shared;
    }
    int s = P.stage[i];
    MP_CHECK(s >= 0 || P.role[i] == Role::Shared, ConfigError,
             "modelpar {}: node {} ({}) has stage {}; only shared nodes may leave it -1", id,
             g.nodeRef(ni), mbText(n), s);
    MP_CHECK(s >= -1, ConfigError, "modelpar {}: node {} has stage {}", id, g.nodeRef(ni), s);
    if (P.role[i] != Role::Shared) max_stage = std::max(max_stage, s);
  }
  return max_stage;
}

// 1. The number of stages, each stage's device, and the number of devices.
void assignDevices(const ir::Graph& g, const PipelineScheduleOptions& o, int max_stage,
                   Pipeline& P) {
  const auto id = kSchedulePassId;
  const size_t nn = g.numNodes();
  P.n = o.device_of_stage.empty() ? std::max(max_stage + 1, 1)
                                  : static_cast<int>(o.device_of_stage.size());
  for (size_t i = 0; i < nn; ++i) {
    MP_CHECK(P.role[i] == Role::Shared || P.stage[i] < P.n, ConfigError,
             "modelpar {}: node {} is on stage {}, which has no device (device_of_stage has {} "
             "entries)", id, g.nodeRef(static_cast<ir::NodeId>(i)), P.stage[i], P.n);
  }
  P.device_of_stage = o.device_of_stage;
  if (P.device_of_stage.empty()) {
    P.device_of_stage.resize(static_cast<size_t>(P.n));
    std::iota(P.device_of_stage.begin(), P.device_of_stage.end(), 0);
  }
  for (int s = 0; s < P.n; ++s) {
    int d = P.device_of_stage[static_cast<size_t>(s)];
    MP_CHECK(d >= 0, ConfigError, "modelpar {}: stage {} has device {}; give every stage a device >= 0",
             id, s, d);
    P.num_devices = std::max(P.num_devices, d + 1);
  }
}

// 1. What the schedule kind asks of the placement, each stage's warmup, and
// the periodic pattern.
void applyKind(const PipelineScheduleOptions& o, Pipeline& P) {
  const auto id = kSchedulePassId;
  P.m = std::max(P.m, 1);
  if (o.kind == "interleaved") checkLoopingPlacement(P);
  if (o.kind == "zb-h1") checkOneStagePerDevice(P);
  if (o.kind == "zb-v") checkVPlacement(P);  // Note [ZB-V]
  P.zero_bubble = scheduleTraits(o.kind).splits_backward;
  P.warmup.assign(static_cast<size_t>(P.n), P.m);
  P.reverse_backward = o.kind == "gpipe";
  if (o.kind == "1f1b" || o.kind == "zb-h1") {
    for (int s = 0; s < P.n; ++s) P.warmup[static_cast<size_t>(s)] = std::clamp(P.n - s, 1, P.m);
  } else if (o.kind == "1f1b*") {
    MP_CHECK(o.in_flight.size() == static_cast<size_t>(P.n), ConfigError,
             "modelpar {}: 1f1b* needs in_flight for each of the {} stages, got {}", id, P.n,
             o.in_flight.size());
    for (int s = 0; s < P.n; ++s) {
      int w = o.in_flight[static_cast<size_t>(s)];
      MP_CHECK(w >= 1, ConfigError, "modelpar {}: in_flight[{}] = {}; a stage keeps at least 1 micro-batch in flight",
               id, s, w);
      P.warmup[static_cast<size_t>(s)] = std::min(w, P.m);
    }
  }
  if (o.pattern) {
    const PatternTimes& pt = *o.pattern;
    const auto n = static_cast<size_t>(P.n);
    MP_CHECK(o.kind == "1f1b*", ConfigError,
             "modelpar {}: a periodic pattern is MadPipe's 1F1B* schedule; schedule '{}' has none",
             id, o.kind);
    MP_CHECK(std::isfinite(pt.period_us) && pt.period_us > 0 && pt.fwd_start_us.size() == n &&
                 pt.bwd_start_us.size() == n && pt.fwd_shift.size() == n && pt.bwd_shift.size() == n,
             ConfigError,
             "modelpar {}: the periodic pattern needs a period > 0 and a start and shift per "
             "stage for each of the {} stages", id, P.n);
    P.pattern = &pt;
  }
}

// 1. Each micro-batch node's task: its stage, micro-batch and F, B or W.
void assignTasks(const ir::Graph& g, Pipeline& P) {
  const size_t nn = g.numNodes();
  P.task.assign(nn, -1);
  // zb-h1, zb-v: each backward task's W part (Note [Backward split]).
  const BackwardSplit split = P.zero_bubble ? splitBackward(g, P.stage) : BackwardSplit{};
  for (size_t i = 0; i < nn; ++i) {
    const ir::Node& n = g.nodes()[i];
    if (P.role[i] != Role::InTask) continue;
    bool bwd = n.phase == ir::Phase::Backward || n.phase == ir::Phase::Recompute;
    const bool w = !split.part.empty() && split.part[i] == BackwardPart::W;
    P.task[i] = P.taskId(P.stage[i], *n.microbatch, w ? kW : bwd ? kB : kF);
  }
}

// 1. Edge rules between micro-batch nodes.
void checkEdges(const ir::Graph& g, const PipelineScheduleOptions& o, const Pipeline& P) {
  const auto id = kSchedulePassId;
  const size_t nn = g.numNodes();
  for (size_t i = 0; i < nn; ++i) {
    if (P.role[i] != Role::InTask) continue;
    auto vi = static_cast<ir::NodeId>(i);
    for (ir::ValueId v : g.nodes()[i].inputs()) {
      ir::NodeId u = g.value(v).producer;
      if (u == ir::kNoId) continue;
      auto ui = static_cast<size_t>(u);
      MP_CHECK(P.role[ui] != Role::Final, ConfigError,
               "modelpar {}: micro-batch node {} ({}) reads {}, which combines micro-batches; a "
               "micro-batch cannot wait for the whole step (give {} an mb, or move the reader "
               "after the step)", id, g.nodeRef(vi), mbText(g.nodes()[i]), g.nodeRef(u), g.nodeRef(u));
      if (P.role[ui] != Role::InTask) continue;
      // Backward here: B or W.
      int fu = P.kindOf(P.task[ui]) == kF ? kF : kB, fv = P.kindOf(P.task[i]) == kF ? kF : kB;
      int su = P.stage[ui], sv = P.stage[i];
      MP_CHECK(!(fu == kB && fv == kF), ConfigError,
               "modelpar {}: forward node {} reads backward node {}; a forward node must not wait "
               "for a backward one (check their phases)", id, g.nodeRef(vi), g.nodeRef(u));
      MP_CHECK(!(fu == kF && fv == kF && su > sv), ConfigError,
               "modelpar {}: forward edge {} (stage {}) -> {} (stage {}) goes to an earlier stage; "
               "stages must not decrease along forward edges", id, g.nodeRef(u), su, g.nodeRef(vi), sv);
      MP_CHECK(!(fu == kB && fv == kB && su < sv), ConfigError,
               "modelpar {}: backward edge {} (stage {}) -> {} (stage {}) goes to a later stage; "
               "stages must not increase along backward edges", id, g.nodeRef(u), su, g.nodeRef(vi), sv);
      if (fu == kF && fv == kF && o.kind == "1f1b*" && !o.pattern) {  // a pattern orders itself
        int wu = P.warmup[static_cast<size_t>(su)], wv = P.warmup[static_cast<size_t>(sv)];
        MP_CHECK(wu >= wv, ConfigError,
                 "modelpar {}: in_flight increases along forward edge {} (stage {}, {} in flight) "
                 "-> {} (stage {}, {} in flight); a later stage cannot keep more micro-batches in "
                 "flight than an earlier one (MadPipe's group numbers never increase)",
                 id, g.nodeRef(u), su, wu, g.nodeRef(vi), sv, wv);
      }
    }
  }
}

// 1. Options, roles, stages, and the edge rules.
Pipeline check(const ir::Graph& g, const PipelineScheduleOptions& o) {
  checkOptions(g, o);
  Pipeline P;
  P.role.assign(g.numNodes(), Role::InTask);
  P.stage = o.stage_of_node;
  const int max_stage = assignRoles(g, P);
  assignDevices(g, o, max_stage, P);
  applyKind(o, P);
  assignTasks(g, P);
  checkEdges(g, o, P);
  return P;
}

// Note [Lowering the periodic pattern]
// ~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~
// MadPipe's phase 2 (seed 004 §4.3, partition_ilp.cpp) computes, for a plan
// whose stages share a device, a periodic pattern: per stage, the start of
// its forward and backward within a period T and the micro-batch shift, such
// that no two operations on a device overlap and each micro-batch's
// operations follow one another. Its in-flight counts alone do not say how a
// device interleaves its stages: ordering them by the global clock (one task
// per stage per tick) may run them in an order whose period is longer than T.
// With the pattern, every task gets its start in the pattern's time,
// (k + shift) * T + start; each stage's sequence and each device's order are
// sorted by it (ties: clock tick, then stage). The ILP's dependency rows make
// these times increase along every edge of a micro-batch, so the order is
// one a device can run; the clock still checks it, and the simulated period
// of the lowered Program is the pattern's (tests: schedule_test.cpp).
//
// 2. The task order of stage s (see the header's table).
std::vector<int32_t> stageSequence(const Pipeline& P, int s) {
  MP_INTERNAL_ASSERT(!P.interleaved && !P.v_shape, "schedule: stage lanes for a device-lane order");
  if (P.zero_bubble) return zeroBubbleSequence(P, s);  // Note [ZB-H1]
  std::vector<int32_t> seq;
  const int m = P.m, w = P.warmup[static_cast<size_t>(s)];
  if (P.pattern != nullptr) {
    for (int k = 0; k < m; ++k) {
      seq.push_back(P.taskId(s, k, kF));
      seq.push_back(P.taskId(s, k, kB));
    }
    std::stable_sort(seq.begin(), seq.end(), [&](int32_t a, int32_t b) {
      return P.patternStart(a) < P.patternStart(b);
    });
    return seq;
  }
  for (int k = 0; k < w; ++k) seq.push_back(P.taskId(s, k, kF));
  if (P.reverse_backward) {
    for (int k = m - 1; k >= 0; --k) seq.push_back(P.taskId(s, k, kB));
    return seq;
  }
  for (int j = 0; j + w < m; ++j) {
    seq.push_back(P.taskId(s, j, kB));
    seq.push_back(P.taskId(s, j + w, kF));
  }
  for (int j = m - w; j < m; ++j) seq.push_back(P.taskId(s, j, kB));
  return seq;
}

// Each task's nodes, in the order step 2 gives them.
struct TaskNodes {
  std::vector<std::vector<ir::NodeId>> head, rest;  // per task
  std::vector<char> used;                           // per task: has nodes
};

// 2. Tasks' nodes: recompute nodes that read no backward node of their own
// task first, then the rest, each in graph order.
TaskNodes taskNodes(const ir::Graph& g, const Pipeline& P) {
  const size_t nn = g.numNodes();
  const size_t nt = P.numTasks();
  TaskNodes tn;
  tn.head.assign(nt, {});
  tn.rest.assign(nt, {});
  tn.used.assign(nt, 0);
  std::vector<char> in_head(nn, 0);
  for (size_t i = 0; i < nn; ++i) {
    int32_t t = P.task[i];
    if (t < 0) continue;
    const ir::Node& n = g.nodes()[i];
    bool h = n.phase == ir::Phase::Recompute;
    for (ir::ValueId v : n.inputs()) {
      ir::NodeId u = g.value(v).producer;
      if (u != ir::kNoId && P.task[static_cast<size_t>(u)] == t) h = h && in_head[static_cast<size_t>(u)];
    }
    in_head[i] = h;
    (h ? tn.head : tn.rest)[static_cast<size_t>(t)].push_back(static_cast<ir::NodeId>(i));
    tn.used[static_cast<size_t>(t)] = 1;
  }
  return tn;
}

// 3. Note [Global clock] with a lane per stage: each stage's tasks (empty
// ones dropped) and their ticks; throws naming a blocked task when the stage
// orders contradict the data dependencies.
std::vector<int32_t> stageClock(const ir::Graph& g, const Pipeline& P, const TaskNodes& tn,
                                std::vector<std::vector<int32_t>>& lanes) {
  lanes.assign(static_cast<size_t>(P.n), {});
  for (int s = 0; s < P.n; ++s) {
    for (int32_t t : stageSequence(P, s)) {
      if (tn.used[static_cast<size_t>(t)]) lanes[static_cast<size_t>(s)].push_back(t);
    }
  }
  ClockRun run = runClock(g, P, taskEdges(g, P), lanes);
  MP_CHECK(run.ok(), ConfigError,
           "modelpar {}: the stage orders contradict the graph's dependencies{}; micro-batches "
           "must be independent and stages ordered along the edges",
           kSchedulePassId, run.blocked);
  return std::move(run.tick);
}

// 3. Global clock (a lane per stage, or per device for interleaved 1F1B,
// Note [Interleaved 1F1B], and ZB-V, Note [ZB-V]), then every task sorted by
// (tick, stage), or by its start in the periodic pattern (Note [Lowering the
// periodic pattern]).
// A device runs at most one task per tick in its own lane, so sorting by tick
// keeps each device's order.
std::vector<int32_t> orderTasks(const ir::Graph& g, const Pipeline& P, const TaskNodes& tn) {
  std::vector<std::vector<int32_t>> lanes;
  std::vector<int32_t> tick;
  if (P.interleaved || P.v_shape) {
    DeviceOrders o = P.v_shape ? zbvOrders(g, P, taskEdges(g, P), tn.used)
                               : interleavedOrders(g, P, taskEdges(g, P), tn.used);
    lanes = std::move(o.lanes);
    tick = std::move(o.tick);
  } else {
    tick = stageClock(g, P, tn, lanes);
  }
  std::vector<int32_t> tasks;
  for (const auto& q : lanes) tasks.insert(tasks.end(), q.begin(), q.end());
  std::sort(tasks.begin(), tasks.end(), [&](int32_t a, int32_t b) {
    if (P.pattern != nullptr) {  // Note [Lowering the periodic pattern]
      double sa = P.patternStart(a), sb = P.patternStart(b);
      if (sa != sb) return sa < sb;
    }
    int32_t ta = tick[static_cast<size_t>(a)], tb = tick[static_cast<size_t>(b)];
    return ta != tb ? ta < tb : P.stageOf(a) < P.stageOf(b);
  });
  return tasks;
}

// 3b. With a pattern, its times must increase along every task edge.
void checkPatternOrder(const ir::Graph& g, const Pipeline& P, const std::vector<int32_t>& tasks) {
  if (P.pattern == nullptr) return;
  std::vector<int32_t> pos(P.numTasks(), -1);
  for (size_t k = 0; k < tasks.size(); ++k) pos[static_cast<size_t>(tasks[k])] = static_cast<int32_t>(k);
  for (size_t i = 0; i < g.numNodes(); ++i) {
    if (P.task[i] < 0) continue;
    for (ir::ValueId v : g.nodes()[i].inputs()) {
      ir::NodeId u = g.value(v).producer;
      if (u == ir::kNoId || P.task[static_cast<size_t>(u)] < 0) continue;
      MP_CHECK(pos[static_cast<size_t>(P.task[static_cast<size_t>(u)])] <=
                   pos[static_cast<size_t>(P.task[i])],
               ConfigError,
               "modelpar {}: the periodic pattern starts {} before {}, which it reads from "
               "({} reads {}); the pattern does not fit this graph",
               kSchedulePassId, P.taskName(P.task[i]), P.taskName(P.task[static_cast<size_t>(u)]),
               g.nodeRef(static_cast<ir::NodeId>(i)), g.nodeRef(u));
    }
  }
}

// 4. The global order of task and final nodes.
std::vector<ir::NodeId> anchoredOrder(const ir::Graph& g, const Pipeline& P, const TaskNodes& tn,
                                      const std::vector<int32_t>& tasks) {
  std::vector<ir::NodeId> anchored;  // without shared nodes
  for (int32_t t : tasks) {
    for (ir::NodeId v : tn.head[static_cast<size_t>(t)]) anchored.push_back(v);
    for (ir::NodeId v : tn.rest[static_cast<size_t>(t)]) anchored.push_back(v);
  }
  for (size_t i = 0; i < g.numNodes(); ++i) {
    if (P.role[i] == Role::Final) anchored.push_back(static_cast<ir::NodeId>(i));
  }
  return anchored;
}

// 5. Shared nodes: right before their first reader in that order, on its
// stage (-1: nobody reads it; it runs first on its own stage). Sets the
// shared nodes' P.stage; returns each one's anchor (-1 for other nodes).
std::vector<int32_t> anchorSharedNodes(const ir::Graph& g, Pipeline& P,
                                       const std::vector<ir::NodeId>& anchored,
                                       const std::vector<std::vector<ir::NodeId>>& users) {
  const size_t nn = g.numNodes();
  std::vector<int32_t> gpos(nn, -1);
  for (size_t k = 0; k < anchored.size(); ++k) gpos[static_cast<size_t>(anchored[k])] = static_cast<int32_t>(k);
  std::vector<int32_t> anchor(nn, -1);
  for (size_t i = nn; i-- > 0;) {
    if (P.role[i] != Role::Shared) continue;
    int32_t best = INT32_MAX, best_stage = -1;
    for (ir::ValueId o : g.nodes()[i].outputs) {
      for (ir::NodeId r : users[static_cast<size_t>(o)]) {
        auto ri = static_cast<size_t>(r);
        int32_t a = P.role[ri] == Role::Shared ? anchor[ri] : gpos[ri];
        if (a < best) best = a, best_stage = P.stage[ri];
      }
    }
    if (best == INT32_MAX) {
      best = -1;
      best_stage = P.stage[i] >= 0 && P.stage[i] < P.n ? P.stage[i] : 0;
    }
    anchor[i] = best;
    P.stage[i] = best_stage;
  }
  return anchor;
}

// 5b. Note [In-place writes to graph inputs] (plan_placement.cpp), in a
// pipeline: a functionalized graph's `copy_(%input, %new)` (a decode
// step's cache position, batch norm's running statistics outside the
// micro-batches) is read by nobody, and ran first on its stage, before the
// nodes that read the input's old value (measured: a static KV cache wrote
// its position before the step's index_copy read it, out of bounds). It
// runs last, on the stage of the input's first reader, whose device holds
// the input (lowering's rule), so the caller's tensor is the one written.
// (Writes in micro-batches and after them keep the stage they were given:
// planPipeline gives them the input's, stagesOfNodes.)
void anchorInputWritesLast(const ir::Graph& g, Pipeline& P, size_t num_anchored,
                           const std::vector<std::vector<ir::NodeId>>& users,
                           std::vector<int32_t>& anchor) {
  const std::vector<ir::ValueId> roots = storageRoots(g);
  for (size_t i = 0; i < g.numNodes(); ++i) {
    const ir::Node& n = g.nodes()[i];
    const ir::ValueId input = P.role[i] == Role::Shared ? writtenInput(g, n, roots) : ir::kNoId;
    if (input == ir::kNoId) continue;
    bool read = false;
    for (ir::ValueId o : n.outputs) read = read || !users[static_cast<size_t>(o)].empty();
    if (read) continue;
    anchor[i] = static_cast<int32_t>(num_anchored);
    for (ir::NodeId r : users[static_cast<size_t>(input)]) {
      if (static_cast<size_t>(r) == i) continue;
      P.stage[i] = P.stage[static_cast<size_t>(r)];  // users are in graph order
      break;
    }
  }
}

// 5c. The whole order: each shared node before its anchor; every node after
// what it reads.
std::vector<ir::NodeId> globalOrder(const ir::Graph& g, const Pipeline& P,
                                    const std::vector<ir::NodeId>& anchored,
                                    const std::vector<int32_t>& anchor) {
  const size_t nn = g.numNodes();
  std::vector<std::vector<ir::NodeId>> before(anchored.size() + 1);  // before[k]: before anchored[k]
  for (size_t i = 0; i < nn; ++i) {
    if (P.role[i] == Role::Shared) before[static_cast<size_t>(std::max(anchor[i], 0))].push_back(static_cast<ir::NodeId>(i));
  }
  std::vector<ir::NodeId> order;
  order.reserve(nn);
  for (size_t k = 0; k <= anchored.size(); ++k) {
    order.insert(order.end(), before[k].begin(), before[k].end());
    if (k < anchored.size()) order.push_back(anchored[k]);
  }
  MP_INTERNAL_ASSERT(order.size() == nn, "schedule ordered {} of {} nodes", order.size(), nn);
  std::vector<int32_t> at(nn, -1);
  for (size_t k = 0; k < nn; ++k) at[static_cast<size_t>(order[k])] = static_cast<int32_t>(k);
  for (size_t i = 0; i < nn; ++i) {
    for (ir::ValueId v : g.nodes()[i].inputs()) {
      ir::NodeId u = g.value(v).producer;
      MP_INTERNAL_ASSERT(u == ir::kNoId || at[static_cast<size_t>(u)] < at[i],
                         "schedule runs {} before {}, which it reads", g.nodeRef(static_cast<ir::NodeId>(i)),
                         g.nodeRef(u));
    }
  }
  return order;
}

// 6. Project the global order onto the devices.
Placement projectOntoDevices(const ir::Graph& g, const Pipeline& P, const std::vector<ir::NodeId>& order) {
  Placement p;
  p.placer = std::string(kSchedulePassId);
  p.num_devices = P.num_devices;
  p.node_device.assign(g.numNodes(), 0);
  p.order.assign(static_cast<size_t>(P.num_devices), {});
  for (ir::NodeId v : order) {
    int d = P.device_of_stage[static_cast<size_t>(P.stage[static_cast<size_t>(v)])];
    p.node_device[static_cast<size_t>(v)] = d;
    p.order[static_cast<size_t>(d)].push_back(v);
  }
  checkPlacement(g, p);
  return p;
}

}  // namespace
}  // namespace modelpar::passes::schedule_detail

namespace modelpar::passes {

Placement schedulePipeline(const ir::Graph& g, const PipelineScheduleOptions& options) {
  namespace sd = schedule_detail;
  sd::Pipeline P = sd::check(g, options);
  const sd::TaskNodes tn = sd::taskNodes(g, P);
  const std::vector<int32_t> tasks = sd::orderTasks(g, P, tn);
  sd::checkPatternOrder(g, P, tasks);
  const std::vector<ir::NodeId> anchored = sd::anchoredOrder(g, P, tn, tasks);
  const std::vector<std::vector<ir::NodeId>> users = g.users();
  std::vector<int32_t> anchor = sd::anchorSharedNodes(g, P, anchored, users);
  sd::anchorInputWritesLast(g, P, anchored.size(), users, anchor);
  const std::vector<ir::NodeId> order = sd::globalOrder(g, P, anchored, anchor);
  return sd::projectOntoDevices(g, P, order);
}

PipelineProgram lowerPipeline(const ir::Graph& g, const PipelineScheduleOptions& options,
                              const LowerOptions& lower_options) {
  PipelineScheduleOptions o = options;
  PipelineProgram out{g, o.stage_of_node, {}, ir::Program(ir::Graph(g.name()), 1)};
  if (o.relay_skips) {
    RelayedGraph r = relaySkips(g, o.stage_of_node);
    out.graph = std::move(r.graph);
    out.stage_of_node = std::move(r.stage_of_node);
    o.relay_skips = false;
    o.stage_of_node = out.stage_of_node;
  }
  out.placement = schedulePipeline(out.graph, o);
  out.program = lower(out.graph, out.placement, lower_options);
  return out;
}

}  // namespace modelpar::passes
