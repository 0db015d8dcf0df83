// modelpar._C: Python bindings of the IR (parse, print, verify, dot) and of
// the reference interpreters. modelpar's C++ errors become the Python classes
// of modelpar/errors.py. With the bind_*.cpp files it registers, the only
// code of modelpar that includes pybind11 and PyTorch's Python headers.
#include <torch/csrc/utils/pybind.h>

#include <string>
#include <utility>
#include <vector>

#include "ir/ir.h"
#include "python/value_conversion.h"
#include "runtime/runtime.h"

namespace py = pybind11;

namespace modelpar {
void bindCompile(py::module_& m);  // bind_compile.cpp: CompiledGraph (torch.compile backend)
void bindBackend(py::module_& m);  // bind_backend.cpp: the modelpar device
void bindExecutor(py::module_& m);  // bind_executor.cpp: Executor (multi-device runtime)
void bindRankExecutor(py::module_& m);  // bind_rank_executor.cpp: RankExecutor (one rank of a process group)
void bindPlan(py::module_& m);  // bind_plan.cpp: plan_graph, PlacementPlan (passes/plan_placement.h)
void bindPasses(py::module_& m);  // bind_passes.cpp: run_passes (passes/pass_registry.h)
void bindKernelRegions(py::module_& m);  // bind_kernel_regions.cpp: fuse_kernel_regions (passes/lower/kernel_regions.h)
void bindSearch(py::module_& m);  // bind_search.cpp: search_strategy (passes/search/strategy_search.h)
}  // namespace modelpar

namespace modelpar {
namespace {

/// Sets the Python error to modelpar.errors.<cls>(message, extra...).
template <typename... Extra>
void raise(const char* cls, const char* message, Extra... extra) {
  try {
    py::object type = py::module_::import("modelpar.errors").attr(cls);
    py::object exc = type(message, extra...);
    PyErr_SetObject(type.ptr(), exc.ptr());
  } catch (py::error_already_set&) {
    // modelpar.errors is missing or broken: still say what went wrong.
    PyErr_SetString(PyExc_RuntimeError, message);
  }
}

/// The most derived class first: a ParseError is also an InvalidIrError.
void translate(std::exception_ptr p) {
  try {
    std::rethrow_exception(p);
  } catch (const ParseError& e) {
    raise("ParseError", e.what(), e.textLine(), e.textColumn());
  } catch (const InvalidIrError& e) {
    raise("InvalidIrError", e.what());
  } catch (const UnsupportedOpError& e) {
    raise("UnsupportedOpError", e.what());
  } catch (const PlanDoesNotFitError& e) {
    raise("PlanDoesNotFitError", e.what());
  } catch (const ConfigError& e) {
    raise("ConfigError", e.what());
  } catch (const runtime::PeerError& e) {
    raise("PeerError", e.what(), e.peer());
  } catch (const ExecutionError& e) {
    raise("ExecutionError", e.what());
  } catch (const InternalError& e) {
    raise("InternalError", e.what());
  } catch (const Error& e) {
    raise("Error", e.what());
  } catch (const c10::Error& e) {
    PyErr_SetString(PyExc_RuntimeError, e.what_without_backtrace());
  }
}

std::vector<std::string> valueNames(const ir::Graph& g, const std::vector<ir::ValueId>& ids) {
  std::vector<std::string> names;
  names.reserve(ids.size());
  for (ir::ValueId v : ids) names.push_back(g.value(v).name);
  return names;
}

template <typename Executor, typename IrObject>
py::list runWith(const IrObject& ir, const py::sequence& inputs) {
  std::vector<c10::IValue> in = toIValues(inputs);
  std::vector<c10::IValue> out;
  {
    py::gil_scoped_release no_gil;
    Executor executor(ir);
    out = executor.run(std::move(in));
  }
  return toPython(out);
}

}  // namespace
}  // namespace modelpar

PYBIND11_MODULE(_C, m) {
  using namespace modelpar;
  m.doc() = "modelpar C++ core: IR parsing/printing/verification and the reference interpreters.";
  py::register_exception_translator(&translate);

  py::class_<ir::Graph>(m, "Graph",
                        "A dataflow graph of ATen operator calls (the text form is in ir/README.md).")
      .def("__str__", [](const ir::Graph& g) { return ir::print(g); })
      .def("__repr__", [](const ir::Graph& g) {
        return c10::str("<modelpar.Graph @", g.name(), ": ", g.inputs().size(), " inputs, ",
                        g.numNodes(), " nodes>");
      })
      .def("__eq__", [](const ir::Graph& a, const ir::Graph& b) { return a == b; },
           py::is_operator())
      .def("to_dot", [](const ir::Graph& g) { return ir::toDot(g); },
           "Graphviz text of the graph.")
      .def("verify", [](const ir::Graph& g) { ir::verify(g); },
           "Checks the graph's invariants. Raises InvalidIrError naming the node at fault.")
      .def_property_readonly("name", &ir::Graph::name)
      .def_property_readonly("num_nodes", &ir::Graph::numNodes)
      .def_property_readonly("num_values", &ir::Graph::numValues)
      .def_property_readonly("input_names", [](const ir::Graph& g) {
        std::vector<ir::ValueId> ids;
        for (const ir::Input& in : g.inputs()) ids.push_back(in.value);
        return valueNames(g, ids);
      })
      .def_property_readonly("output_names",
                             [](const ir::Graph& g) { return valueNames(g, g.outputs()); });

  py::class_<ir::Program>(m, "Program",
                          "A graph plus one ordered instruction list per logical device.")
      .def("__str__", [](const ir::Program& p) { return ir::print(p); })
      .def("__repr__", [](const ir::Program& p) {
        return c10::str("<modelpar.Program @", p.graph().name(), ": ", p.numDevices(),
                        " devices>");
      })
      .def("__eq__", [](const ir::Program& a, const ir::Program& b) { return a == b; },
           py::is_operator())
      .def("to_dot", [](const ir::Program& p) { return ir::toDot(p); },
           "Graphviz text: one cluster per device, send/recv edges dashed.")
      .def("verify", [](const ir::Program& p) { ir::verify(p); },
           "Checks the program's invariants (placement, send/recv matching, liveness, "
           "deadlock). Raises InvalidIrError.")
      .def_property_readonly("graph", [](const ir::Program& p) { return p.graph(); },
                             "A copy of the program's graph.")
      .def_property_readonly("num_devices", &ir::Program::numDevices)
      .def_property_readonly(
          "computing_devices",
          [](const ir::Program& p) {
            int n = 0;
            for (int d = 0; d < p.numDevices(); ++d) {
              for (const ir::Instruction& in : p.schedule(d)) {
                if (in.kind == ir::Instruction::Kind::Run) {
                  ++n;
                  break;
                }
              }
            }
            return n;
          },
          "How many devices run at least one op (a one-device plan of an N-device "
          "program: 1).");

  m.def("parse_graph", [](const std::string& text) { return ir::parseGraph(text); },
        py::arg("text"));
  m.def("parse_program", [](const std::string& text) { return ir::parseProgram(text); },
        py::arg("text"));
  m.def("run_graph", &runWith<runtime::Interpreter, ir::Graph>, py::arg("graph"),
        py::arg("inputs"));
  m.def("run_program", &runWith<runtime::ProgramInterpreter, ir::Program>, py::arg("program"),
        py::arg("inputs"));
  bindCompile(m);
  bindBackend(m);
  bindExecutor(m);
  bindRankExecutor(m);
  bindPlan(m);
  bindPasses(m);
  bindSearch(m);
  bindKernelRegions(m);
}
