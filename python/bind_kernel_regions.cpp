// modelpar._C.fuse_kernel_regions / one_device_program / node_calls: the
// kernel-region rewrite (passes/lower/kernel_regions.h) and what the Python
// side needs to rebuild a region's nodes as an FX graph for Inductor
// (modelpar/kernels/). Only pybind11, ir/ and passes/: no PyTorch header.
#include <pybind11/pybind11.h>
#include <pybind11/stl.h>

#include <optional>
#include <string>
#include <vector>

#include "ir/program.h"
#include "ir/types.h"

#ifdef MODELPAR_HAS_PASSES
#include "passes/lower/kernel_regions.h"
#endif

namespace py = pybind11;

namespace modelpar {

#ifdef MODELPAR_HAS_PASSES
namespace {

// An argument as Python reads it: a value as {"v": id}; a dtype, layout,
// memory format or device as a one-key dict naming its kind; lists as
// lists; the other constants as themselves.
py::object argToPython(const ir::Arg& a) {
  using K = ir::Arg::Kind;
  auto tagged = [](const char* kind, py::object v) {
    py::dict d;
    d[kind] = std::move(v);
    return py::object(std::move(d));
  };
  switch (a.kind()) {
    case K::None: return py::none();
    case K::Bool: return py::bool_(a.toBool());
    case K::Int: return py::int_(a.toInt());
    case K::Float: return py::float_(a.toDouble());
    case K::String: return py::str(a.toStringRef());
    case K::Dtype: return tagged("dtype", py::str(std::string(ir::name(a.toDtype()))));
    case K::Layout: return tagged("layout", py::str(std::string(ir::name(a.toLayout()))));
    case K::MemoryFormat:
      return tagged("memory_format", py::str(std::string(ir::name(a.toMemoryFormat()))));
    case K::Device: return tagged("device", py::str(a.toStringRef()));
    case K::Value: return tagged("v", py::int_(a.toValue()));
    case K::List: {
      py::list l;
      for (const ir::Arg& item : a.items()) l.append(argToPython(item));
      return std::move(l);
    }
  }
  return py::none();
}

py::dict nodeCall(const ir::Graph& g, const ir::Node& n) {
  py::list args;
  py::dict kwargs;
  for (const ir::Arg& a : n.args) {
    if (a.keyword().empty()) {
      args.append(argToPython(a));
    } else {
      kwargs[py::str(a.keyword())] = argToPython(a);
    }
  }
  // What a region can pass: tensors in and out, ints in (sizes).
  bool tensor_outputs = true;
  bool other_scalar_inputs = false;
  for (ir::ValueId v : n.inputs()) {
    const ir::Type& t = g.value(v).type;
    other_scalar_inputs = other_scalar_inputs || (!t.isTensor() && t.kind != ir::Type::Kind::Int);
  }
  for (ir::ValueId v : n.outputs) tensor_outputs = tensor_outputs && g.value(v).type.isTensor();
  py::dict d;
  d["op"] = n.op;
  d["overload"] = n.overload;
  d["args"] = args;
  d["kwargs"] = kwargs;
  d["outputs"] = n.outputs;
  d["tensor_outputs"] = tensor_outputs;
  d["reads_floats_or_bools"] = other_scalar_inputs;
  d["random"] = n.random;
  d["phase"] = n.phase ? py::object(py::str(std::string(ir::name(*n.phase)))) : py::object(py::none());
  d["device"] = n.device ? py::object(py::int_(*n.device)) : py::object(py::none());
  return d;
}

}  // namespace

void bindKernelRegions(py::module_& m) {
  m.def(
      "node_calls",
      [](const ir::Graph& g) {
        py::list out;
        for (const ir::Node& n : g.nodes()) out.append(nodeCall(g, n));
        return out;
      },
      py::arg("graph"),
      "Each node's call: op, overload, args, kwargs (values as {'v': id}), outputs, "
      "tensor_outputs, reads_floats_or_bools, random, phase, device.");
  m.def("one_device_program", &passes::oneDeviceProgram, py::arg("graph"),
        "The one-device program running every node of `graph` in order.");
  m.def(
      "fuse_kernel_regions",
      [](const ir::Program& p, const std::vector<bool>& fusible, int first_key, size_t min_nodes) {
        passes::KernelRegionOptions o;
        o.first_key = first_key;
        o.min_nodes = min_nodes;
        std::optional<passes::KernelRegions> fused;
        {
          py::gil_scoped_release no_gil;
          fused = passes::fuseKernelRegions(p, fusible, o);
        }
        passes::KernelRegions& k = *fused;
        py::list regions;
        for (const passes::KernelRegion& r : k.regions) {
          py::dict d;
          d["key"] = r.key;
          d["device"] = r.device;
          d["nodes"] = r.nodes;
          d["inputs"] = r.inputs;
          d["num_tensor_inputs"] = r.num_tensor_inputs;
          d["outputs"] = r.outputs;
          d["node"] = r.node;
          regions.append(d);
        }
        return py::make_tuple(std::move(k.program), regions);
      },
      py::arg("program"), py::arg("fusible"), py::arg("first_key") = 0, py::arg("min_nodes") = 2,
      "(program with each kernel region as one node, [region: key, device, nodes, inputs "
      "(tensors, then ints), num_tensor_inputs, outputs (ids of `program`), node (id in the new "
      "program)]); passes/lower/kernel_regions.h.");
}
#else
void bindKernelRegions(py::module_& /*m*/) {}
#endif

}  // namespace modelpar
