// Python bindings of the modelpar device (backend/): sync, options,
// counters, cached plans, tensor names and layer scopes. Registered from
// module.cpp; the functions are private (`_C._device_*`) and wrapped by
// modelpar/device.py.
#include <torch/csrc/utils/pybind.h>

#include <string>

#include "backend/session.h"
#include "ir/error.h"
#include "modelpar/modelpar.h"

namespace py = pybind11;

namespace modelpar {
namespace {

backend::Session& session() { return backend::Session::get(); }

ir::InputRole parseRole(const std::string& role) {
  if (role == "param") return ir::InputRole::Parameter;
  if (role == "buffer") return ir::InputRole::Buffer;
  if (role == "input") return ir::InputRole::Input;
  throw ConfigError("modelpar: tensor role must be 'param', 'buffer' or 'input', got '" + role + "'");
}

}  // namespace

void bindBackend(py::module_& m) {
  m.def("_device_sync", [] {
    py::gil_scoped_release no_gil;
    sync();
  });
  m.def("_device_counters", [] {
    const Counters c = counters();
    py::dict d;
    d["captures"] = c.captures;
    d["replays"] = c.replays;
    d["syncs"] = c.syncs;
    d["graph_breaks"] = c.graph_breaks;
    d["ops_recorded"] = c.ops_recorded;
    return d;
  });
  m.def("_device_reset_counters", &resetCounters);
  m.def("_device_options", [] {
    const Options o = options();
    return py::make_tuple(o.strict, o.warn_on_graph_break, o.cache);
  });
  m.def("_device_set_options", [](bool strict, bool warn, bool cache) {
    setOptions(Options{strict, warn, cache});
  });
  m.def("_device_plans", [] {
    py::list out;
    for (const PlanInfo& p : plans()) out.append(py::make_tuple(p.graph, p.runs));
    return out;
  });
  m.def("_device_clear_plans", &clearPlans);
  m.def("_device_last_graph", &lastGraph);
  m.def("_device_name_tensor", [](const at::Tensor& t, const std::string& name, const std::string& role) {
    session().nameTensor(t, name, parseRole(role));
  });
  m.def("_device_push_scope", [](const std::string& name) { session().pushScope(name, /*absolute=*/true); });
  m.def("_device_pop_scope", [] { session().popScope(); });
}

}  // namespace modelpar
