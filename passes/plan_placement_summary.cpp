// PlacementPlan's report for people (plan_placement.h): units and nodes per device, the
// statistics table and the summary that `python -m modelpar plan` prints.
#include "passes/plan_placement.h"

#include <cmath>
#include <set>
#include <string>
#include <string_view>

#include <fmt/format.h>

#include "passes/place/place_metf.h"
#include "passes/place/place_mtopo.h"

namespace modelpar::passes {
namespace {

std::string countText(int64_t n, std::string_view what) {
  return what.empty() ? std::string() : fmt::format("{} {}", n, what);
}

}  // namespace

std::string formatMicros(double us) {
  double mag = std::fabs(us);
  if (mag >= 1e6) return fmt::format("{:.3g} s", us / 1e6);
  if (mag >= 1e3) return fmt::format("{:.3g} ms", us / 1e3);
  return fmt::format("{:.3g} us", us);
}

double PlacementPlan::speedup() const {
  return stepTimeUs() > 0 ? single_device_us / stepTimeUs() : 1.0;
}

std::vector<int64_t> PlacementPlan::unitsPerDevice() const {
  std::vector<int64_t> count(static_cast<size_t>(placement.num_devices), 0);
  std::vector<char> seen(static_cast<size_t>(units.num_units), 0);
  for (size_t n = 0; n < units.unit_of_node.size(); ++n) {
    auto u = static_cast<size_t>(units.unit_of_node[n]);
    if (seen[u]) continue;
    seen[u] = 1;
    ++count[static_cast<size_t>(placement.node_device[n])];
  }
  return count;
}

std::vector<int64_t> PlacementPlan::nodesPerDevice() const {
  std::vector<int64_t> count(static_cast<size_t>(placement.num_devices), 0);
  for (int32_t d : placement.node_device) ++count[static_cast<size_t>(d)];
  return count;
}

std::string PlacementPlan::statsTable() const {
  std::string out = fmt::format("{:<13} {:>10} {:>10}  {:<18} {:<18} {}\n", "pass", "time",
                                "verify", "in", "out", "detail");
  for (const PassStats& s : stats) {
    out += fmt::format("{:<13} {:>10} {:>10}  {:<18} {:<18} {}\n", s.pass,
                       formatMicros(s.seconds * 1e6), formatMicros(s.verify_seconds * 1e6),
                       countText(s.in, s.in_what), countText(s.out, s.out_what), s.detail);
  }
  return out;
}

std::string PlacementPlan::summary() const {
  const ir::Graph& g = program.graph();
  std::string_view placer = placement.placer;
  if (placer == kMTopoPassId) placer = "m-topo";
  if (placer == kMEtfPassId) placer = "m-etf";
  if (placer == kMSctPassId) placer = "m-sct";
  std::string out = fmt::format(
      "modelpar plan @{}: placer {}, {} device{}, {} nodes in {} units\n", g.name(), placer,
      placement.num_devices, placement.num_devices == 1 ? "" : "s", g.numNodes(), units.num_units);
  out += fmt::format("  simulated step time {} (one device {}, speed-up {:.2f}x)\n",
                     formatMicros(stepTimeUs()), formatMicros(single_device_us), speedup());
  out += fmt::format("  {:<6} {:>5} {:>5} {:>10} {:>10} {:>11} {:>11}  {}\n", "device", "units",
                     "nodes", "compute", "idle", "peak mem", "capacity", "layers");
  std::vector<int64_t> u = unitsPerDevice(), nodes = nodesPerDevice();
  for (int d = 0; d < placement.num_devices; ++d) {
    const DeviceReport& r = simulation.devices[static_cast<size_t>(d)];
    std::vector<std::string> layers;
    std::set<std::string> seen;
    for (ir::NodeId n : placement.order[static_cast<size_t>(d)]) {
      const std::string& l = g.node(n).layer;
      if (!l.empty() && seen.insert(l).second) layers.push_back(l);
    }
    std::string shown;
    for (size_t i = 0; i < layers.size() && i < 4; ++i) shown += fmt::format("{}{}", i ? ", " : "", layers[i]);
    if (layers.size() > 4) shown += fmt::format(", ... {} more", layers.size() - 4);
    std::string row = fmt::format("  {:<6} {:>5} {:>5} {:>10} {:>10} {:>11} {:>11}  {}", d,
                       u[static_cast<size_t>(d)], nodes[static_cast<size_t>(d)],
                       formatMicros(r.compute_busy_us), formatMicros(r.idle_us),
                       formatBytes(r.peak_bytes), formatBytes(machine.device(d).memory_bytes), shown);
    while (!row.empty() && row.back() == ' ') row.pop_back();
    out += row;
    out += '\n';
  }
  int64_t on_path = 0;
  for (const CriticalStep& s : simulation.critical_path) on_path += s.kind == ir::Instruction::Kind::Recv;
  out += fmt::format("  transfers {}; critical path {} steps, {} of them transfers\n",
                     simulation.num_transfers, simulation.critical_path.size(), on_path);
  out += "  passes:\n";
  std::string table = statsTable();
  size_t pos = 0;
  while (pos < table.size()) {
    size_t end = table.find('\n', pos);
    out += fmt::format("    {}\n", std::string_view(table).substr(pos, end - pos));
    pos = end + 1;
  }
  return out;
}

}  // namespace modelpar::passes
