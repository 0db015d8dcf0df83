// The registry of named passes and the driver loop (pass_registry.h).
#include "passes/pass_registry.h"

#include <algorithm>
#include <charconv>

#include "ir/check.h"
#include "ir/parser.h"
#include "ir/printer.h"
#include "ir/verifier.h"
#include "passes/cost/cost_model.h"
#include "passes/cost/device_model.h"
#include "passes/lower/lower.h"
#include "passes/lower/rehome_inputs.h"
#include "passes/lower/simulate.h"
#include "passes/pipeline/layer_order.h"
#include "passes/pipeline/fuse_accumulation.h"
#include "passes/pipeline/microbatch.h"
#include "passes/place/coarsen.h"
#include "passes/place/place_metf.h"
#include "passes/place/place_msct.h"
#include "passes/place/place_mtopo.h"
#include "passes/place/task_graph.h"

namespace modelpar::passes {
namespace {

constexpr std::string_view kDriverId = "opt";

int64_t intOption(const PassSpec& s, std::string_view key, int64_t fallback, int64_t lo, int64_t hi) {
  auto it = s.options.find(key);
  if (it == s.options.end()) return fallback;
  int64_t v = 0;
  const std::string& t = it->second;
  auto [end, ec] = std::from_chars(t.data(), t.data() + t.size(), v);
  MP_CHECK(ec == std::errc() && end == t.data() + t.size() && v >= lo && v <= hi, ConfigError,
           "modelpar {}: pass '{}' option {}='{}' is not valid; it takes an int from {} to {}",
           kDriverId, s.name, key, t, lo, hi);
  return v;
}

std::string stringOption(const PassSpec& s, std::string_view key, std::string fallback) {
  auto it = s.options.find(key);
  return it == s.options.end() ? fallback : it->second;
}

ir::Graph& graphOf(IrUnit& ir, const PassSpec& s) {
  MP_CHECK(ir.graph && !ir.program, ConfigError,
           "modelpar {}: pass '{}' reads a graph but was given a program; run it before 'lower'",
           kDriverId, s.name);
  return *ir.graph;
}

ir::Program& programOf(IrUnit& ir, const PassSpec& s) {
  MP_CHECK(ir.program.has_value(), ConfigError,
           "modelpar {}: pass '{}' reads a program but was given a graph; run 'lower' first",
           kDriverId, s.name);
  return *ir.program;
}

// The machine of a pass: `machine=<profile.json>` or `devices=N` uniform devices.
DeviceModel machineOf(const PassSpec& s) {
  int n = static_cast<int>(intOption(s, "devices", 1, 1, 64));
  auto it = s.options.find("machine");
  if (it == s.options.end()) return DeviceModel::uniform(n);
  DeviceModel m = DeviceModel::load(it->second);
  MP_CHECK(!s.options.contains("devices") || m.numDevices() == n, ConfigError,
           "modelpar {}: pass '{}' was given devices={} and a machine of {} devices; give one",
           kDriverId, s.name, n, m.numDevices());
  return m;
}

// Writes a placement into the graph's annotations (what `lower` reads back).
void annotate(ir::Graph& g, const Placement& p) {
  for (size_t n = 0; n < g.numNodes(); ++n) {
    g.node(static_cast<ir::NodeId>(n)).device = p.node_device[n];
  }
  for (size_t i = 0; i < g.inputs().size(); ++i) {
    int32_t d = i < p.input_device.size() ? p.input_device[i] : -1;
    g.inputs()[i].device = d >= 0 ? std::optional<int>(d) : std::nullopt;
  }
}

// The placement the annotations describe: each device runs its nodes in graph order.
Placement placementFromAnnotations(const ir::Graph& g, const PassSpec& s) {
  Placement p;
  p.placer = "annotations";
  int devices = 1;
  for (size_t n = 0; n < g.numNodes(); ++n) {
    const ir::Node& node = g.node(static_cast<ir::NodeId>(n));
    MP_CHECK(node.device.has_value() && *node.device >= 0, ConfigError,
             "modelpar {}: pass '{}' needs a device on every node, and {} has none; run a placer "
             "(place-metf, place-mtopo, place-msct) first or annotate it {{device=N}}",
             kDriverId, s.name, g.nodeRef(static_cast<ir::NodeId>(n)));
    devices = std::max(devices, *node.device + 1);
  }
  for (const ir::Input& in : g.inputs()) {
    if (in.device) devices = std::max(devices, *in.device + 1);
  }
  p.num_devices = static_cast<int>(intOption(s, "devices", devices, devices, 64));
  p.order.resize(static_cast<size_t>(p.num_devices));
  for (size_t n = 0; n < g.numNodes(); ++n) {
    int d = *g.node(static_cast<ir::NodeId>(n)).device;
    p.node_device.push_back(d);
    p.order[static_cast<size_t>(d)].push_back(static_cast<ir::NodeId>(n));
  }
  for (const ir::Input& in : g.inputs()) p.input_device.push_back(in.device.value_or(-1));
  return p;
}

void place(IrUnit& ir, const PassSpec& s) {
  ir::Graph& g = graphOf(ir, s);
  DeviceModel machine = machineOf(s);
  Coarsening units = stringOption(s, "coarsen", "false") == "true" ? coarsen(g) : nodeUnits(g);
  TaskGraph tg = buildTaskGraph(g, &units);
  Placement p = s.name == "place-mtopo" ? placeMTopo(g, tg, machine)
                : s.name == "place-msct" ? placeMSct(g, tg, machine)
                                         : placeMEtf(g, tg, machine);
  annotate(g, p);
}

std::vector<RegisteredPass> makeRegistry() {
  std::vector<RegisteredPass> r;
  r.push_back({"cost", "graph", "graph", "time and bytes on every node (profiled, else roofline); "
               "options: devices=N, machine=<profile.json>", {"devices", "machine"},
               [](IrUnit& ir, const PassSpec& s) { estimateCosts(graphOf(ir, s), machineOf(s)); }});
  r.push_back({"layer-order", "graph", "graph", "captured module names as a chain of layers", {},
               [](IrUnit& ir, const PassSpec& s) { ir.graph = orderLayers(graphOf(ir, s)).graph; }});
  r.push_back({"microbatch", "graph", "graph",
               "per-micro-batch copies of a step with a symbolic batch; options: microbatches=M, "
               "batch_size=B, batch_norm=refuse|deferred, loss_reduction=auto|mean|sum",
               {"microbatches", "batch_size", "batch_norm", "loss_reduction"},
               [](IrUnit& ir, const PassSpec& s) {
                 MicrobatchOptions o;
                 o.microbatches = static_cast<int>(intOption(s, "microbatches", 1, 1, 1 << 20));
                 MP_CHECK(s.options.contains("batch_size"), ConfigError,
                          "modelpar {}: pass 'microbatch' needs batch_size=B (the full batch)",
                          kDriverId);
                 o.batch_size = intOption(s, "batch_size", 1, 1, int64_t{1} << 40);
                 o.batch_norm = parseBatchNormMode(stringOption(s, "batch_norm", "refuse"));
                 o.loss_reduction = parseLossReduction(stringOption(s, "loss_reduction", "auto"));
                 ir.graph = microbatch(graphOf(ir, s), o);
               }});
  r.push_back({"fuse-accumulation", "graph", "graph",
               "folds a matrix product into the sum that accumulates it: add(acc, mm(a, b)) -> "
               "addmm(acc, a, b), through aten::t", {},
               [](IrUnit& ir, const PassSpec& s) { ir.graph = fuseAccumulation(graphOf(ir, s)).graph; }});
  for (std::string_view name : {"place-mtopo", "place-metf", "place-msct"}) {
    r.push_back({name, "graph", "graph",
                 "a device on every node and input (needs costs: run 'cost' first); options: "
                 "devices=N, machine=<profile.json>, coarsen=true|false",
                 {"devices", "machine", "coarsen"}, place});
  }
  r.push_back({"lower", "graph", "program",
               "the annotated graph as a Program: explicit send / recv / free, each device's "
               "nodes in graph order; options: devices=N (at least the devices used)",
               {"devices"},
               [](IrUnit& ir, const PassSpec& s) {
                 ir::Graph& g = graphOf(ir, s);
                 ir.program.emplace(lower(g, placementFromAnnotations(g, s)));
                 ir.graph.reset();
               }});
  r.push_back({"rehome-inputs", "program", "program",
               "binds each named graph input on its home device and sends it from there to "
               "where the program read it; options: homes=name@device[+name@device...]",
               {"homes"},
               [](IrUnit& ir, const PassSpec& s) {
                 auto it = s.options.find("homes");
                 MP_CHECK(it != s.options.end(), ConfigError,
                          "modelpar {}: needs homes=name@device[+name@device...]",
                          kRehomeInputsPassId);
                 ir.program.emplace(rehomeInputs(programOf(ir, s), parseInputHomes(it->second)));
               }});
  r.push_back({"simulate", "program", "program",
               "checks the program runs to the end on a machine (the report is `python -m "
               "modelpar simulate`'s); options: machine=<profile.json>", {"machine"},
               [](IrUnit& ir, const PassSpec& s) {
                 ir::Program& p = programOf(ir, s);
                 PassSpec m = s;
                 m.options["devices"] = std::to_string(p.numDevices());
                 simulate(p, machineOf(m));
               }});
  return r;
}

const RegisteredPass* find(std::string_view name) {
  for (const RegisteredPass& p : registeredPasses()) {
    if (p.name == name) return &p;
  }
  return nullptr;
}

std::string knownNames() {
  std::string s;
  for (const RegisteredPass& p : registeredPasses()) s += fmt::format("{}'{}'", s.empty() ? "" : ", ", p.name);
  return s;
}

}  // namespace

PassSpec parsePassSpec(std::string_view text) {
  PassSpec s;
  size_t colon = text.find(':');
  s.name = std::string(text.substr(0, colon));
  MP_CHECK(!s.name.empty(), ConfigError, "modelpar {}: '{}' names no pass; write NAME or "
           "NAME:key=value,key=value", kDriverId, text);
  if (colon == std::string_view::npos) return s;
  std::string_view rest = text.substr(colon + 1);
  while (!rest.empty()) {
    size_t comma = rest.find(',');
    std::string_view item = rest.substr(0, comma);
    size_t eq = item.find('=');
    MP_CHECK(eq != std::string_view::npos && eq > 0, ConfigError,
             "modelpar {}: option '{}' of pass '{}' is not key=value", kDriverId, item, s.name);
    auto [it, fresh] = s.options.emplace(std::string(item.substr(0, eq)), std::string(item.substr(eq + 1)));
    MP_CHECK(fresh, ConfigError, "modelpar {}: option '{}' of pass '{}' is given twice", kDriverId,
             it->first, s.name);
    if (comma == std::string_view::npos) break;
    rest = rest.substr(comma + 1);
  }
  return s;
}

IrUnit parseIrUnit(std::string_view text) {
  size_t i = 0;
  while (i < text.size()) {  // skip blank lines and comments
    if (std::isspace(static_cast<unsigned char>(text[i]))) {
      ++i;
    } else if (text.substr(i, 2) == "//") {
      size_t nl = text.find('\n', i);
      i = nl == std::string_view::npos ? text.size() : nl + 1;
    } else {
      break;
    }
  }
  IrUnit ir;
  if (text.substr(i, 7) == "program") {
    ir.program = ir::parseProgram(text);
  } else {
    ir.graph = ir::parseGraph(text);
  }
  return ir;
}

std::string printIrUnit(const IrUnit& ir) {
  return ir.program ? ir::print(*ir.program) : ir::print(*ir.graph);
}

const std::vector<RegisteredPass>& registeredPasses() {
  static const std::vector<RegisteredPass> registry = makeRegistry();
  return registry;
}

IrUnit runPasses(IrUnit ir, const std::vector<PassSpec>& specs, const PassRunnerOptions& options) {
  MP_CHECK(ir.graph.has_value() != ir.program.has_value(), ConfigError,
           "modelpar {}: give a graph or a program", kDriverId);
  // 0. Every pass and option known before anything runs.
  std::vector<const RegisteredPass*> passes;
  std::string_view kind = ir.program ? "program" : "graph";
  for (const PassSpec& s : specs) {
    const RegisteredPass* p = find(s.name);
    MP_CHECK(p != nullptr, ConfigError, "modelpar {}: unknown pass '{}'; the passes are {}",
             kDriverId, s.name, knownNames());
    for (const auto& [key, value] : s.options) {
      bool known = std::find(p->options.begin(), p->options.end(), key) != p->options.end();
      MP_CHECK(known, ConfigError, "modelpar {}: pass '{}' has no option '{}' ({})", kDriverId,
               s.name, key, p->help);
    }
    MP_CHECK(p->reads == kind, ConfigError,
             "modelpar {}: pass '{}' reads a {} but was given a {}; {}", kDriverId, s.name,
             p->reads, kind, kind == "program" ? "run it before 'lower'" : "run 'lower' first");
    kind = p->leaves;
    passes.push_back(p);
  }
  if (ir.program) {
    ir::verify(*ir.program);
  } else {
    ir::verify(*ir.graph);
  }
  std::string name = ir.program ? ir.program->graph().name() : ir.graph->name();
  PassRunner runner(kDriverId, name, static_cast<int>(specs.size()), options);
  for (size_t k = 0; k < specs.size(); ++k) {
    runner.run(specs[k].name, [&] { passes[k]->run(ir, specs[k]); });
    if (ir.program) {
      runner.verifyProgram(*ir.program);
    } else {
      runner.verifyGraph(*ir.graph);
    }
  }
  return ir;
}

}  // namespace modelpar::passes
