// Python <-> IValue conversion of the inputs and outputs of graphs and
// programs, shared by the bindings (module.cpp, bind_executor.cpp).
// bind_compile.cpp keeps its own raw-CPython version on the per-call hot path.
#pragma once

#include <ATen/core/ivalue.h>
#include <torch/csrc/utils/pybind.h>

#include <vector>

#include "runtime/memory_meter.h"

namespace modelpar {

/// Tensors, bools, ints and floats to IValues; anything else raises
/// TypeError naming the input's position and type; an int outside int64 raises
/// ExecutionError (never leaves a Python error set).
std::vector<c10::IValue> toIValues(const pybind11::sequence& inputs);
/// Tensors, bools, ints, floats and None back to Python; other kinds raise
/// ExecutionError.
pybind11::list toPython(const std::vector<c10::IValue>& values);

/// A measured step's memory (Note [Measured memory]) as
/// {"steps": n, "devices": [{"start_bytes", "peak_bytes",
/// "peak_instruction", "end_bytes"}, ...]}: the executors' memory_report().
pybind11::dict memoryReportToPython(const runtime::MemoryReport& report);

}  // namespace modelpar
