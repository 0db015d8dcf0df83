// Pass `strategy-search` (strategy_search.h): enumerate, bound, plan and
// simulate, keep the fastest that fits.
#include "passes/search/strategy_search.h"

#include "passes/search/candidate_reasons.h"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <limits>
#include <numeric>

#include "ir/check.h"
#include "ir/error.h"
#include "passes/cost/cost_model.h"
#include "passes/option_names.h"
#include "passes/pipeline/batch_symbol.h"
#include "passes/pipeline/layer_order.h"

namespace modelpar::passes {
namespace {

std::vector<std::string> orAll(const std::vector<std::string>& given,
                               std::span<const std::string_view> all, std::string_view option) {
  for (const std::string& v : given) checkOneOf(kStrategySearchId, option, v, all);
  if (!given.empty()) return given;
  return {all.begin(), all.end()};
}

double secondsSince(std::chrono::steady_clock::time_point t0) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
}

int64_t peakOf(const SimulationReport& r) {
  int64_t peak = 0;
  for (const DeviceReport& d : r.devices) peak = std::max(peak, d.peak_bytes);
  return peak;
}

StrategyCandidate candidate(std::string kind) {
  StrategyCandidate c;
  c.kind = std::move(kind);
  return c;
}

// The stages per device searched for `schedule` (Note [Schedules in the
// search]): 1 for a schedule of one stage per device, 2 for zb-v's V; for
// "interleaved" the v named, else those of kSearchedVirtualStages
// whose N·v stages the step's `layers` can give; zb-v when its 2N stages
// fit. A schedule named is planned whatever the layers (v = 2), so that its
// failure says why; `layers` < 0: not known, v = 2.
std::vector<int> searchedVirtualStages(const StrategySearchOptions& o, const std::string& schedule,
                                       int layers) {
  const bool named = std::find(o.schedules.begin(), o.schedules.end(), schedule) != o.schedules.end();
  auto fits = [&](int v) { return layers < 0 || int64_t{v} * o.devices <= layers; };
  using Stages = ScheduleTraits::StagesPerDevice;
  const Stages stages = scheduleTraits(schedule).stages_per_device;
  if (stages == Stages::Two) return named || fits(2) ? std::vector<int>{2} : std::vector<int>{};
  if (stages == Stages::One) return {1};
  if (!o.virtual_stages.empty()) return o.virtual_stages;
  std::vector<int> vs;
  for (int v : kSearchedVirtualStages) {
    if (layers < 0 ? v == 2 : fits(v)) vs.push_back(v);
  }
  if (vs.empty() && named) vs.push_back(2);
  return vs;
}

// 1. The candidates in enumeration order (strategy_search.h).
std::vector<StrategyCandidate> enumerate(const StrategySearchOptions& o, int64_t batch,
                                         bool batched, int layers) {
  std::vector<StrategyCandidate> out;
  if (o.one_device) out.push_back(candidate("one-device"));
  if (o.placements && o.devices >= 2) {
    for (const std::string& p : orAll(o.placers, kPlacerNames, "placer")) {
      StrategyCandidate c = candidate("placement");
      c.placer = p;
      out.push_back(std::move(c));
    }
  }
  if (!o.pipelines || o.devices < 2 || !batched) return out;
  std::vector<int> ms = o.microbatches;
  if (ms.empty()) {
    for (int64_t m = o.devices; m <= batch; m *= 2) ms.push_back(static_cast<int>(m));
  }
  for (int m : ms) {
    MP_CHECK(m >= 1 && m <= batch, ConfigError,
             "modelpar {}: microbatches={} is not valid for batch size {}; give 1 to {}",
             kStrategySearchId, m, batch, batch);
  }
  const auto partitions = orAll(o.partitions, kPartitionMethodNames, "partition");
  const auto checkpoints = orAll(o.checkpoints, kPipelineCheckpointNames, "checkpoint");
  for (int v : o.virtual_stages) {
    MP_CHECK(v >= 2 && v <= kMaxDevices / o.devices, ConfigError,
             "modelpar {}: virtual_stages={} is not valid on {} devices; give stages per device "
             "for schedule 'interleaved' from 2 to {}", kStrategySearchId, v, o.devices,
             kMaxDevices / o.devices);
  }
  for (const std::string& s : orAll(o.schedules, kPipelineScheduleNames, "schedule")) {
    for (int v : searchedVirtualStages(o, s, layers)) {
      for (int m : ms) {
        for (const std::string& part : partitions) {
          if (part == "madpipe" && s != "1f1b*") continue;  // MadPipe's stages need its schedule
          // It chooses how many stages to cut; interleaved and zb-v need
          // exactly N·v (searched when named: Note [Schedules in the search]).
          if (part == "balance-time-comm" && severalStagesPerDevice(s) && o.partitions.empty()) {
            continue;
          }
          for (const std::string& ck : checkpoints) {
            StrategyCandidate c = candidate("pipeline");
            c.schedule = s;
            c.virtual_stages = v;
            c.partition = part;
            c.checkpoint = ck;
            c.microbatches = m;
            out.push_back(std::move(c));
          }
        }
      }
    }
  }
  return out;
}

}  // namespace

