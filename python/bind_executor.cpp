// modelpar._C.Executor: the multi-device executor (runtime/executor.h) for
// Python. Construction parses the device map and starts the workers; run()
// converts the inputs, releases the GIL while every device works (operators
// written in Python take it back on the worker that calls them), and
// converts the outputs back.
#include <torch/csrc/utils/pybind.h>

#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "ir/program.h"
#include "python/value_conversion.h"
#include "runtime/capture_check.h"
#include "runtime/check.h"
#include "runtime/device.h"
#include "runtime/execution_trace.h"
#include "runtime/executor.h"

namespace py = pybind11;

namespace modelpar {
namespace {

using runtime::Executor;

py::list spans(const std::vector<std::vector<runtime::Span>>& by_device) {
  py::list out;
  for (const std::vector<runtime::Span>& device : by_device) {
    py::list l;
    for (const runtime::Span& s : device) {
      l.append(s.empty() ? py::object(py::none()) : py::object(py::make_tuple(s.start_ns, s.end_ns)));
    }
    out.append(l);
  }
  return out;
}

runtime::Replay parseReplay(const std::string& replay) {
  if (replay == "streams") return runtime::Replay::Streams;
  if (replay == "graphs") return runtime::Replay::Graphs;
  MP_RT_THROW(ConfigError, "modelpar executor: replay must be 'streams' or 'graphs', got '", replay, "'");
}

py::list issues(const std::vector<runtime::CaptureIssue>& all) {
  py::list out;
  for (const runtime::CaptureIssue& i : all) {
    py::dict d;
    d["device"] = i.device;
    d["instruction"] = i.instruction;
    d["what"] = i.what;
    out.append(d);
  }
  return out;
}

}  // namespace

void bindExecutor(py::module_& m) {
  py::class_<Executor>(m, "Executor",
                       "Runs a Program with one worker per logical device (runtime/executor.h).")
      .def(py::init([](const ir::Program& p, const std::string& device_map, int threads_per_device,
                       bool record_trace, bool verify, const std::string& replay, int warmup_steps,
                       bool outputs_may_alias, bool measure_memory) {
             runtime::DeviceMap map = runtime::DeviceMap::parse(device_map, p.numDevices(), threads_per_device);
             runtime::ExecutorOptions o{.verify = verify, .record_trace = record_trace};
             o.replay = parseReplay(replay);
             o.warmup_steps = warmup_steps;
             o.outputs_may_alias = outputs_may_alias;
             o.measure_memory = measure_memory;
             py::gil_scoped_release no_gil;
             return std::make_unique<Executor>(p, map, o);
           }),
           py::arg("program"), py::kw_only(), py::arg("device_map") = "cpu-workers",
           py::arg("threads_per_device") = 0, py::arg("record_trace") = false,
           py::arg("verify") = true, py::arg("replay") = "streams", py::arg("warmup_steps") = 1,
           py::arg("outputs_may_alias") = false, py::arg("measure_memory") = false)
      .def("run",
           [](Executor& ex, const py::sequence& inputs) {
             std::vector<c10::IValue> in = toIValues(inputs);
             std::vector<c10::IValue> out;
             {
               py::gil_scoped_release no_gil;
               out = ex.run(std::move(in));
             }
             return toPython(out);
           },
           py::arg("inputs"))
      .def("chrome_trace",
           [](const Executor& ex) { return runtime::toChromeTrace(ex.program(), ex.lastTrace()); },
           "Chrome trace JSON of the last step (needs record_trace=True).")
      .def("write_chrome_trace",
           [](const Executor& ex, const std::string& path) {
             runtime::writeChromeTrace(path, ex.program(), ex.lastTrace());
           },
           py::arg("path"))
      .def("last_trace",
           [](const Executor& ex) {
             const runtime::ExecutionTrace& t = ex.lastTrace();
             py::dict d;
             d["host"] = spans(t.host);
             d["transfer"] = spans(t.transfer);
             d["step_ns"] = t.step_ns;
             return d;
           },
           "Measured (start_ns, end_ns) per device and instruction of the last step; None "
           "where an instruction did not run. Empty lists unless record_trace=True.")
      .def("replay_status",
           [](const Executor& ex) {
             runtime::ReplayStatus st;
             {
               py::gil_scoped_release no_gil;  // waits for a step in flight
               st = ex.replayStatus();
             }
             py::dict d;
             d["requested"] = st.requested == runtime::Replay::Graphs ? "graphs" : "streams";
             d["steps"] = st.steps;
             d["captured"] = st.captured;
             d["static_buffers"] = st.static_buffers;
             d["graphs"] = st.graphs;
             d["own_address_inputs"] = st.own_address_inputs;
             d["recaptures"] = st.recaptures;
             d["last_recapture"] = st.last_recapture;
             d["issues"] = issues(st.issues);
             d["summary"] = st.summary;
             return d;
           },
           "What graph replay is doing (runtime/executor.h ReplayStatus).")
      .def("memory_report",
           [](const Executor& ex) {
             runtime::MemoryReport r;
             {
               py::gil_scoped_release no_gil;  // waits for a step in flight
               r = ex.memoryReport();
             }
             return memoryReportToPython(r);
           },
           "Measured per-device memory of the last step (runtime/memory_meter.h "
           "Note [Measured memory]); needs measure_memory=True.")
      .def_property_readonly("device_map", [](const Executor& ex) { return ex.deviceMap().toString(); })
      .def_property_readonly("num_devices", [](const Executor& ex) { return ex.program().numDevices(); })
      .def_property_readonly("program", [](const Executor& ex) { return ex.program(); },
                             "A copy of the program it runs.");
  m.def("cuda_devices_built", &runtime::cudaDevicesBuilt,
        "Whether this build has the executor's CUDA devices.");
  m.def("cuda_device_count", &runtime::cudaDeviceCount);
  m.def("capture_issues",
        [](const ir::Program& p, const std::string& device_map) {
          return issues(runtime::captureIssues(p, runtime::DeviceMap::parse(device_map, p.numDevices())));
        },
        py::arg("program"), py::arg("device_map"),
        "Why the program on the device map cannot be captured into CUDA graphs "
        "(runtime/capture_check.h); needs no GPU.");
}

}  // namespace modelpar
