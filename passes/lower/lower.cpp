// Pass `lower` (lower.h).
#include "passes/lower/lower.h"

#include <algorithm>

#include "ir/check.h"
#include "passes/lower/liveness.h"

namespace modelpar::passes {
namespace {

// Each value a node reads, once, in argument order.
void distinctInputs(const ir::Node& n, std::vector<ir::ValueId>& out) {
  out.clear();
  for (const ir::Arg& a : n.args) {
    a.forEachValue([&](ir::ValueId v) {
      if (std::find(out.begin(), out.end(), v) == out.end()) out.push_back(v);
    });
  }
}

}  // namespace

ir::Program lower(const ir::Graph& g, const Placement& placement, const LowerOptions& options) {
  checkPlacement(g, placement);
  const int nd = placement.num_devices;
  ir::Graph pg = g;
  size_t nv = g.numValues();

  // 1. Homes: node devices, then input devices.
  std::vector<int32_t> home(nv, -1);
  for (size_t n = 0; n < g.numNodes(); ++n) {
    int d = placement.node_device[n];
    pg.node(static_cast<ir::NodeId>(n)).device = d;
    for (ir::ValueId o : g.nodes()[n].outputs) home[static_cast<size_t>(o)] = d;
  }
  const std::vector<int32_t> bound = boundInputDevices(g, placement);
  for (size_t i = 0; i < pg.inputs().size(); ++i) {
    ir::Input& in = pg.inputs()[i];
    home[static_cast<size_t>(in.value)] = bound[i];
    in.device = bound[i];
  }

  // 2. Destinations: devices other than the home that read each value.
  std::vector<uint64_t> dests(nv, 0);
  MP_CHECK(nd <= 64, ConfigError, "modelpar {}: lowers onto at most 64 devices, got {}",
           kLowerPassId, nd);
  for (size_t n = 0; n < g.numNodes(); ++n) {
    int d = placement.node_device[n];
    for (ir::ValueId v : g.nodes()[n].inputs()) {
      if (home[static_cast<size_t>(v)] != d) dests[static_cast<size_t>(v)] |= uint64_t{1} << d;
    }
  }
  auto sendAll = [&](ir::Program& p, int d, ir::ValueId v) {
    for (uint64_t m = dests[static_cast<size_t>(v)]; m != 0; m &= m - 1) {
      p.append(d, ir::Instruction::send(v, __builtin_ctzll(m)));
    }
  };

  // 3. Schedules without frees.
  ir::Program p(std::move(pg), nd);
  for (const ir::Input& in : p.graph().inputs()) sendAll(p, *in.device, in.value);
  std::vector<uint64_t> present(nv, 0);
  std::vector<ir::ValueId> ins;
  for (int d = 0; d < nd; ++d) {
    for (ir::NodeId n : placement.order[static_cast<size_t>(d)]) {
      const ir::Node& node = g.node(n);
      distinctInputs(node, ins);
      for (ir::ValueId v : ins) {
        auto vi = static_cast<size_t>(v);
        if (home[vi] == d || (present[vi] >> d & 1)) continue;
        p.append(d, ir::Instruction::recv(v, home[vi]));
        present[vi] |= uint64_t{1} << d;
      }
      p.append(d, ir::Instruction::run(n));
      for (ir::ValueId o : node.outputs) sendAll(p, d, o);
    }
  }
  if (!options.emit_frees) return p;

  // 4. Frees right after last uses (the simulator's rule, liveness.h).
  std::vector<DeviceLiveness> live = analyzeLiveness(p);
  for (int d = 0; d < nd; ++d) {
    const DeviceLiveness& L = live[static_cast<size_t>(d)];
    std::vector<ValueRelease> ends = L.releases;
    ends.insert(ends.end(), L.alias_ends.begin(), L.alias_ends.end());
    std::stable_sort(ends.begin(), ends.end(), [](const ValueRelease& a, const ValueRelease& b) {
      return a.after != b.after ? a.after < b.after : a.value < b.value;
    });
    std::vector<ir::Instruction> old = std::move(p.schedule(d));
    std::vector<ir::Instruction>& out = p.schedule(d);
    out.clear();
    out.reserve(old.size() + ends.size());
    size_t k = 0;
    auto flush = [&](int32_t upto) {
      for (; k < ends.size() && ends[k].after <= upto; ++k) {
        out.push_back(ir::Instruction::free(ends[k].value));
      }
    };
    flush(-1);
    for (size_t i = 0; i < old.size(); ++i) {
      out.push_back(old[i]);
      flush(static_cast<int32_t>(i));
    }
  }
  return p;
}

}  // namespace modelpar::passes