std::string_view toString(CandidateStatus s) {
  switch (s) {
    case CandidateStatus::Ok: return "ok";
    case CandidateStatus::DoesNotFit: return "does not fit";
    case CandidateStatus::Failed: return "failed";
    case CandidateStatus::Pruned: return "pruned";
  }
  return "?";
}

std::string StrategyCandidate::label() const {
  if (kind == "placement") return "placement " + placer;
  if (kind == "pipeline" && schedule.empty()) return "pipelines";
  if (kind == "pipeline") {
    return fmt::format("pipeline {}{} m={} {} checkpoint={}", schedule,
                       virtual_stages > 1 ? fmt::format(" v={}", virtual_stages) : "",
                       microbatches, partition, checkpoint);
  }
  return kind;
}

bool beatsBest(double step_us, int index, double best_us, int best_index) {
  if (best_index < 0) return true;
  const double tie = 1e-9 * std::max(std::abs(best_us), 1.0);
  if (step_us < best_us - tie) return true;
  return step_us <= best_us + tie && index < best_index;
}

const StrategyCandidate& StrategySearch::chosenCandidate() const {
  MP_INTERNAL_ASSERT(chosen >= 0 && chosen < static_cast<int>(candidates.size()),
                     "strategy-search: no chosen candidate");
  return candidates[static_cast<size_t>(chosen)];
}

int StrategySearch::count(CandidateStatus s) const {
  return static_cast<int>(std::count_if(candidates.begin(), candidates.end(),
                                        [&](const StrategyCandidate& c) { return c.status == s; }));
}

std::string StrategySearch::table() const {
  // A failure reason shared by several candidates is printed once, below
  // the table, with its count; each row names it by number (candidate_reasons.h).
  const std::vector<ReasonGroup> groups = groupFailureReasons(candidates);
  std::vector<int> group_of(candidates.size(), -1);
  for (size_t g = 0; g < groups.size(); ++g) {
    for (int i : groups[g].candidates) group_of[static_cast<size_t>(i)] = static_cast<int>(g);
  }
  size_t width = 9;  // "candidate"
  for (const StrategyCandidate& c : candidates) width = std::max(width, c.label().size());
  std::string out = fmt::format("{:<2}{:<{}} {:>10} {:>11} {:>11}  {}\n", "", "candidate", width,
                                "step", "peak memory", "lower bound", "status");
  bool shared = false;
  for (size_t i = 0; i < candidates.size(); ++i) {
    const StrategyCandidate& c = candidates[i];
    bool ok = c.status == CandidateStatus::Ok;
    std::string why = c.reason.empty() ? "" : ": " + c.reason;
    if (group_of[i] >= 0 && groups[static_cast<size_t>(group_of[i])].candidates.size() > 1) {
      why = fmt::format(": reason [{}]", group_of[i] + 1);
      shared = true;
    }
    out += fmt::format("{:<2}{:<{}} {:>10} {:>11} {:>11}  {}{}\n",
                       static_cast<int>(i) == chosen ? "*" : "", c.label(), width,
                       ok ? formatMicros(c.step_us) : "-", ok ? formatBytes(c.peak_bytes) : "-",
                       formatMicros(c.lower_bound_us), toString(c.status), why);
  }
  if (shared) {
    out += "reasons:\n";
    for (size_t g = 0; g < groups.size(); ++g) {
      if (groups[g].candidates.size() < 2) continue;
      out += fmt::format("  [{}] {}: {}\n", g + 1, describeGroup(groups[g], candidates),
                         groups[g].reason);
    }
  }
  out += fmt::format("search: {} candidates, {} simulated, {} pruned by bound, {} dropped, {:.3f} s\n",
                     candidates.size(), count(CandidateStatus::Ok),
                     count(CandidateStatus::Pruned),
                     count(CandidateStatus::DoesNotFit) + count(CandidateStatus::Failed), seconds);
  return out;
}

