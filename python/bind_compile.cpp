// modelpar._C.CompiledGraph: the object the torch.compile backend hands back
// to AOTAutograd. It owns a runtime::Interpreter (every operator resolved
// once, when it is built) and does per call only what Python must: unpack the
// argument list, run the graph with the GIL released, and pack the results in
// the order the FX graph returns them (None where it returns None).
#include <torch/csrc/autograd/python_variable.h>
#include <torch/csrc/utils/pybind.h>

#include <string>
#include <tuple>
#include <utility>
#include <vector>

#include "ir/ir.h"
#include "runtime/check.h"
#include "runtime/interpreter.h"
#include "runtime/sym_ops.h"
#include "runtime/value_types.h"

namespace py = pybind11;

namespace modelpar {
namespace {

/// Example (what modelpar/compile/backend.py does with an imported FX graph):
///   g = modelpar.parse_graph(text)                 # inputs: FX placeholders, then constants
///   cg = CompiledGraph(g, [0, -1, 1], [const0])    # FX output 1 is None
///   outs = cg.run(args, True)                      # args: list of tensors / ints / floats / bools
///
/// `run` is thread-safe (Interpreter::run keeps no state between calls).
class CompiledGraph {
 public:
  /// `output_map[i]` is the graph output that FX output i returns, or -1 for
  /// None. `constants` are bound to the last graph inputs on every call.
  /// Throws UnsupportedOpError / InvalidIrError when a node cannot be resolved
  /// (so callers learn it at compile time, not on the first call).
  CompiledGraph(const ir::Graph& g, std::vector<int64_t> output_map, std::vector<at::Tensor> constants)
      : interp_(g), output_map_(std::move(output_map)) {
    const size_t num_inputs = g.inputs().size();
    MP_RT_CHECK(constants.size() <= num_inputs, InvalidIrError, "modelpar compile: graph @",
                g.name(), " has ", num_inputs, " inputs but ", constants.size(), " constants");
    num_args_ = num_inputs - constants.size();
    for (at::Tensor& t : constants) constants_.emplace_back(std::move(t));
    const int64_t num_outputs = static_cast<int64_t>(g.outputs().size());
    for (int64_t o : output_map_) {
      MP_RT_CHECK(o >= -1 && o < num_outputs, InvalidIrError, "modelpar compile: graph @",
                  g.name(), ": output map entry ", o, " is out of range (", num_outputs,
                  " outputs)");
    }
  }

  /// Runs the graph on `args` (one per non-constant graph input). With
  /// `steal`, empties `args` first (AOTAutograd's boxed calling convention:
  /// the callee may free inputs early).
  py::list run(const py::list& args, bool steal) const {
    PyObject* list = args.ptr();
    const Py_ssize_t n = PyList_GET_SIZE(list);
    MP_RT_CHECK(static_cast<size_t>(n) == num_args_, ExecutionError, "modelpar: graph @",
                interp_.graph().name(), " takes ", num_args_, " arguments, got ", n);
    std::vector<c10::IValue> in;
    in.reserve(num_args_ + constants_.size());
    for (Py_ssize_t i = 0; i < n; ++i) in.push_back(toIValue(PyList_GET_ITEM(list, i), i));
    in.insert(in.end(), constants_.begin(), constants_.end());
    if (steal) PyList_SetSlice(list, 0, n, nullptr);

    std::vector<c10::IValue> out;
    {
      py::gil_scoped_release no_gil;
      out = interp_.run(std::move(in));
    }
    py::list result(output_map_.size());
    for (size_t i = 0; i < output_map_.size(); ++i) {
      const int64_t o = output_map_[i];
      PyObject* item = o < 0 ? Py_NewRef(Py_None) : toPython(out[static_cast<size_t>(o)]);
      PyList_SET_ITEM(result.ptr(), static_cast<Py_ssize_t>(i), item);
    }
    return result;
  }

  const ir::Graph& graph() const { return interp_.graph(); }
  size_t numArgs() const { return num_args_; }

