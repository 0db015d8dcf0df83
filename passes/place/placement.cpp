// checkPlacement.
#include "passes/place/placement.h"

#include "ir/check.h"

namespace modelpar::passes {

void checkPlacement(const ir::Graph& g, const Placement& p) {
  size_t n = g.numNodes();
  MP_CHECK(p.num_devices >= 1 && p.order.size() == static_cast<size_t>(p.num_devices), ConfigError,
           "modelpar placement: {} device orders for {} devices", p.order.size(), p.num_devices);
  MP_CHECK(p.node_device.size() == n, ConfigError,
           "modelpar placement: {} node devices for the {} nodes of graph @{}",
           p.node_device.size(), n, g.name());
  MP_CHECK(p.input_device.empty() || p.input_device.size() == g.inputs().size(), ConfigError,
           "modelpar placement: {} input devices for the {} inputs of graph @{}",
           p.input_device.size(), g.inputs().size(), g.name());
  for (size_t i = 0; i < p.input_device.size(); ++i) {
    int d = p.input_device[i];
    MP_CHECK(d >= -1 && d < p.num_devices, ConfigError,
             "modelpar placement: input %{} is on device {} of {}",
             g.value(g.inputs()[i].value).name, d, p.num_devices);
  }
  std::vector<int32_t> position(n, -1);
  for (int d = 0; d < p.num_devices; ++d) {
    const auto& ord = p.order[static_cast<size_t>(d)];
    for (size_t k = 0; k < ord.size(); ++k) {
      ir::NodeId id = ord[k];
      MP_CHECK(id >= 0 && static_cast<size_t>(id) < n, ConfigError,
               "modelpar placement: device {} runs node id {} which does not exist", d, id);
      MP_CHECK(position[static_cast<size_t>(id)] < 0, ConfigError,
               "modelpar placement: node {} is ordered twice", g.nodeRef(id));
      MP_CHECK(p.node_device[static_cast<size_t>(id)] == d, ConfigError,
               "modelpar placement: node {} is placed on device {} but ordered on device {}",
               g.nodeRef(id), p.node_device[static_cast<size_t>(id)], d);
      position[static_cast<size_t>(id)] = static_cast<int32_t>(k);
    }
  }
  for (size_t i = 0; i < n; ++i) {
    auto id = static_cast<ir::NodeId>(i);
    MP_CHECK(position[i] >= 0, ConfigError, "modelpar placement: node {} is not placed",
             g.nodeRef(id));
    for (ir::ValueId v : g.nodes()[i].inputs()) {
      ir::NodeId pr = g.value(v).producer;
      if (pr == ir::kNoId || p.node_device[static_cast<size_t>(pr)] != p.node_device[i]) continue;
      MP_CHECK(position[static_cast<size_t>(pr)] < position[i], ConfigError,
               "modelpar placement: device {} runs {} before {}, which it reads",
               p.node_device[i], g.nodeRef(id), g.nodeRef(pr));
    }
  }
}

std::vector<int32_t> boundInputDevices(const ir::Graph& g, const Placement& p) {
  std::vector<int32_t> first_reader(g.numValues(), -1);
  for (size_t n = 0; n < g.numNodes(); ++n) {
    for (ir::ValueId v : g.nodes()[n].inputs()) {
      int32_t& d = first_reader[static_cast<size_t>(v)];
      if (d < 0) d = p.node_device[n];
    }
  }
  std::vector<int32_t> out(g.inputs().size(), 0);
  for (size_t i = 0; i < out.size(); ++i) {
    int32_t d = i < p.input_device.size() ? p.input_device[i] : -1;
    if (d < 0) d = first_reader[static_cast<size_t>(g.inputs()[i].value)];
    out[i] = d < 0 ? 0 : d;
  }
  return out;
}

}  // namespace modelpar::passes
