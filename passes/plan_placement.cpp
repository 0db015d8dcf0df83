// The model-parallel planner (plan_placement.h): option checks, then cost →
// coarsen → place → lower → simulate on a copy of the graph, each pass timed,
// verified, dumped and reported.
#include "passes/plan_placement.h"

#include <algorithm>
#include <cctype>
#include <chrono>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <unordered_map>

#include "ir/receive_order.h"
#include "ir/check.h"
#include "ir/printer.h"
#include "ir/verifier.h"
#include "passes/cost/op_family.h"
#include "passes/place/place_metf.h"
#include "passes/place/place_mtopo.h"
#include "passes/place/task_graph.h"

namespace modelpar::passes {
namespace {

void checkOptions(const PlacementOptions& o) {
  if (o.devices) checkDevices(kPlanPlacementId, *o.devices);
  checkOneOf(kPlanPlacementId, "placer", o.placer, kPlacerNames);
  for (size_t i = 0; i < o.memory_bytes.size(); ++i) {
    MP_CHECK(o.memory_bytes[i] > 0, ConfigError,
             "modelpar {}: memory[{}]={} bytes is not valid; memory takes sizes > 0 bytes, one for "
             "every device or one per device", kPlanPlacementId, i, o.memory_bytes[i]);
  }
  MP_CHECK(o.msct_threshold >= 0 && o.msct_threshold <= 1, ConfigError,
           "modelpar {}: msct_threshold={} is not valid; it takes a number in [0, 1]",
           kPlanPlacementId, o.msct_threshold);
  MP_CHECK(o.msct_lp_time_limit_s > 0, ConfigError,
           "modelpar {}: msct_lp_time_limit_s={} is not valid; it takes seconds > 0",
           kPlanPlacementId, o.msct_lp_time_limit_s);
  MP_CHECK(o.msct_lp_iteration_limit >= 0, ConfigError,
           "modelpar {}: msct_lp_iteration_limit={} is not valid; it takes a count of simplex "
           "iterations >= 0 (0: none)", kPlanPlacementId, o.msct_lp_iteration_limit);
  MP_CHECK(o.cost_options.optimizer_state_factor >= 0, ConfigError,
           "modelpar {}: cost_options.optimizer_state_factor={} is not valid; it takes a number "
           ">= 0", kPlanPlacementId, o.cost_options.optimizer_state_factor);
}

// The first n devices of m, with their links.
DeviceModel firstDevices(const DeviceModel& m, int n) {
  std::vector<DeviceSpec> devs(m.devices().begin(), m.devices().begin() + n);
  DeviceModel out = DeviceModel::fromDevices(std::move(devs), m.defaultLink());
  for (int s = 0; s < n; ++s) {
    for (int d = 0; d < n; ++d) {
      if (s != d && !(m.link(s, d) == m.defaultLink())) out.setLink(s, d, m.link(s, d), false);
    }
  }
  out.setStepOverheadUs(m.stepOverheadUs());
  out.setHostCores(m.hostCores());
  out.setSendOverheadUs(m.sendOverheadUs());
  out.setWorkerOverheadUs(m.workerOverheadUs());
  return out;
}

// Unit ids in range, units inside one group, every node covered.
void checkCoarsening(const ir::Graph& g, const Coarsening& c) {
  MP_CHECK(c.unit_of_node.size() == g.numNodes() && c.group_of_node.size() == g.numNodes(),
           InvalidIrError, "the grouping covers {} of {} nodes", c.unit_of_node.size(),
           g.numNodes());
  std::vector<int32_t> group_of_unit(static_cast<size_t>(c.num_units), -1);
  for (size_t n = 0; n < g.numNodes(); ++n) {
    int32_t u = c.unit_of_node[n], grp = c.group_of_node[n];
    MP_CHECK(u >= 0 && u < c.num_units && grp >= 0 && grp < c.num_groups, InvalidIrError,
             "node {} is in unit {} of {} and group {} of {}", g.nodeRef(static_cast<ir::NodeId>(n)),
             u, c.num_units, grp, c.num_groups);
    int32_t& ug = group_of_unit[static_cast<size_t>(u)];
    MP_CHECK(ug < 0 || ug == grp, InvalidIrError, "unit {} spans groups {} and {} (node {})", u,
             ug, grp, g.nodeRef(static_cast<ir::NodeId>(n)));
    ug = grp;
  }
}

// The graph with a comment per unit: which nodes it holds.
std::string coarseningText(const ir::Graph& g, const Coarsening& c) {
  std::vector<std::vector<ir::NodeId>> members(static_cast<size_t>(c.num_units));
  for (size_t n = 0; n < g.numNodes(); ++n) {
    members[static_cast<size_t>(c.unit_of_node[n])].push_back(static_cast<ir::NodeId>(n));
  }
  std::string out = fmt::format("// coarsen: {} nodes in {} units, {} groups\n", g.numNodes(),
                                c.num_units, c.num_groups);
  for (size_t u = 0; u < members.size(); ++u) {
    const ir::Node& first = g.node(members[u].front());
    out += fmt::format("// unit {} (group {}{}{}):", u, c.group_of_node[static_cast<size_t>(members[u].front())],
                       first.layer.empty() ? "" : ", layer ", first.layer);
    for (ir::NodeId n : members[u]) out += fmt::format(" {}", g.nodeRef(n));
    out += "\n";
  }
  return out + ir::print(g);
}

std::string placementText(const ir::Graph& g, const Placement& p) {
  ir::Graph placed = g;
  for (size_t n = 0; n < g.numNodes(); ++n) {
    placed.node(static_cast<ir::NodeId>(n)).device = p.node_device[n];
  }
  std::string out = fmt::format("// {}: {} devices, estimated makespan {}\n", p.placer,
                                p.num_devices, formatMicros(p.makespan_us));
  for (int d = 0; d < p.num_devices; ++d) {
    out += fmt::format("// device {} order:", d);
    for (ir::NodeId n : p.order[static_cast<size_t>(d)]) out += fmt::format(" {}", g.nodeRef(n));
    out += "\n";
  }
  return out + ir::print(placed);
}

std::string simulationText(const ir::Program& p, const SimulationReport& r) {
  std::string out = fmt::format("// simulate: step {}, {} instructions, {} transfers\n",
                                formatMicros(r.step_time_us), r.num_instructions, r.num_transfers);
  for (size_t d = 0; d < r.devices.size(); ++d) {
    const DeviceReport& dr = r.devices[d];
    out += fmt::format("// device {}: compute {}, idle {}, send {}, recv {}, peak {}\n", d,
                       formatMicros(dr.compute_busy_us), formatMicros(dr.idle_us),
                       formatMicros(dr.send_busy_us), formatMicros(dr.recv_busy_us),
                       formatBytes(dr.peak_bytes));
  }
  return out + ir::print(p);
}

// Note [In-place writes to graph inputs]: a functionalized graph updates a
// mutated input (BatchNorm's running statistics) with `aten::copy_(%input,
// %new)`. A device other than the input's home works on a received copy, so
// the write would be lost: every in-place node whose first argument is a
// graph input, or a view of one (writtenInput), runs on that input's device (its
// boundInputDevices: input_device, else its first reader's), which is then
// fixed in the placement. Returns the number of nodes moved; orders are
// rebuilt in graph order when any moved.
int64_t pinInputWrites(const ir::Graph& g, Placement& p) {
  const std::vector<int32_t> home = boundInputDevices(g, p);
  int64_t moved = 0;
  const std::vector<ir::ValueId> roots = storageRoots(g);
  for (size_t n = 0; n < g.numNodes(); ++n) {
    const ir::ValueId input = writtenInput(g, g.node(static_cast<ir::NodeId>(n)), roots);
    std::optional<size_t> i = input == ir::kNoId ? std::nullopt : g.inputIndex(input);
    if (!i || p.node_device[n] == home[*i]) continue;
    p.node_device[n] = home[*i];
    ++moved;
  }
  if (moved == 0) return 0;
  p.input_device = home;
  for (auto& order : p.order) order.clear();
  for (size_t n = 0; n < g.numNodes(); ++n) {
    p.order[static_cast<size_t>(p.node_device[n])].push_back(static_cast<ir::NodeId>(n));
  }
  return moved;
}

}  // namespace

DeviceModel planMachine(const PlacementOptions& o) {
  checkOptions(o);
  int have = o.machine ? o.machine->numDevices() : 0;
  int n = o.devices.value_or(o.machine ? have : 1);
  DeviceModel m;
  if (!o.machine) {
    m = DeviceModel::uniform(n);
  } else if (n == have) {
    m = *o.machine;
  } else if (n < have) {
    m = firstDevices(*o.machine, n);
  } else {
    MP_CHECK(have == 1, ConfigError,
             "modelpar {}: devices={} but the machine profile has {} devices; ask for at most {} "
             "devices, or give a one-device profile (it is replicated)",
             kPlanPlacementId, n, have, have);
    m = DeviceModel::fromDevices(std::vector<DeviceSpec>(static_cast<size_t>(n), o.machine->device(0)),
                                 o.machine->defaultLink());
    for (int d = 0; d < n; ++d) {
      DeviceSpec s = m.device(d);
      s.name = fmt::format("{}{}", o.machine->device(0).name, d);
      m.setDevice(d, s);
    }
    m.setStepOverheadUs(o.machine->stepOverheadUs());
    m.setHostCores(o.machine->hostCores());
    m.setSendOverheadUs(o.machine->sendOverheadUs());
    m.setWorkerOverheadUs(o.machine->workerOverheadUs());
  }
  const auto& mem = o.memory_bytes;
  MP_CHECK(mem.size() <= 1 || mem.size() == static_cast<size_t>(n), ConfigError,
           "modelpar {}: memory has {} values for {} devices; give one value for every device or "
           "one per device", kPlanPlacementId, mem.size(), n);
  for (int d = 0; d < n && !mem.empty(); ++d) {
    DeviceSpec s = m.device(d);
    s.memory_bytes = mem.size() == 1 ? mem[0] : mem[static_cast<size_t>(d)];
    m.setDevice(d, s);
  }
  MP_CHECK(o.cost_options.reference_device >= 0 && o.cost_options.reference_device < n,
           ConfigError, "modelpar {}: cost_options.reference_device={} is not valid; it takes a "
           "device from 0 to {}", kPlanPlacementId, o.cost_options.reference_device, n - 1);
  return m;
}

namespace {

// 0. Everything that can be checked before a pass runs (the options were,
// in planMachine): the input verifies.
void checkInput(const ir::Graph& input) {
  try {
    ir::verify(input);
  } catch (const InvalidIrError& e) {
    MP_THROW(InvalidIrError, "modelpar {}: the input graph does not verify: {}", kPlanPlacementId,
             e.what());
  }
}

// 1. cost
CostStats runCost(PassRunner& ins, ir::Graph& g, const DeviceModel& machine,
                  const PlacementOptions& o) {
  CostStats cost;
  ins.run(kCostPassId, [&] { cost = estimateCosts(g, machine, o.cost_options); });
  PassStats& cs = ins.last();
  cs.in = cs.out = static_cast<int64_t>(g.numNodes());
  cs.in_what = cs.out_what = "nodes";
  cs.detail = fmt::format("{} profiled, {} analytic, {} default", cost.profiled, cost.analytic,
                          cost.defaulted);
  ins.verifyGraph(g);
  return cost;
}

// 2. coarsen (or one unit per node)
Coarsening runCoarsen(PassRunner& ins, ir::Graph& g, const PlacementOptions& o) {
  if (!o.coarsen || o.placement) return nodeUnits(g);
  Coarsening units;
  ins.run(kCoarsenPassId, [&] { units = coarsen(g, o.coarsen_options); });
  PassStats& s = ins.last();
  s.in = static_cast<int64_t>(g.numNodes());
  s.in_what = "nodes";
  s.out = units.num_units;
  s.out_what = "units";
  s.detail = fmt::format("{} groups; {} co-placed, {} fused", units.num_groups, units.coplaced,
                         units.fused);
  ins.verifyWith(g, nullptr, [&] { checkCoarsening(g, units); },
                 ins.dumping() ? coarseningText(g, units) : std::string());
  return units;
}

std::string placerPassId(const PlacementOptions& o) {
  return o.placement            ? std::string(kFixedPlacementPassId)
         : o.placer == "m-topo" ? std::string(kMTopoPassId)
         : o.placer == "m-sct"  ? std::string(kMSctPassId)
                                : std::string(kMEtfPassId);
}

// 3. place: the placer chosen, or the fixed placement checked. Not yet
// verified: runPins may still move nodes.
Placement runPlacer(PassRunner& ins, const ir::Graph& g, const Coarsening& units,
                    const DeviceModel& machine, const PlacementOptions& o, MSctStats& msct) {
  Placement placement;
  ins.run(placerPassId(o), [&] {
    if (o.placement) {  // PlacementOptions::placement: checked, not placed
      MP_CHECK(o.placement->num_devices == machine.numDevices(), ConfigError,
               "modelpar {}: the fixed placement has {} devices but the machine {}; plan for as "
               "many devices as the placement uses", kPlanPlacementId, o.placement->num_devices,
               machine.numDevices());
      checkPlacement(g, *o.placement);
      placement = *o.placement;
      return;
    }
    TaskGraph tg = buildTaskGraph(g, &units);
    if (o.placer == "m-topo") {
      placement = placeMTopo(g, tg, machine, o.mtopo_uniform);
    } else if (o.placer == "m-sct") {
      MSctOptions so;
      so.threshold = o.msct_threshold;
      so.lp_iteration_limit = o.msct_lp_iteration_limit;
      so.lp_time_limit_s = o.msct_lp_time_limit_s;
      so.stats = &msct;
      placement = placeMSct(g, tg, machine, so);
    } else {
      placement = placeMEtf(g, tg, machine);
    }
  });
  PassStats& ps = ins.last();
  ps.in = units.num_units;
  ps.in_what = "units";
  ps.out = machine.numDevices();
  ps.out_what = "devices";
  ps.detail = o.placement ? std::string("given placement")
                          : fmt::format("estimated makespan {}", formatMicros(placement.makespan_us));
  if (o.placer == "m-sct" && !o.placement) {
    ps.detail += fmt::format("; {} LP{} {}x{} in {}, {}, {} favourites", msct.lp_windows,
                             msct.lp_windows == 1 ? "" : "s", msct.lp_rows, msct.lp_columns,
                             formatMicros(msct.lp_seconds * 1e6),
                             msct.lp_optimal ? "optimal" : "not optimal (iteration or time limit)",
                             msct.favourite_edges);
  }
  return placement;
}

// 3b. The pins: pinned layers' nodes and pinned inputs moved to their
// devices, in-place writes to inputs moved to the inputs' devices; then the
// placement verified. Returns the nodes moved after the placer checked
// memory: the simulator is then their memory check.
int64_t runPins(PassRunner& ins, ir::Graph& g, const PlacementOptions& o, Placement& placement) {
  PassStats& ps = ins.last();
  int64_t moved_after_placer = 0;
  if (!o.pinned_layers.empty()) {  // PlacementOptions::pinned_layers
    std::unordered_map<std::string, int> pin(o.pinned_layers.begin(), o.pinned_layers.end());
    for (const auto& [layer, dev] : o.pinned_layers) {
      MP_CHECK(dev >= 0 && dev < placement.num_devices, ConfigError,
               "modelpar {}: pinned layer '{}' -> device {} is not valid; devices are 0..{}",
               kPlanPlacementId, layer, dev, placement.num_devices - 1);
    }
    int64_t moved = 0;
    for (size_t n = 0; n < g.numNodes(); ++n) {
      const std::string& layer = g.node(static_cast<ir::NodeId>(n)).layer;
      if (layer.empty()) continue;
      auto it = pin.find(layer);
      if (it == pin.end()) continue;
      moved += placement.node_device[n] != it->second;
      placement.node_device[n] = it->second;
    }
    // Inputs follow their first reader (lowering's rule), not where the
    // placer put them next to readers that may have moved.
    std::fill(placement.input_device.begin(), placement.input_device.end(), -1);
    for (auto& order : placement.order) order.clear();
    for (size_t n = 0; n < g.numNodes(); ++n) {
      placement.order[static_cast<size_t>(placement.node_device[n])].push_back(
          static_cast<ir::NodeId>(n));
    }
    ps.detail += fmt::format("; {} node{} moved to pinned layers' devices", moved,
                             moved == 1 ? "" : "s");
    moved_after_placer += moved;
  }
  for (const auto& [name, dev] : o.pinned_inputs) {  // PlacementOptions::pinned_inputs
    MP_CHECK(dev >= 0 && dev < placement.num_devices, ConfigError,
             "modelpar {}: pinned input '{}' -> device {} is not valid; devices are 0..{}",
             kPlanPlacementId, name, dev, placement.num_devices - 1);
    std::optional<ir::ValueId> v = g.findValue(name);
    std::optional<size_t> i = v ? g.inputIndex(*v) : std::nullopt;
    if (!i) continue;
    placement.input_device.resize(g.inputs().size(), -1);
    placement.input_device[*i] = dev;
  }
  if (int64_t writes = pinInputWrites(g, placement); writes > 0) {
    moved_after_placer += writes;
    ps.detail += fmt::format("; {} in-place write{} to inputs moved to the inputs' devices", writes,
                             writes == 1 ? "" : "s");
  }
  ins.verifyWith(g, nullptr, [&] { checkPlacement(g, placement); },
                 ins.dumping() ? placementText(g, placement) : std::string());
  return moved_after_placer;
}

// 4. lower
ir::Program runLower(PassRunner& ins, ir::Graph& g, const Placement& placement,
                     const PlacementOptions& o) {
  std::optional<ir::Program> program;
  ins.run(kLowerPassId, [&] {
    program.emplace(lower(g, placement, o.lower_options));
    // Note [Receiving in send order]: what a rank runs.
    if (o.receive_in_send_order) program = ir::receiveInSendOrder(*program);
  });
  PassStats& ls = ins.last();
  int64_t frees = 0, transfers = 0, instructions = 0;
  for (int d = 0; d < program->numDevices(); ++d) {
    for (const ir::Instruction& i : program->schedule(d)) {
      ++instructions;
      frees += i.kind == ir::Instruction::Kind::Free;
      transfers += i.kind == ir::Instruction::Kind::Send;
    }
  }
  ls.in = static_cast<int64_t>(g.numNodes());
  ls.in_what = "nodes";
  ls.out = instructions;
  ls.out_what = "instructions";
  ls.detail = fmt::format("{} transfers, {} frees", transfers, frees);
  ins.verifyProgram(*program);
  return std::move(*program);
}

// 5. simulate
SimulationReport runSimulate(PassRunner& ins, ir::Program& program, const DeviceModel& machine,
                             const PlacementOptions& o) {
  SimulationReport sim;
  SimulateOptions so;
  so.record_timeline = o.record_timeline;
  ins.run(kSimulatePassId, [&] { sim = simulate(program, machine, so); });
  PassStats& ss = ins.last();
  ss.in = sim.num_instructions;
  ss.in_what = "instructions";
  ss.detail = fmt::format("step {}; critical path {} steps", formatMicros(sim.step_time_us),
                          sim.critical_path.size());
  ins.verifyWith(program.graph(), &program, [] {},
                 ins.dumping() ? simulationText(program, sim) : std::string());
  return sim;
}

// 5b. The simulated peaks within every device's memory: the check of a
// fixed placement and of nodes moved after the placer; for a placer's own
// placement, an invariant.
void checkFits(const ir::Graph& g, const SimulationReport& sim, const DeviceModel& machine,
               const PlacementOptions& o, int64_t moved_after_placer) {
  const std::string place_id = placerPassId(o);
  for (size_t d = 0; d < sim.devices.size(); ++d) {
    int64_t cap = machine.device(static_cast<int>(d)).memory_bytes;
    // A fixed placement was accepted by no placer: the simulator is its check.
    MP_CHECK(!o.placement || sim.devices[d].peak_bytes <= cap, PlanDoesNotFitError,
             "modelpar {}: graph @{} does not fit with the fixed placement: device {} needs {} "
             "({} bytes) at its simulated peak but has {} ({} bytes); give more memory or plan "
             "with a placer", kPlanPlacementId, g.name(), d, formatBytes(sim.devices[d].peak_bytes),
             sim.devices[d].peak_bytes, formatBytes(cap), cap);
    MP_CHECK(moved_after_placer == 0 || sim.devices[d].peak_bytes <= cap, PlanDoesNotFitError,
             "modelpar {}: graph @{} does not fit once {} node{} moved to pinned layers' (or "
             "written inputs') devices: device {} needs {} ({} bytes) at its simulated peak but "
             "has {} ({} bytes); give more memory or pin fewer layers", kPlanPlacementId, g.name(),
             moved_after_placer, moved_after_placer == 1 ? " is" : "s are", d,
             formatBytes(sim.devices[d].peak_bytes), sim.devices[d].peak_bytes, formatBytes(cap),
             cap);
    MP_INTERNAL_ASSERT(sim.devices[d].peak_bytes <= cap,
                       "{}: simulated peak memory {} on device {} exceeds its capacity {} although "
                       "{} accepted the placement", kPlanPlacementId,
                       formatBytes(sim.devices[d].peak_bytes), d, formatBytes(cap), place_id);
  }
}

}  // namespace

PlacementPlan planPlacement(const ir::Graph& input, const PlacementOptions& o) {
  DeviceModel machine = planMachine(o);
  checkInput(input);
  ir::Graph g = input;  // every pass works on this copy
  PassRunner ins(kPlanPlacementId, g.name(), o.coarsen && !o.placement ? 5 : 4, o);
  CostStats cost = runCost(ins, g, machine, o);
  Coarsening units = runCoarsen(ins, g, o);
  MSctStats msct;
  Placement placement = runPlacer(ins, g, units, machine, o, msct);
  const int64_t moved_after_placer = runPins(ins, g, o, placement);
  ir::Program program = runLower(ins, g, placement, o);
  SimulationReport sim = runSimulate(ins, program, machine, o);
  checkFits(g, sim, machine, o, moved_after_placer);
  double single = 0;
  for (const ir::Node& n : program.graph().nodes()) single += n.cost ? n.cost->time_us : 0.0;
  return PlacementPlan{std::move(program), std::move(placement), std::move(units), std::move(machine),
                       std::move(sim),     cost,                 msct,             single,
                       ins.take()};
}

}  // namespace modelpar::passes
