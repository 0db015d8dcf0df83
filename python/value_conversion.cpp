// Python <-> IValue conversion (see value_conversion.h).
#include "python/value_conversion.h"

#include <string>
#include <utility>

#include "ir/error.h"

namespace py = pybind11;

namespace modelpar {

std::vector<c10::IValue> toIValues(const py::sequence& inputs) {
  std::vector<c10::IValue> out;
  out.reserve(inputs.size());
  for (size_t i = 0; i < inputs.size(); ++i) {
    py::object h = inputs[i];
    py::detail::make_caster<at::Tensor> tensor;
    if (tensor.load(h, /*convert=*/false)) {
      out.emplace_back(py::detail::cast_op<at::Tensor>(std::move(tensor)));
    } else if (PyBool_Check(h.ptr())) {  // before int: bool is an int in Python
      out.emplace_back(h.cast<bool>());
    } else if (PyLong_Check(h.ptr())) {
      int overflow = 0;
      const long long v = PyLong_AsLongLongAndOverflow(h.ptr(), &overflow);
      if (overflow != 0) {
        throw ExecutionError(c10::str("input ", i, ": the int is ", overflow > 0 ? "above" : "below",
                                      " the int64 range [-2**63, 2**63 - 1] that sizes and int "
                                      "arguments have"));
      }
      out.emplace_back(static_cast<int64_t>(v));
    } else if (PyFloat_Check(h.ptr())) {
      out.emplace_back(h.cast<double>());
    } else {
      throw py::type_error(c10::str("input ", i, ": expected a torch.Tensor, int, float or bool, got ",
                                    std::string(py::str(py::type::of(h).attr("__name__")))));
    }
  }
  return out;
}

py::list toPython(const std::vector<c10::IValue>& values) {
  py::list out;
  for (const c10::IValue& v : values) {
    if (v.isTensor()) {
      out.append(py::cast(v.toTensor()));
    } else if (v.isBool()) {
      out.append(py::bool_(v.toBool()));
    } else if (v.isInt()) {
      out.append(py::int_(v.toInt()));
    } else if (v.isDouble()) {
      out.append(py::float_(v.toDouble()));
    } else if (v.isNone()) {
      out.append(py::none());
    } else {
      throw ExecutionError(c10::str("cannot return a ", v.tagKind(), " value to Python"));
    }
  }
  return out;
}

pybind11::dict memoryReportToPython(const runtime::MemoryReport& report) {
  pybind11::list devices;
  for (const runtime::DeviceMemory& m : report.devices) {
    pybind11::dict d;
    d["start_bytes"] = m.start_bytes;
    d["peak_bytes"] = m.peak_bytes;
    d["peak_instruction"] = m.peak_instruction;
    d["end_bytes"] = m.end_bytes;
    devices.append(d);
  }
  pybind11::dict d;
  d["steps"] = report.steps;
  d["devices"] = devices;
  return d;
}

}  // namespace modelpar
