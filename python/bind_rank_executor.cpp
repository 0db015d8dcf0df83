// modelpar._C.RankExecutor: the rank executor (runtime/rank_executor.h) for
// Python. The process group is found by name in c10d's registry, where
// torch.distributed registers every group it creates (`group.group_name`),
// so no pybind holder crosses between torch's module and ours.
#include <torch/csrc/utils/pybind.h>

#include <chrono>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include <torch/csrc/distributed/c10d/GroupRegistry.hpp>
#include <torch/csrc/distributed/c10d/ProcessGroup.hpp>

#include "ir/program.h"
#include "python/value_conversion.h"
#include "runtime/check.h"
#include "runtime/execution_trace.h"
#include "runtime/rank_executor.h"

namespace py = pybind11;

namespace modelpar {

void bindRankExecutor(py::module_& m) {
  using runtime::RankExecutor;
  py::class_<RankExecutor>(m, "RankExecutor",
                           "Runs one rank's instruction list of a Program over a c10d process "
                           "group (runtime/rank_executor.h).")
      .def(py::init([](const ir::Program& p, const std::string& group_name, double timeout_s,
                       const std::string& device, std::vector<size_t> replicated,
                       std::vector<std::pair<size_t, int>> homes, bool verify, bool record_trace,
                       const std::string& reverse_group_name, bool measure_memory) {
             MP_RT_CHECK(timeout_s > 0, ConfigError, "modelpar rank executor: timeout must be > 0 s, got ",
                         timeout_s);
             auto resolve = [](const std::string& name, const char* hint) {
               try {
                 return c10d::resolve_process_group(name);
               } catch (const std::exception&) {
                 MP_RT_THROW(ConfigError, "modelpar rank executor: no process group named '", name,
                             "' (", hint, ")");
               }
             };
             c10::intrusive_ptr<c10d::ProcessGroup> group =
                 resolve(group_name, "is torch.distributed initialised?");
             runtime::RankExecutorOptions o;
             if (!reverse_group_name.empty()) o.reverse_group = resolve(reverse_group_name, "the reverse group");
             o.verify = verify;
             o.timeout = std::chrono::milliseconds(static_cast<int64_t>(timeout_s * 1000.0));
             o.device = c10::Device(device);
             o.replicated_outputs = std::move(replicated);
             o.output_homes = std::move(homes);
             o.record_trace = record_trace;
             o.measure_memory = measure_memory;
             py::gil_scoped_release no_gil;
             return std::make_unique<RankExecutor>(p, std::move(group), std::move(o));
           }),
           py::arg("program"), py::kw_only(), py::arg("group_name"), py::arg("timeout_s") = 30.0,
           py::arg("device") = "cpu", py::arg("replicated_outputs") = std::vector<size_t>{},
           py::arg("output_homes") = std::vector<std::pair<size_t, int>>{},
           py::arg("verify") = true, py::arg("record_trace") = false,
           py::arg("reverse_group_name") = "", py::arg("measure_memory") = false)
      .def("memory_report",
           [](const RankExecutor& ex) {
             runtime::MemoryReport r;
             {
               py::gil_scoped_release no_gil;  // waits for a step in flight
               r = ex.memoryReport();
             }
             return memoryReportToPython(r);
           },
           "This rank's measured memory of the last step, one entry per device with this "
           "rank's filled (Note [Measured memory]); needs measure_memory=True.")
      .def("chrome_trace",
           [](const RankExecutor& ex) { return runtime::toChromeTrace(ex.program(), ex.lastTrace()); },
           "Chrome trace JSON of the last step on this rank (needs record_trace=True).")
      .def("run",
           [](RankExecutor& ex, const py::sequence& inputs) {
             // Inputs of other ranks are not read: None passes as an empty IValue.
             std::vector<c10::IValue> in(inputs.size());
             for (size_t k = 0; k < in.size(); ++k) {
               py::object o = inputs[k];
               if (!o.is_none()) in[k] = toIValues(py::make_tuple(o))[0];
             }
             std::vector<c10::IValue> out;
             {
               py::gil_scoped_release no_gil;
               out = ex.run(std::move(in));
             }
             return toPython(out);
           },
           py::arg("inputs"))
      .def_property_readonly("rank", &RankExecutor::rank)
      .def_property_readonly("world_size", &RankExecutor::worldSize)
      .def_property_readonly("num_devices", [](const RankExecutor& ex) { return ex.worldSize(); })
      .def_property_readonly("output_holders", &RankExecutor::outputHolders)
      .def_property_readonly("last_step_wait_ns", &RankExecutor::lastStepWaitNs,
                             "Nanoseconds the last step spent waiting for other ranks.")
      .def_property_readonly("program", [](const RankExecutor& ex) { return ex.program(); },
                             "A copy of the program it runs.");
  m.def("input_devices",
        [](const ir::Program& p) {
          std::vector<int> out;
          for (const ir::Input& in : p.graph().inputs()) out.push_back(in.device.value_or(0));
          return out;
        },
        py::arg("program"), "The device of each graph input of a program (0 when unset).");
}

}  // namespace modelpar
