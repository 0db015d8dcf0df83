// Python bindings of the modelpar device (backend/): sync, options (configure),
// counters, cached plans, tensor names and layer scopes. Registered from
// module.cpp; the functions are private (`_C._device_*`) and wrapped by
// modelpar/device.py.
#include <pybind11/stl.h>
#include <torch/csrc/utils/pybind.h>

#include <optional>
#include <string>
#include <vector>

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
    d["evictions"] = c.evictions;
    return d;
  });
  m.def("_device_reset_counters", &resetCounters);
  m.def("_device_options", [] {
    const Options o = options();
    py::dict d;
    d["strict"] = o.strict;
    d["warn_on_graph_break"] = o.warn_on_graph_break;
    d["cache"] = o.cache;
    d["devices"] = o.devices;
    d["device_map"] = o.device_map;
    d["placer"] = o.placer.empty() ? py::object(py::none()) : py::object(py::str(o.placer));
    d["memory"] = o.memory ? py::object(py::int_(*o.memory)) : py::object(py::none());
    if (o.pipeline) {
      const PipelineOptions& p = *o.pipeline;
      py::dict pd;
      pd["microbatches"] = p.microbatches;
      pd["schedule"] = p.schedule;
      pd["virtual_stages"] = p.virtual_stages;
      pd["partition"] = p.partition;
      pd["checkpoint"] = p.checkpoint;
      pd["portals"] = p.portals;
      pd["batch_norm"] = p.batch_norm;
      pd["allow_random"] = p.allow_random;
      pd["loss_reduction"] = p.loss_reduction;
      pd["batched_inputs"] = p.batched_inputs;
      d["pipeline"] = pd;
    } else {
      d["pipeline"] = py::none();
    }
    d["max_plans"] = o.max_plans;
    return d;
  });
  // The checked options of modelpar.device.configure (device.py validated
  // them with options.py; configure() checks them again with passes' names).
  m.def("_device_configure",
        [](bool strict, bool warn, bool cache, int devices, const std::string& device_map,
           const std::string& placer, std::optional<int64_t> memory, int max_plans,
           std::optional<py::dict> pipeline) {
          Options o;
          o.strict = strict;
          o.warn_on_graph_break = warn;
          o.cache = cache;
          o.devices = devices;
          o.device_map = device_map;
          o.placer = placer;
          o.memory = memory;
          o.max_plans = max_plans;
          if (pipeline) {
            const py::dict& p = *pipeline;
            PipelineOptions po;
            po.microbatches = p["microbatches"].cast<int>();
            po.schedule = p["schedule"].cast<std::string>();
            if (p.contains("virtual_stages")) po.virtual_stages = p["virtual_stages"].cast<int>();
            po.partition = p["partition"].cast<std::string>();
            po.checkpoint = p["checkpoint"].cast<std::string>();
            po.portals = p["portals"].cast<bool>();
            po.batch_norm = p["batch_norm"].cast<std::string>();
            po.allow_random = p["allow_random"].cast<bool>();
            po.loss_reduction = p["loss_reduction"].cast<std::string>();
            if (p.contains("batched_inputs")) {
              po.batched_inputs = p["batched_inputs"].cast<std::vector<std::string>>();
            }
            o.pipeline = po;
          }
          configure(o);
        });
  m.def("_device_plans", [] {
    py::list out;
    for (const PlanInfo& p : plans()) out.append(py::make_tuple(p.graph, p.runs, p.summary));
    return out;
  });
  m.def("_device_clear_plans", &clearPlans);
  m.def("_device_last_graph", &lastGraph);
  m.def("_device_last_plan", &lastPlan);
  m.def("_device_name_tensor", [](const at::Tensor& t, const std::string& name, const std::string& role) {
    session().nameTensor(t, name, parseRole(role));
  });
  m.def("_device_push_scope", [](const std::string& name) { session().pushScope(name, /*absolute=*/true); });
  m.def("_device_pop_scope", [] { session().popScope(); });
}

}  // namespace modelpar