 private:
  c10::IValue toIValue(PyObject* h, Py_ssize_t i) const {
    if (THPVariable_Check(h)) return THPVariable_Unpack(h);
    if (PyBool_Check(h)) return h == Py_True;  // before int: bool is an int in Python
    if (PyLong_Check(h)) {
      // Without the overflow flag PyLong_AsLongLong returns -1 and leaves an
      // OverflowError set, which would surface later, somewhere unrelated.
      int overflow = 0;
      const long long v = PyLong_AsLongLongAndOverflow(h, &overflow);
      MP_RT_CHECK(overflow == 0, ExecutionError, "modelpar: graph @", interp_.graph().name(),
                  " argument ", i, ": the int is ", overflow > 0 ? "above" : "below",
                  " the int64 range [-2**63, 2**63 - 1] that sizes and int arguments have");
      return static_cast<int64_t>(v);
    }
    if (PyFloat_Check(h)) return PyFloat_AS_DOUBLE(h);
    throw py::type_error(c10::str("modelpar: graph @", interp_.graph().name(), " argument ", i,
                                  ": expected a torch.Tensor, int, float or bool, got ",
                                  Py_TYPE(h)->tp_name));
  }

  static PyObject* toPython(const c10::IValue& v) {
    if (v.isTensor()) return THPVariable_Wrap(v.toTensor());  // undefined -> None
    if (v.isBool()) return Py_NewRef(v.toBool() ? Py_True : Py_False);
    if (v.isInt()) return PyLong_FromLongLong(v.toInt());
    if (v.isDouble()) return PyFloat_FromDouble(v.toDouble());
    if (v.isNone()) return Py_NewRef(Py_None);
    throw ExecutionError(c10::str("modelpar: cannot return a ", v.tagKind(), " value to Python"));
  }

  runtime::Interpreter interp_;
  std::vector<int64_t> output_map_;
  std::vector<c10::IValue> constants_;
  size_t num_args_ = 0;
};

}  // namespace

void bindCompile(py::module_& m) {
  runtime::registerSymOps();
  // AOTAutograd calls a compiled graph boxed (`f(args)`, args stolen) when
  // the callable has a `_boxed_call` attribute; the object itself is then
  // what it calls, with no Python frame in between. The attribute must live
  // in the instance's __dict__ (dynamic_attr): Dynamo's disable() wraps the
  // backward with functools.wraps, which copies __dict__ only.
  py::class_<CompiledGraph>(m, "CompiledGraph", py::dynamic_attr(),
                            "A captured graph bound to the C++ interpreter (torch.compile backend).")
      .def(py::init<const ir::Graph&, std::vector<int64_t>, std::vector<at::Tensor>>(),
           py::arg("graph"), py::arg("output_map"), py::arg("constants"))
      .def("run", &CompiledGraph::run, py::arg("args"), py::arg("steal") = false,
           "Runs the graph; returns one value per FX output (None where output_map has -1).")
      .def("__call__", [](const CompiledGraph& c, const py::list& args) { return c.run(args, true); },
           py::arg("args"), "run(args, steal=True): AOTAutograd's boxed calling convention.")
      .def_property_readonly("graph", [](const CompiledGraph& c) { return c.graph(); },
                             "A copy of the IR graph it runs.")
      .def_property_readonly("num_args", &CompiledGraph::numArgs);
  m.def(
      "graph_nodes",
      [](const ir::Graph& g) {
        std::vector<std::tuple<std::string, std::string, std::string>> out;
        for (const ir::Node& n : g.nodes()) {
          out.emplace_back(n.qualifiedName(), n.layer,
                           n.phase ? std::string(ir::name(*n.phase)) : std::string());
        }
        return out;
      },
      py::arg("graph"), "(op, layer, phase) of every node, in order.");
  m.def(
      "graph_input_roles",
      [](const ir::Graph& g) {
        std::vector<std::string> out;
        for (const ir::Input& in : g.inputs()) out.emplace_back(ir::name(in.role));
        return out;
      },
      py::arg("graph"), "The role (input, param, buffer) of every graph input.");
  m.def("sym_op_names", &runtime::symOpNames,
        "Names of the modelpar::sym_* operators (size arithmetic of dynamic shapes).");
}

}  // namespace modelpar
