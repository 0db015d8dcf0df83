// planPipeline() (plan_pipeline.h): option checks, then the issue-6 passes on
// copies of the step graph, each timed and the result verified.
#include "passes/plan_pipeline.h"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <limits>
#include <map>
#include <numeric>

#include "ir/check.h"
#include "ir/receive_order.h"
#include "ir/verifier.h"
#include "passes/cost/op_family.h"
#include "passes/option_names.h"
#include "passes/pipeline/fuse_accumulation.h"
#include "passes/pipeline/layer_order.h"
#include "passes/pipeline/recompute_choice.h"
#include "passes/pipeline/schedule.h"

namespace modelpar::passes {
namespace {

// PipelinePlanOptions::virtual_stages resolved: 0 is 2 for "interleaved"
// (Megatron's smallest interleaving) and "zb-v" (its V), 1 otherwise.
int virtualStages(const PipelinePlanOptions& o) {
  if (o.virtual_stages > 0) return o.virtual_stages;
  return scheduleTraits(o.schedule).default_virtual_stages;
}

void checkVirtualStages(const PipelinePlanOptions& o) {
  MP_CHECK(o.virtual_stages >= 0, ConfigError,
           "modelpar {}: virtual_stages={} is not valid; it takes an int >= 0 (0: 2 for "
           "schedule='interleaved' and 'zb-v', 1 otherwise)", kPlanPipelineId, o.virtual_stages);
  using Stages = ScheduleTraits::StagesPerDevice;
  const Stages stages = scheduleTraits(o.schedule).stages_per_device;
  MP_CHECK(stages != Stages::Two || o.virtual_stages == 0 || o.virtual_stages == 2, ConfigError,
           "modelpar {}: virtual_stages={} is not valid with schedule='zb-v', which runs exactly "
           "2 stages per device, placed in a V (Note [ZB-V]); give virtual_stages=2 or leave it "
           "unset", kPlanPipelineId, o.virtual_stages);
  MP_CHECK(o.virtual_stages <= 1 || stages != Stages::One, ConfigError,
           "modelpar {}: virtual_stages={} needs schedule='interleaved', the schedule that runs "
           "several stages per device in turn (got schedule='{}'); give schedule='interleaved' "
           "(or 'zb-v' for 2, placed in a V) or leave virtual_stages unset", kPlanPipelineId,
           o.virtual_stages, o.schedule);
  // The partition cuts devices x v stages (checkDevices' range for its devices).
  MP_CHECK(o.virtual_stages <= kMaxDevices / o.devices, ConfigError,
           "modelpar {}: virtual_stages={} on devices={} makes {} stages; at most {} stages are "
           "planned; use virtual_stages={} or fewer", kPlanPipelineId, o.virtual_stages,
           o.devices, int64_t{o.virtual_stages} * o.devices, kMaxDevices, kMaxDevices / o.devices);
}

void checkOptions(const PipelinePlanOptions& o) {
  checkDevices(kPlanPipelineId, o.devices);
  MP_CHECK(o.microbatches >= 1, ConfigError,
           "modelpar {}: microbatches={} is not valid; it takes an int >= 1", kPlanPipelineId,
           o.microbatches);
  MP_CHECK(o.batch_size.has_value() && *o.batch_size >= 1, ConfigError,
           "modelpar {}: batch_size is required (the full batch size, the value of the batch "
           "symbol), got {}", kPlanPipelineId,
           o.batch_size ? fmt::format("{}", *o.batch_size) : std::string("none"));
  MP_CHECK(o.microbatches <= *o.batch_size, ConfigError,
           "modelpar {}: microbatches={} is more than the batch size {}; give at most {} "
           "micro-batches", kPlanPipelineId, o.microbatches, *o.batch_size, *o.batch_size);
  checkOneOf(kPlanPipelineId, "schedule", o.schedule, kPipelineScheduleNames);
  checkOneOf(kPlanPipelineId, "partition", o.partition, kPartitionMethodNames);
  checkOneOf(kPlanPipelineId, "checkpoint", o.checkpoint, kPipelineCheckpointNames);
  MP_CHECK(o.partition != "madpipe" || o.schedule == "1f1b*", ConfigError,
           "modelpar {}: partition='madpipe' plans for its own schedule; give schedule='1f1b*' "
           "with it (got '{}')", kPlanPipelineId, o.schedule);
  checkVirtualStages(o);
  MP_CHECK(o.weight_copies >= 0, ConfigError,
           "modelpar {}: weight_copies={} is not valid; it takes a number >= 0", kPlanPipelineId,
           o.weight_copies);
}

// Stage of every node: its layer's, else the latest stage among the nodes it
// reads (forward order), else 0.
std::vector<int32_t> stagesOfNodes(const ir::Graph& g,
                                   const std::map<std::string, int32_t, std::less<>>& stage_of) {
  std::vector<int32_t> stage(g.nodes().size(), 0);
  for (size_t n = 0; n < g.nodes().size(); ++n) {
    const ir::Node& node = g.nodes()[n];
    auto it = node.layer.empty() ? stage_of.end() : stage_of.find(node.layer);
    if (it != stage_of.end()) {
      stage[n] = it->second;
      continue;
    }
    int32_t s = 0;
    for (ir::ValueId v : node.inputs()) {
      ir::NodeId p = g.value(v).producer;
      if (p != ir::kNoId) s = std::max(s, stage[static_cast<size_t>(p)]);
    }
    stage[n] = s;
  }
  // Note [In-place writes to graph inputs] (plan_placement.cpp), in a
  // pipeline: a write to a graph input, or to a micro-batch's slice of one,
  // runs on the stage of the input's first reader in graph order, whose
  // device holds the input (lowering's rule); on another it would write a
  // received copy (measured: a static KV cache's new entries, written back
  // per micro-batch by nodes of the last layer, were lost, and the next decode
  // step read stale keys).
  const std::vector<ir::ValueId> root = storageRoots(g);
  const std::vector<std::vector<ir::NodeId>> users = g.users();
  for (size_t n = 0; n < g.nodes().size(); ++n) {
    const ir::ValueId input = writtenInput(g, g.nodes()[n], root);
    if (input == ir::kNoId) continue;
    for (ir::NodeId r : users[static_cast<size_t>(input)]) {
      if (static_cast<size_t>(r) == n) continue;
      stage[n] = stage[static_cast<size_t>(r)];
      break;
    }
  }
  return stage;
}

double nodeTimeSum(const ir::Graph& g) {
  double t = 0;
  for (const ir::Node& n : g.nodes()) t += n.cost ? n.cost->time_us : 0.0;
  return t;
}

}  // namespace

double PipelinePlan::speedup() const {
  return stepTimeUs() > 0 ? single_device_us / stepTimeUs() : 1.0;
}

double PipelinePlan::idealSpeedup() const {
  const double n = numStages(), m = static_cast<double>(microbatch_sizes.size());
  const double v = virtual_stages, p = n / v;  // v = 1: n·m / (m + n - 1)
  // ZB-H1 with T_F = T_B = T_W: (p-1) idle slots in 3m + (p-1) (Note [ZB-H1]).
  if (schedule == "zb-h1") return n * 3 * m / (3 * m + n - 1);
  // ZB-V with T_F = T_B = T_W per stage: 6m busy in max(6m + p-1, 4(m+p) - 2)
  // (Note [ZB-V]).
  if (schedule == "zb-v") return p * 6 * m / std::max(6 * m + p - 1, 4 * (m + p) - 2);
  return n * m / (v * m + p - 1);
}

double PipelinePlan::bubbleFraction() const {
  if (stepTimeUs() <= 0) return 0;
  double busy = 0;
  int used = 0;
  for (const DeviceReport& d : simulation.devices) {
    if (d.num_instructions == 0) continue;
    busy += d.compute_busy_us;
    ++used;
  }
  return used == 0 ? 0 : 1.0 - busy / (used * stepTimeUs());
}

std::string PipelinePlan::summary() const {
  std::string out = fmt::format(
      "modelpar pipeline: {} stages on {} devices, {} micro-batches of {}, schedule {}{}, "
      "partition {}, checkpoint {}, {}\n",
      numStages(), program.numDevices(), microbatch_sizes.size(),
      microbatch_sizes.empty() ? 0 : microbatch_sizes.front(), schedule,
      virtual_stages > 1 ? fmt::format(" (v={} stages per device, placed {})", virtual_stages,
                                       schedule == "zb-v" ? "in a V" : "looping")
                         : std::string(),
      partition.method, checkpoint, portals ? "portals" : "skips relayed stage by stage");
  if (checkpoint == "per_layer") {
    std::string names;
    for (const std::string& l : recomputed_layers) names += (names.empty() ? "" : ", ") + l;
    out += fmt::format("  recomputed: {} of {} layers{}{}\n", recomputed_layers.size(),
                       chain.size(),
                       recomputed_layers.empty() ? " (the step fits without)"
                       : recompute_every_microbatch ? ", in every micro-batch"
                                                    : ", in every micro-batch but the last",
                       names.empty() ? "" : ": " + names);
  }
  if (numStages() < machine.numDevices()) {
    out += fmt::format(
        "  note: {} devices were asked for and partition {} made {} stages: no cut into more "
        "stages had a shorter period than its {} (their transfers cost more than the compute "
        "they spread, or, for madpipe, they do not fit); partition='balance-time' gives one "
        "stage per device\n",
        machine.numDevices(), partition.method, numStages(), formatMicros(partition.period_us));
  }
  for (int s = 0; s < numStages(); ++s) {
    int begin = partition.stage_begin[static_cast<size_t>(s)];
    int end = partition.stageEnd(s, chain.size());
    double t = 0;
    for (int l = begin; l < end; ++l) t += chain.time(l);
    out += fmt::format("  stage {} on device {}: layers {}..{} ({} .. {}), {} per micro-batch{}\n",
                       s, partition.stage_device[static_cast<size_t>(s)], begin, end - 1,
                       chain.layers[static_cast<size_t>(begin)].name,
                       chain.layers[static_cast<size_t>(end - 1)].name, formatMicros(t),
                       partition.stage_activations.empty()
                           ? std::string()
                           : fmt::format(", keeps {} micro-batches of activations",
                                         partition.stage_activations[static_cast<size_t>(s)]));
  }
  out += fmt::format("  partition model: period {}, memory {}\n", formatMicros(partition.period_us),
                     [&] {
                       std::string m;
                       for (size_t d = 0; d < partition.memory_bytes.size(); ++d) {
                         m += fmt::format("{}dev{} {}", m.empty() ? "" : ", ", d,
                                          formatBytes(partition.memory_bytes[d]));
                       }
                       return m;
                     }());
  out += fmt::format(
      "  simulated step {} (one device {}): speed-up {:.2f}x, ideal {:.2f}x "
      "({}), bubble {:.1f} %\n",
      formatMicros(stepTimeUs()), formatMicros(single_device_us), speedup(), idealSpeedup(),
      schedule == "zb-v"      ? "p·6m/max(6m+p-1, 4(m+p)-2), F=B=W"
      : virtual_stages > 1    ? "p·v·m/(v·m+p-1)"
      : schedule == "zb-h1"   ? "n·3m/(3m+n-1), F=B=W"
                              : "n·m/(m+n-1)",
      100.0 * bubbleFraction());
  for (size_t d = 0; d < simulation.devices.size(); ++d) {
    const DeviceReport& r = simulation.devices[d];
    out += fmt::format("  device {}: busy {}, peak memory {} of {}, {} instructions\n", d,
                       formatMicros(r.compute_busy_us), formatBytes(r.peak_bytes),
                       formatBytes(machine.device(static_cast<int>(d)).memory_bytes),
                       r.num_instructions);
  }
  out += fmt::format("  transfers: {}\n", simulation.num_transfers);
  for (const PassStats& s : stats) {
    out += fmt::format("  pass {:<12} {:>9.3f} ms  {}\n", s.pass, s.seconds * 1e3, s.detail);
  }
  return out;
}

namespace {

// 0. The module names as a chain of layers (merging cycles, placing
//    unlayered nodes); every later pass works on this graph.
LayerOrder runLayerOrder(PassRunner& timer, const ir::Graph& step) {
  LayerOrder order = timer.run("layer-order", [&] { return orderLayers(step); });
  timer.last().detail = fmt::format("{} layers ({} merged, {} unlayered nodes placed)",
                                    order.layers.size(), order.merged_layers,
                                    order.unlayered_nodes);
  timer.verifyGraph(order.graph);
  return order;
}

// 1. Stages from one micro-batch: the step at the first micro-batch's size,
//    costed and read as a chain of layers.
LayerChain chainOfOneMicrobatch(PassRunner& timer, const ir::Graph& step, const LayerOrder& order,
                                const DeviceModel& machine, const PipelinePlan& plan,
                                const PipelinePlanOptions& o) {
  MicrobatchOptions one = o.microbatch;
  one.microbatches = 1;
  one.batch_size = plan.microbatch_sizes.front();
  ir::Graph unit = timer.run("microbatch-1", [&] { return microbatch(order.graph, one); });
  timer.verifyGraph(unit);
  timer.run("cost-1", [&] { return estimateCosts(unit, machine, o.cost_options); });
  timer.verifyGraph(unit);
  LayerChain chain = timer.run("chain", [&] {
    ChainOptions co;
    co.weight_copies = o.weight_copies;
    co.inherit_layers = true;  // nodes microbatch adds (output cat, loss sum)
    co.layer_order = order.layers;
    return chainFromGraph(unit, co);
  });
  timer.last().detail = fmt::format("{} layers", chain.size());
  // N devices are N stages, one per device (MadPipe may share a device):
  // a chain shorter than that cannot give them, and says so.
  if (chain.size() < o.devices) {
    std::string names;
    for (const ChainLayer& l : chain.layers) names += (names.empty() ? "" : ", ") + l.name;
    MP_THROW(ConfigError,
             "modelpar {}: graph @{} has {} layer{} ({}), so it cannot be cut into {} stages for "
             "devices={}; use devices={} or fewer, or a model with more modules (the layers are "
             "the modules that make the graph's nodes)",
             kPlanPipelineId, step.name(), chain.size(), chain.size() == 1 ? "" : "s",
             names, o.devices, o.devices, chain.size());
  }
  // Interleaved, ZB-V: v stages per device.
  const int v = plan.virtual_stages;
  MP_CHECK(chain.size() >= o.devices * v, ConfigError,
           "modelpar {}: graph @{} has {} layers, so it cannot be cut into devices={} x "
           "virtual_stages={} = {} stages for schedule '{}'; {}fewer devices, or a model with "
           "more modules (the layers are the modules that make the graph's nodes)",
           kPlanPipelineId, step.name(), chain.size(), o.devices, v, o.devices * v, o.schedule,
           o.schedule == "zb-v" ? std::string("use ")
                                : fmt::format("use virtual_stages={} or fewer, ", chain.size() / o.devices));
  return chain;
}

// 1b (interleaved 1F1B, ZB-V). The devices x v stages `cut` placed looping,
//     stage s on device s % devices, or for ZB-V in a V, stage s on device s
//     for s < devices and 2·devices-1-s after (Note [ZB-V]), and evaluated
//     on those devices (the partition counted each stage's memory alone,
//     without a limit).
StagePartition placeVirtualStages(const LayerChain& chain, const StagePartition& cut,
                                  PartitionOptions po, int devices,
                                  const std::vector<int64_t>& capacity, int v,
                                  const std::string& schedule) {
  const int stages = devices * v;
  const bool vee = schedule == "zb-v";
  MP_CHECK(cut.numStages() == stages, ConfigError,
           "modelpar {}: partition='{}' cut the {} layers into {} stage{}, not the devices={} x "
           "virtual_stages={} = {} that schedule '{}' places {} (it leaves out cuts whose "
           "transfers cost more than the compute they spread); use partition='balance-time' or "
           "'balance-size', which cut into exactly that many, or {}", kPlanPipelineId,
           cut.method, chain.size(), cut.numStages(), cut.numStages() == 1 ? "" : "s", devices, v,
           stages, schedule, vee ? "in a V" : "looping",
           vee ? "fewer devices" : "fewer virtual stages");
  std::vector<int> device(static_cast<size_t>(stages));
  for (int s = 0; s < stages; ++s) {
    device[static_cast<size_t>(s)] = !vee ? s % devices : s < devices ? s : stages - 1 - s;
  }
  po.devices = devices;
  po.memory_bytes = *std::min_element(capacity.begin(), capacity.end());
  po.device_memory_bytes = capacity;
  StagePartition p = evaluatePartition(chain, cut.stage_begin, device, po, cut.method);
  if (!p.fits) {
    const auto worst = static_cast<size_t>(mostOverCapacity(p.memory_bytes, po));
    MP_THROW(PlanDoesNotFitError,
             "modelpar {}: the {} plan of {} stages placed {} over {} devices needs {} on device "
             "{} of {} under {} with virtual_stages={}; use {}more devices, more memory or "
             "checkpointing", kPlanPipelineId, cut.method, stages, vee ? "in a V" : "looping",
             devices, formatBytes(p.memory_bytes[worst]), worst, formatBytes(capacity[worst]), schedule,
             v, vee ? "" : "fewer virtual stages, ");
  }
  return p;
}

// 1b. The chain partitioned into stages on the devices; plan.partition and
//     plan.stage_of_layer set. Returns each layer's stage by name.
std::map<std::string, int32_t, std::less<>> runPartition(PassRunner& timer, const DeviceModel& machine,
                                                         PipelinePlan& plan,
                                                         const PipelinePlanOptions& o) {
  PartitionOptions po;
  po.method = o.partition;
  po.devices = o.devices;
  po.microbatches = static_cast<int>(plan.microbatch_sizes.size());
  // Each device's own capacity: the stages on a larger device may hold more
  // (MadPipe plans with the smallest on every device).
  // Note [The simulated peak decides]. The balance-* cuts do not depend on
  // memory: their partition's model (partition.h) would only refuse, and it
  // counts the worst of everything at once (3 copies of the weights, both
  // cut buffers, every activation a stage keeps), about 2x the simulated
  // peak of small steps (tests/python/test_memory_limit_sweep.py: the least
  // limit accepted lay at 1.5-2.5x it). Their plans are held to the
  // simulated peak alone (runSimulate), which the executor measured equal
  // on every device tried (bench/memory_measured_vs_simulated.py). 1F1B*
  // and MadPipe choose their in-flight counts and cuts by the model, so it
  // keeps their limit.
  const bool model_decides = o.schedule == "1f1b*" || o.partition == "madpipe";
  std::vector<int64_t> capacity;
  for (int d = 0; d < o.devices; ++d) {
    capacity.push_back(model_decides ? machine.device(d).memory_bytes
                                     : std::numeric_limits<int64_t>::max());
  }
  po.memory_bytes = *std::min_element(capacity.begin(), capacity.end());
  po.device_memory_bytes = capacity;
  const int v = plan.virtual_stages;
  if (v > 1) {  // devices x v stages, their memory counted per device by placeVirtualStages
    po.devices = o.devices * v;
    po.memory_bytes = std::numeric_limits<int64_t>::max();
    po.device_memory_bytes.clear();
  }
  if (machine.numDevices() > 1) {
    po.bandwidth_bytes_per_s = machine.link(0, 1).bandwidth;
    po.latency_us = machine.link(0, 1).latency_us;
  }
  po.schedule = *parsePipelineSchedule(o.schedule);
  po.recompute = o.checkpoint != "never";
  po.madpipe_pattern_time_limit_s = o.madpipe_pattern_time_limit_s;
  po.madpipe_pattern_node_limit = o.madpipe_pattern_node_limit;
  plan.partition = timer.run("partition", [&] {
    StagePartition cut = partitionChain(plan.chain, po);
    return v > 1 ? placeVirtualStages(plan.chain, cut, po, o.devices, capacity, v, o.schedule) : cut;
  });
  timer.last().detail = fmt::format("{} stages, period {}", plan.partition.numStages(),
                                    formatMicros(plan.partition.period_us));

  std::map<std::string, int32_t, std::less<>> stage_of;
  plan.stage_of_layer.assign(static_cast<size_t>(plan.chain.size()), 0);
  for (int s = 0; s < plan.partition.numStages(); ++s) {
    for (int l = plan.partition.stage_begin[static_cast<size_t>(s)];
         l < plan.partition.stageEnd(s, plan.chain.size()); ++l) {
      plan.stage_of_layer[static_cast<size_t>(l)] = s;
      stage_of[plan.chain.layers[static_cast<size_t>(l)].name] = s;
    }
  }
  return stage_of;
}

// 2. The whole step, micro-batched (gradient sums fused) and costed;
//    plan.single_device_us set.
ir::Graph microbatchStep(PassRunner& timer, const ir::Graph& step, const ir::Graph& ordered,
                         const DeviceModel& machine, PipelinePlan& plan,
                         const PipelinePlanOptions& o) {
  MicrobatchOptions all = o.microbatch;
  all.microbatches = o.microbatches;
  all.batch_size = o.batch_size;
  // The order its backwards run in (zb-h1's W's, which hold the sums, run in
  // micro-batch order: Note [ZB-H1]).
  all.accumulate_in_reverse = o.schedule == "gpipe";
  // A profiled node time includes the device's per-op overhead, which each
  // micro-batch's copy pays whole.
  all.launch_overhead_us = machine.device(0).launch_overhead_us;
  ir::Graph mb = timer.run("microbatch", [&] { return microbatch(ordered, all); });
  timer.last().detail = fmt::format("{} -> {} nodes", step.nodes().size(), mb.nodes().size());
  timer.verifyGraph(mb);
  FusedAccumulation fused = timer.run("fuse-accumulation", [&] { return fuseAccumulation(mb); });
  timer.last().detail = fmt::format("{} sums of products", fused.num_fused);
  mb = std::move(fused.graph);
  timer.verifyGraph(mb);
  timer.run("cost", [&] { return estimateCosts(mb, machine, o.cost_options); });
  timer.verifyGraph(mb);
  plan.single_device_us = nodeTimeSum(mb);
  return mb;
}

// 2b. Checkpointed per stage (only the layers in co.layers when given).
CheckpointResult runCheckpoint(PassRunner& timer, const ir::Graph& mb,
                               const std::vector<int32_t>& stages, const CheckpointOptions& co) {
  CheckpointResult ck = timer.run("checkpoint", [&] { return checkpoint(mb, stages, co); });
  timer.last().detail = fmt::format("{} recompute groups", ck.groups.size());
  timer.verifyGraph(ck.graph);
  return ck;
}

// The schedule pass's options for a checkpointed graph.
PipelineScheduleOptions scheduleOptions(const CheckpointResult& ck, const PipelinePlan& plan,
                                        const PipelinePlanOptions& o) {
  PipelineScheduleOptions so;
  so.kind = o.schedule;
  so.stage_of_node = ck.stage_of_node;
  so.device_of_stage.assign(plan.partition.stage_device.begin(),
                            plan.partition.stage_device.end());
  if (o.schedule == "1f1b*") so.in_flight = plan.partition.stage_activations;
  if (o.schedule == "1f1b*" && plan.partition.pattern) {  // MadPipe's phase 2, executed
    const PeriodicPattern& pat = *plan.partition.pattern;
    so.pattern = PatternTimes{pat.period_us, pat.fwd_start_us, pat.bwd_start_us, pat.fwd_shift,
                              pat.bwd_shift};
  }
  so.relay_skips = !o.portals;
  return so;
}

// Scheduled and lowered: MadPipe's periodic pattern where it has one and
// the graph agrees, else the schedule's clock. `patterned` says which. For
// ranks, with the receives in their senders' order (what runs).
PipelineProgram lowerScheduled(const CheckpointResult& ck, const PipelinePlan& plan,
                               const PipelinePlanOptions& o, bool& patterned) {
  PipelineScheduleOptions so = scheduleOptions(ck, plan, o);
  patterned = so.pattern.has_value();
  auto ranked = [&](PipelineProgram pp) {
    if (o.receive_in_send_order) pp.program = ir::receiveInSendOrder(pp.program);
    return pp;
  };
  try {
    return ranked(lowerPipeline(ck.graph, so));
  } catch (const ConfigError&) {
    if (!so.pattern) throw;
    // The pattern was computed on the chain; a graph edge it does not
    // model may contradict it: the clock's 1F1B* order then.
    so.pattern.reset();
    patterned = false;
    return ranked(lowerPipeline(ck.graph, so));
  }
}

// 2c. Scheduled and lowered (lowerScheduled), timed and verified.
PipelineProgram runSchedule(PassRunner& timer, const CheckpointResult& ck, const PipelinePlan& plan,
                            const PipelinePlanOptions& o) {
  bool patterned = false;
  PipelineProgram pp = timer.run("schedule", [&] { return lowerScheduled(ck, plan, o, patterned); });
  timer.last().detail = fmt::format("{} devices{}", pp.program.numDevices(),
                                    patterned ? ", MadPipe's periodic pattern" : "");
  timer.verifyProgram(pp.program);
  return pp;
}

// 2d. Simulated, and every device's simulated peak within its memory.
SimulationReport runSimulate(PassRunner& timer, PipelineProgram& pp, const DeviceModel& machine,
                             const PipelinePlanOptions& o) {
  SimulateOptions sim_options;
  sim_options.record_timeline = o.record_timeline;
  SimulationReport sim = timer.run("simulate", [&] { return simulate(pp.program, machine, sim_options); });
  timer.last().detail = fmt::format("step {}", formatMicros(sim.step_time_us));
  timer.verifyWith(pp.program.graph(), &pp.program, [] {}, std::string());
  for (size_t d = 0; d < sim.devices.size(); ++d) {
    int64_t cap = machine.device(static_cast<int>(d)).memory_bytes;
    int64_t peak = sim.devices[d].peak_bytes;
    MP_CHECK(peak <= cap, PlanDoesNotFitError,
             "modelpar {}: the pipelined step does not fit device {}: its simulated peak memory "
             "is {} ({} bytes) but the device has {} ({} bytes); use more micro-batches, {}"
             "checkpoint='per_layer' or 'always', more devices, or more memory",
             kPlanPipelineId, d, formatBytes(peak), peak, formatBytes(cap), cap,
             o.schedule == "interleaved" ? "fewer virtual stages, " : "");
  }
  return sim;
}

// 2b'. What the checkpoint pass runs with: the option's mode for every
//      layer, or per_layer's choice (Note [Recompute per layer],
//      recompute_choice.cpp; plan.recomputed_layers set).
CheckpointOptions runRecomputeChoice(PassRunner& timer, const ir::Graph& mb,
                                     const std::vector<int32_t>& stages,
                                     const DeviceModel& machine, PipelinePlan& plan,
                                     const PipelinePlanOptions& o) {
  CheckpointOptions co;
  if (o.checkpoint != "per_layer") {
    co.mode = parseCheckpointMode(o.checkpoint);
    return co;
  }
  std::vector<RecomputeLayer> layers;
  for (int l = 0; l < plan.chain.size(); ++l) {
    const int s = plan.stage_of_layer[static_cast<size_t>(l)];
    const std::vector<int>& kept = plan.partition.stage_activations;
    layers.push_back({plan.chain.layers[static_cast<size_t>(l)].name,
                      plan.partition.stage_device[static_cast<size_t>(s)],
                      kept.empty() ? static_cast<int>(plan.microbatch_sizes.size())
                                   : kept[static_cast<size_t>(s)]});
  }
  std::vector<int64_t> capacity;
  for (int d = 0; d < machine.numDevices(); ++d) capacity.push_back(machine.device(d).memory_bytes);
  auto trial = [&](const CheckpointOptions& options) {
    CheckpointResult ck = checkpoint(mb, stages, options);
    bool patterned = false;
    PipelineProgram pp = lowerScheduled(ck, plan, o, patterned);
    std::vector<int64_t> peaks;
    for (const DeviceReport& d : simulate(pp.program, machine, SimulateOptions{}).devices) {
      peaks.push_back(d.peak_bytes);
    }
    return peaks;
  };
  RecomputeChoice choice = timer.run("recompute-search", [&] {
    return chooseRecomputedLayers(mb, stages, layers, capacity, o.schedule == "gpipe", trial);
  });
  plan.recomputed_layers = choice.layers;
  plan.recompute_every_microbatch = choice.options.mode == CheckpointMode::Always;
  timer.last().detail = fmt::format("{} of {} layers recomputed{}, {} simulations",
                                    plan.recomputed_layers.size(), plan.chain.size(),
                                    plan.recompute_every_microbatch ? " in every micro-batch" : "",
                                    choice.trials);
  return choice.options;
}

}  // namespace

PipelinePlan planPipeline(const ir::Graph& step, const PipelinePlanOptions& o) {
  checkOptions(o);
  PlacementOptions machine_options;
  machine_options.devices = o.devices;
  machine_options.machine = o.machine;
  machine_options.memory_bytes = o.memory_bytes;
  DeviceModel machine = planMachine(machine_options);  // checks memory and machine size
  ir::verify(step);

  PipelinePlan plan;
  plan.machine = machine;
  plan.schedule = o.schedule;
  plan.virtual_stages = virtualStages(o);
  plan.checkpoint = o.checkpoint;
  plan.portals = o.portals;
  plan.microbatch_sizes = microbatchSizes(*o.batch_size, o.microbatches);
  PassRunner timer(kPlanPipelineId, step.name(), o.checkpoint == "per_layer" ? 12 : 11, o);

  LayerOrder order = runLayerOrder(timer, step);
  plan.chain = chainOfOneMicrobatch(timer, step, order, machine, plan, o);
  const auto stage_of = runPartition(timer, machine, plan, o);
  ir::Graph mb = microbatchStep(timer, step, order.graph, machine, plan, o);
  const std::vector<int32_t> stages = stagesOfNodes(mb, stage_of);  // every node's, once
  const CheckpointOptions co = runRecomputeChoice(timer, mb, stages, machine, plan, o);
  CheckpointResult ck = runCheckpoint(timer, mb, stages, co);
  PipelineProgram pp = runSchedule(timer, ck, plan, o);
  plan.simulation = runSimulate(timer, pp, machine, o);
  plan.stage_of_node = std::move(pp.stage_of_node);
  plan.graph = std::move(pp.graph);
  plan.placement = std::move(pp.placement);
  plan.program = std::move(pp.program);
  plan.stats = timer.take();
  return plan;
}

}  // namespace modelpar::passes