namespace {

// The batch symbol, for the costs at size B; without one there are no
// pipelines (why is kept for the candidate that says so).
struct BatchOfStep {
  std::string symbol, no_pipeline_reason;
};

BatchOfStep batchOfStep(const ir::Graph& step, const StrategySearchOptions& o) {
  BatchOfStep b;
  try {
    b.symbol = findBatchSymbol(step, o.microbatch.batch_symbol, o.microbatch.batch_dims).symbol;
  } catch (const ConfigError& e) {
    b.no_pipeline_reason = e.what();
  }
  return b;
}

// What every placement candidate plans with.
PlacementOptions basePlacementOptions(const StrategySearchOptions& o, const BatchOfStep& b,
                                      int64_t batch) {
  PlacementOptions base;
  base.devices = o.devices;
  base.machine = o.machine;
  base.memory_bytes = o.memory_bytes;
  base.msct_lp_time_limit_s = o.msct_lp_time_limit_s;
  base.msct_lp_iteration_limit = o.msct_lp_iteration_limit;
  base.dump_dir = "";
  base.record_timeline = o.record_timeline;
  if (!b.symbol.empty()) base.cost_options.symbol_sizes[b.symbol] = batch;
  return base;
}

// The layers the step's pipelines are cut from (planPipeline's first pass),
// which bounds the stages per device searched; -1 when there are no
// pipelines to search or the layers cannot be ordered (planning says why).
int layerCount(const ir::Graph& step, const StrategySearchOptions& o, const BatchOfStep& b) {
  if (!o.pipelines || o.devices < 2 || b.symbol.empty()) return -1;
  try {
    return static_cast<int>(orderLayers(step).layers.size());
  } catch (const InternalError&) {
    throw;
  } catch (const Error&) {
    return -1;
  }
}

// 1. The candidates (enumerate), and a failed one saying why there are no
// pipelines when the step has no batch symbol.
std::vector<StrategyCandidate> candidates(const StrategySearchOptions& o, int64_t batch,
                                          const BatchOfStep& b, int layers) {
  std::vector<StrategyCandidate> out = enumerate(o, batch, !b.symbol.empty(), layers);
  if (o.pipelines && o.devices >= 2 && b.symbol.empty()) {  // say why there are none
    StrategyCandidate c = candidate("pipeline");
    c.status = CandidateStatus::Failed;
    c.reason = b.no_pipeline_reason;
    out.push_back(std::move(c));
  }
  MP_CHECK(!out.empty(), ConfigError,
           "modelpar {}: no candidate to search (one_device, placements and pipelines are all "
           "off, or pipelines only with devices={})",
           kStrategySearchId, o.devices);
  return out;
}

// 2. The bound (Note [A lower bound per candidate]) of every candidate not
// already failed; result.t1_us set.
void boundCandidates(const ir::Graph& step, const DeviceModel& machine, const PlacementOptions& base,
                     const std::string& symbol, const StrategySearchOptions& o,
                     StrategySearch& result) {
  ir::Graph costed = step;
  estimateCosts(costed, machine, base.cost_options);
  double t1 = 0, launch = std::numeric_limits<double>::infinity();
  for (const DeviceSpec& d : machine.devices()) launch = std::min(launch, d.launch_overhead_us);
  // A smaller overhead gives a smaller bound (m >= 1), so the least holds for every m.
  for (const auto& [m, us] : o.microbatch_launch_overhead_us) launch = std::min(launch, us);
  // L counts the nodes each micro-batch repeats: those that read or write a
  // value of the batch's size (a weight's transpose runs once).
  auto batched = [&](ir::ValueId v) {
    for (const ir::Dim& d : costed.value(v).type.shape) {
      if (!symbol.empty() && dimMentions(d, symbol)) return true;
    }
    return false;
  };
  double per_mb = 0;
  for (size_t n = 0; n < costed.numNodes(); ++n) {
    const ir::Node& node = costed.node(static_cast<ir::NodeId>(n));
    t1 += node.cost->time_us;
    std::vector<ir::ValueId> touched = node.inputs();
    touched.insert(touched.end(), node.outputs.begin(), node.outputs.end());
    if (std::any_of(touched.begin(), touched.end(), batched)) {
      per_mb += std::min(launch, node.cost->time_us);
    }
  }
  result.t1_us = t1;
  for (StrategyCandidate& c : result.candidates) {
    if (c.status == CandidateStatus::Failed) continue;
    int devices = c.kind == "one-device" ? 1 : o.devices;
    double n = devices;
    if (machine.hostCores() > 0) n = std::min(n, machine.hostCores());  // Note [Shared host cores]
    int m = c.kind == "pipeline" ? c.microbatches : 1;
    c.lower_bound_us = ((t1 - per_mb) + m * per_mb) / n + machine.stepOverheadUs() +
                       (devices - 1) * machine.workerOverheadUs();
  }
}

// A pipeline candidate's options: the search's, with the launch overhead
// measured at its micro-batch count where one was given.
PipelinePlanOptions pipelineOptions(const StrategyCandidate& c, const StrategySearchOptions& o,
                                    const DeviceModel& machine, int64_t batch) {
  PipelinePlanOptions po;
  po.devices = o.devices;
  po.microbatches = c.microbatches;
  po.batch_size = batch;
  po.microbatch = o.microbatch;
  po.schedule = c.schedule;
  po.virtual_stages = c.virtual_stages > 1 ? c.virtual_stages : 0;  // 0: the schedule's own
  po.partition = c.partition;
  po.checkpoint = c.checkpoint;
  po.portals = o.portals;
  po.machine = o.machine;
  for (const auto& [m, us] : o.microbatch_launch_overhead_us) {
    if (m != c.microbatches) continue;
    DeviceModel mm = machine;
    for (int d = 0; d < mm.numDevices(); ++d) {
      DeviceSpec s = mm.device(d);
      s.launch_overhead_us = us;
      mm.setDevice(d, s);
    }
    po.machine = mm;
  }
  po.memory_bytes = o.memory_bytes;
  po.dump_dir = "";
  po.madpipe_pattern_time_limit_s = o.madpipe_pattern_time_limit_s;
  po.madpipe_pattern_node_limit = o.madpipe_pattern_node_limit;
  po.record_timeline = o.record_timeline;
  return po;
}

// 3a. One candidate planned and simulated: its status, step and peak set,
// its plan in `placement` or `pipeline`. Does not fit and other modelpar
// errors are the candidate's result; an InternalError propagates.
void planCandidate(const ir::Graph& step, StrategyCandidate& c, const StrategySearchOptions& o,
                   const PlacementOptions& base, const DeviceModel& machine, int64_t batch,
                   std::optional<PlacementPlan>& placement, std::optional<PipelinePlan>& pipeline) {
  const auto c0 = std::chrono::steady_clock::now();
  try {
    if (c.kind == "pipeline") {
      pipeline = planPipeline(step, pipelineOptions(c, o, machine, batch));
      c.step_us = pipeline->stepTimeUs();
      c.peak_bytes = peakOf(pipeline->simulation);
    } else {
      PlacementOptions po = base;
      if (c.kind == "one-device") {
        po.devices = 1;
        // Device 0's capacity (a per-device list keeps its first entry).
        if (po.memory_bytes.size() > 1) po.memory_bytes = {o.memory_bytes.front()};
      } else {
        po.placer = c.placer;
      }
      placement = planPlacement(step, po);
      c.step_us = placement->stepTimeUs();
      c.peak_bytes = peakOf(placement->simulation);
    }
    c.status = CandidateStatus::Ok;
  } catch (const PlanDoesNotFitError& e) {
    c.status = CandidateStatus::DoesNotFit;
    c.reason = e.what();
  } catch (const InternalError&) {
    throw;  // a planner's bug is not a property of the candidate
  } catch (const Error& e) {
    c.status = CandidateStatus::Failed;
    c.reason = e.what();
  }
  c.plan_seconds = secondsSince(c0);
}

// Whether the pipeline like c but with checkpoint='never' was planned and
// fits: c (per_layer, Note [Recompute per layer]) would then be that plan.
// Both have the same bound and never comes first, so it was tried before.
bool neverFits(const std::vector<StrategyCandidate>& all, const StrategyCandidate& c) {
  return std::any_of(all.begin(), all.end(), [&](const StrategyCandidate& x) {
    return x.kind == "pipeline" && x.checkpoint == "never" && x.schedule == c.schedule &&
           x.virtual_stages == c.virtual_stages && x.microbatches == c.microbatches &&
           x.partition == c.partition && x.status == CandidateStatus::Ok;
  });
}

// 3. Plan and simulate in order of bound; stop when the bound cannot win.
void planInBoundOrder(const ir::Graph& step, const StrategySearchOptions& o,
                      const PlacementOptions& base, const DeviceModel& machine, int64_t batch,
                      StrategySearch& result) {
  std::vector<size_t> order(result.candidates.size());
  std::iota(order.begin(), order.end(), size_t{0});
  std::stable_sort(order.begin(), order.end(), [&](size_t a, size_t b) {
    return result.candidates[a].lower_bound_us < result.candidates[b].lower_bound_us;
  });
  double best = std::numeric_limits<double>::infinity();
  for (size_t i : order) {
    StrategyCandidate& c = result.candidates[i];
    if (c.status == CandidateStatus::Failed) continue;  // decided before planning
    // Pruned when even its bound cannot win (a tie within rounding goes to
    // the earlier candidate, so the one-device plan, whose bound is its
    // time, is not pruned by a placement that simulates the same step).
    if (o.prune && !beatsBest(c.lower_bound_us, static_cast<int>(i), best, result.chosen)) {
      c.reason = fmt::format("bound {} cannot beat best {}", formatMicros(c.lower_bound_us),
                             formatMicros(best));
      continue;
    }
    if (o.prune && c.checkpoint == "per_layer" && neverFits(result.candidates, c)) {
      c.status = CandidateStatus::Pruned;
      c.reason = "checkpoint='never' fits, and per_layer then recomputes nothing";
      continue;
    }
    std::optional<PlacementPlan> placement;
    std::optional<PipelinePlan> pipeline;
    planCandidate(step, c, o, base, machine, batch, placement, pipeline);
    if (c.status == CandidateStatus::Ok &&
        beatsBest(c.step_us, static_cast<int>(i), best, result.chosen)) {
      best = c.step_us;
      result.chosen = static_cast<int>(i);
      result.placement = std::move(placement);
      result.pipeline = std::move(pipeline);
    }
  }
}

// 4. No candidate fits and runs: PlanDoesNotFitError with each reason once,
// with the candidates that gave it (candidate_reasons.h).
void checkOneWasChosen(const StrategySearch& result, const StrategySearchOptions& o) {
  if (result.chosen >= 0) return;
  std::string reasons;
  for (const ReasonGroup& g : groupFailureReasons(result.candidates)) {
    reasons += fmt::format("\n  {}: {}", describeGroup(g, result.candidates), g.reason);
  }
  MP_THROW(PlanDoesNotFitError,
           "modelpar {}: none of the {} candidates on {} devices fits and runs; use more "
           "devices or more memory per device. Candidates:{}",
           kStrategySearchId, result.candidates.size(), o.devices, reasons);
}

}  // namespace

StrategySearch searchStrategy(const ir::Graph& step, const StrategySearchOptions& o) {
  const auto t0 = std::chrono::steady_clock::now();
  checkDevices(kStrategySearchId, o.devices);
  MP_CHECK(o.batch_size && *o.batch_size >= 1, ConfigError,
           "modelpar {}: batch_size is required (an int >= 1): the search costs the step at the "
           "real batch size",
           kStrategySearchId);
  const int64_t batch = *o.batch_size;
  const BatchOfStep b = batchOfStep(step, o);
  const PlacementOptions base = basePlacementOptions(o, b, batch);
  const DeviceModel machine = planMachine(base);  // checks devices, memory and machine
  StrategySearch result;
  result.candidates = candidates(o, batch, b, layerCount(step, o, b));
  boundCandidates(step, machine, base, b.symbol, o, result);
  planInBoundOrder(step, o, base, machine, batch, result);
  result.seconds = secondsSince(t0);
  checkOneWasChosen(result, o);
  return result;
}

}  // namespace modelpar::passes
