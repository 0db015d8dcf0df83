// modelpar._C.plan_graph and PlacementPlan: the model-parallel sequence of passes
// (passes/plan_placement.h) from Python. modelpar/planning.py wraps plan_graph
// with argument parsing (memory strings, paths); the CLI and PlacementPlan.place use it.
#include <torch/csrc/utils/pybind.h>

#ifdef MODELPAR_HAS_PASSES
#include <algorithm>
#include <map>
#include <optional>
#include <string>
#include <tuple>
#include <utility>
#include <vector>

#include "ir/check.h"
#include "ir/ir.h"
#include "passes/passes.h"
// The single passes bound on their own (calibration, op families, the
// pipeline passes the Python tests drive one at a time).
#include "passes/cost/calibrate.h"
#include "passes/cost/cost_model.h"
#include "passes/cost/op_family.h"
#include "passes/pipeline/checkpoint.h"
#include "passes/pipeline/layer_chain.h"
#include "passes/pipeline/microbatch.h"
#include "passes/pipeline/partition.h"
#include "passes/pipeline/split_phases.h"

namespace py = pybind11;

namespace modelpar {
namespace {

/// A node's name for Python: its first output's name, or its label.
std::string nodeName(const ir::Graph& g, ir::NodeId n) {
  const ir::Node& node = g.node(n);
  return node.outputs.empty() ? node.label : g.value(node.outputs[0]).name;
}

passes::PlacementOptions planOptions(std::optional<int> devices, std::vector<int64_t> memory,
                                std::string placer, bool coarsen,
                                std::optional<std::string> dump_dir, double lp_time_limit_s,
                                std::vector<std::pair<std::string, int>> pinned_layers,
                                bool receive_in_send_order) {
  passes::PlacementOptions o;
  o.receive_in_send_order = receive_in_send_order;
  o.pinned_layers = std::move(pinned_layers);
  o.devices = devices;
  o.memory_bytes = std::move(memory);
  o.placer = std::move(placer);
  o.coarsen = coarsen;
  o.dump_dir = std::move(dump_dir);
  o.msct_lp_time_limit_s = lp_time_limit_s;
  o.record_timeline = true;  // write_trace works on every plan
  return o;
}

passes::PlacementPlan planGraph(const ir::Graph& g, std::optional<int> devices,
                       std::vector<int64_t> memory, std::string placer,
                       std::optional<std::string> machine, bool coarsen,
                       std::optional<std::string> dump_dir, double lp_time_limit_s,
                       std::vector<std::pair<std::string, int>> pinned_layers,
                       bool receive_in_send_order) {
  passes::PlacementOptions o = planOptions(devices, std::move(memory), std::move(placer), coarsen,
                                      std::move(dump_dir), lp_time_limit_s,
                                      std::move(pinned_layers), receive_in_send_order);
  py::gil_scoped_release no_gil;
  if (machine) o.machine = passes::DeviceModel::load(*machine);
  return passes::planPlacement(g, o);
}

// passes::planJoint: (joint plan, forward plan, backward plan, backward nodes
// moved to their layer's forward device, gradient producers moved).
std::tuple<passes::PlacementPlan, passes::PlacementPlan, passes::PlacementPlan, int64_t, int64_t> planJoint(
    const ir::Graph& fw, const ir::Graph& bw,
    const std::vector<std::pair<std::string, std::string>>& saved,
    const std::vector<std::pair<std::string, std::string>>& tangents,
    const std::vector<std::pair<int, int>>& gradients, std::optional<int> devices,
    std::vector<int64_t> memory, std::string placer, std::optional<std::string> machine,
    bool coarsen, std::optional<std::string> dump_dir, double lp_time_limit_s,
    const std::map<std::string, int64_t>& symbol_sizes,
    std::vector<std::pair<std::string, int>> pinned_layers,
    std::vector<std::pair<std::string, int>> pinned_inputs, bool receive_in_send_order) {
  passes::PlacementOptions o = planOptions(devices, std::move(memory), std::move(placer), coarsen,
                                      std::move(dump_dir), lp_time_limit_s,
                                      std::move(pinned_layers), receive_in_send_order);
  o.pinned_inputs = std::move(pinned_inputs);
  // The sizes of this call: costs and memory at the batch being planned, not
  // at CostOptions::default_symbol_size.
  o.cost_options.symbol_sizes.insert(symbol_sizes.begin(), symbol_sizes.end());
  passes::JointPlanOptions jo;
  for (const auto& [b, f] : saved) jo.saved.push_back({b, f});
  for (const auto& [b, f] : tangents) jo.tangents.push_back({b, f});
  jo.gradients = gradients;
  py::gil_scoped_release no_gil;
  if (machine) o.machine = passes::DeviceModel::load(*machine);
  passes::JointPlan jp = passes::planJoint(fw, bw, jo, o);
  return {std::move(jp.joint), std::move(jp.forward), std::move(jp.backward),
          jp.moved_to_layer_device, jp.moved_to_parameter_device};
}

// passes::joinForwardBackward for a step run as one program (the pipelined
// torch.compile path): the first `keep_forward_outputs` forward outputs (the
// user's, mutated inputs first) are always returned, then the backward's.
// Returns (joint graph, joint value name of each kept forward output, of
// each backward output).
std::tuple<ir::Graph, std::vector<std::string>, std::vector<std::string>> joinStep(
    const ir::Graph& fw, const ir::Graph& bw,
    const std::vector<std::pair<std::string, std::string>>& saved,
    const std::vector<std::pair<std::string, std::string>>& tangents, size_t keep_forward_outputs,
    const std::vector<std::pair<std::string, std::string>>& zero_tangents) {
  std::vector<passes::SavedLink> s, t, z;
  for (const auto& [b, f] : saved) s.push_back({b, f});
  for (const auto& [b, f] : tangents) t.push_back({b, f});
  for (const auto& [b, f] : zero_tangents) z.push_back({b, f});
  MP_CHECK(keep_forward_outputs <= fw.outputs().size(), InvalidIrError,
           "modelpar join: keep_forward_outputs={} but the forward graph @{} has {} outputs",
           keep_forward_outputs, fw.name(), fw.outputs().size());
  passes::JointGraph jg = passes::joinForwardBackward(fw, bw, s, t, z);
  std::vector<ir::ValueId> outs;
  std::vector<std::string> fw_names, bw_names;
  auto add = [&](ir::ValueId v, std::vector<std::string>& names) {
    names.push_back(jg.graph.value(v).name);
    if (std::find(outs.begin(), outs.end(), v) == outs.end()) outs.push_back(v);
  };
  for (size_t i = 0; i < keep_forward_outputs; ++i) {
    add(jg.forward_value[static_cast<size_t>(fw.outputs()[i])], fw_names);
  }
  for (ir::ValueId v : bw.outputs()) add(jg.backward_value[static_cast<size_t>(v)], bw_names);
  jg.graph.setOutputs(std::move(outs));
  ir::verify(jg.graph);
  return {std::move(jg.graph), std::move(fw_names), std::move(bw_names)};
}

// PlacementPlan, plan_graph, plan_joint, join_step: model parallelism.
void bindPlacement(py::module_& m) {
  using passes::PlacementPlan;
  py::class_<PlacementPlan>(m, "PlacementPlan",
                   "A model-parallel plan of one graph (passes/plan_placement.h): the lowered Program, "
                   "the placement, the simulated step and the pass statistics. str() is the "
                   "summary.")
      .def("summary", &PlacementPlan::summary)
      .def("__str__", &PlacementPlan::summary)
      .def(
          "with_inputs_at_home",
          [](const PlacementPlan& p, const passes::InputHomes& homes) {
            return passes::rehomePlanInputs(p, homes);
          },
          py::arg("homes"),
          "This plan with each (graph input name, device) of `homes` bound on that device and "
          "sent from there to where the program reads it, its step simulated again "
          "(passes/plan_rehome.h).")
      .def("__repr__", [](const PlacementPlan& p) {
        return c10::str("<modelpar.PlacementPlan @", p.program.graph().name(), ": ",
                        p.placement.placer, " on ", p.placement.num_devices, " devices, step ",
                        passes::formatMicros(p.stepTimeUs()), ">");
      })
      .def_property_readonly("program", [](const PlacementPlan& p) { return p.program; },
                             "The lowered Program (a copy): devices, costs, send/recv/free.")
      .def_property_readonly(
          "placement",
          [](const PlacementPlan& p) {
            py::dict d;
            const ir::Graph& g = p.program.graph();
            for (size_t n = 0; n < g.numNodes(); ++n) {
              d[py::str(nodeName(g, static_cast<ir::NodeId>(n)))] = p.placement.node_device[n];
            }
            return d;
          },
          "dict: node name (its first output, or its label) -> device.")
      .def_property_readonly(
          "layer_devices",
          [](const PlacementPlan& p) {
            py::dict d;
            const ir::Graph& g = p.program.graph();
            for (size_t n = 0; n < g.numNodes(); ++n) {
              const std::string& layer = g.node(static_cast<ir::NodeId>(n)).layer;
              if (layer.empty() || d.contains(py::str(layer))) continue;
              d[py::str(layer)] = p.placement.node_device[n];
            }
            return d;
          },
          "dict: layer -> the device of its first node in graph order.")
      .def_property_readonly(
          "order",
          [](const PlacementPlan& p) {
            std::vector<std::vector<std::string>> out;
            for (const auto& ord : p.placement.order) {
              out.emplace_back();
              for (ir::NodeId n : ord) out.back().push_back(nodeName(p.program.graph(), n));
            }
            return out;
          },
          "Per device, the node names in execution order.")
      .def_property_readonly(
          "value_devices",
          [](const PlacementPlan& p) {
            py::dict d;
            const ir::Graph& g = p.program.graph();
            for (const ir::Input& in : g.inputs()) {
              d[py::str(g.value(in.value).name)] = in.device.value_or(-1);
            }
            for (size_t n = 0; n < g.numNodes(); ++n) {
              for (ir::ValueId v : g.node(static_cast<ir::NodeId>(n)).outputs) {
                d[py::str(g.value(v).name)] = p.placement.node_device[n];
              }
            }
            return d;
          },
          "dict: every value name (inputs and node outputs) -> the device it is made on.")
      .def_property_readonly(
          "input_devices",
          [](const PlacementPlan& p) {
            py::dict d;
            const ir::Graph& g = p.program.graph();
            for (const ir::Input& in : g.inputs()) {
              d[py::str(g.value(in.value).name)] = in.device.value_or(-1);
            }
            return d;
          },
          "dict: graph input name -> the device it is bound on.")
      .def_property_readonly("placer", [](const PlacementPlan& p) { return p.placement.placer; })
      .def_property_readonly("num_devices", [](const PlacementPlan& p) { return p.placement.num_devices; })
      .def_property_readonly("num_units", [](const PlacementPlan& p) { return p.units.num_units; })
      .def_property_readonly("step_time_us", &PlacementPlan::stepTimeUs, "Simulated step time.")
      .def_property_readonly("single_device_us",
                             [](const PlacementPlan& p) { return p.single_device_us; },
                             "The step on one device: the sum of node times.")
      .def_property_readonly("speedup", &PlacementPlan::speedup)
      .def_property_readonly("estimated_makespan_us",
                             [](const PlacementPlan& p) { return p.placement.makespan_us; },
                             "The placer's own estimate of the step.")
      .def_property_readonly("units_per_device", &PlacementPlan::unitsPerDevice)
      .def_property_readonly("nodes_per_device", &PlacementPlan::nodesPerDevice)
      .def_property_readonly("num_transfers",
                             [](const PlacementPlan& p) { return p.simulation.num_transfers; })
      .def_property_readonly(
          "peak_bytes",
          [](const PlacementPlan& p) {
            std::vector<int64_t> v;
            for (const auto& d : p.simulation.devices) v.push_back(d.peak_bytes);
            return v;
          },
          "Simulated peak memory per device.")
      .def_property_readonly(
          "capacity_bytes",
          [](const PlacementPlan& p) {
            std::vector<int64_t> v;
            for (const auto& d : p.machine.devices()) v.push_back(d.memory_bytes);
            return v;
          })
      .def_property_readonly(
          "compute_busy_us",
          [](const PlacementPlan& p) {
            std::vector<double> v;
            for (const auto& d : p.simulation.devices) v.push_back(d.compute_busy_us);
            return v;
          })
      .def_property_readonly(
          "stats",
          [](const PlacementPlan& p) {
            py::list rows;
            for (const passes::PassStats& s : p.stats) {
              py::dict r;
              r["pass"] = s.pass;
              r["seconds"] = s.seconds;
              r["verify_seconds"] = s.verify_seconds;
              r["in"] = s.in;
              r["in_what"] = s.in_what;
              r["out"] = s.out;
              r["out_what"] = s.out_what;
              r["detail"] = s.detail;
              rows.append(r);
            }
            return rows;
          },
          "One dict per pass: pass, seconds, verify_seconds, in, in_what, out, out_what, detail.")
      .def("stats_table", &PlacementPlan::statsTable)
      .def_property_readonly("machine_json",
                             [](const PlacementPlan& p) { return p.machine.toJson(2); },
                             "The machine planned for, as a profile (JSON text).")
      .def("trace", [](const PlacementPlan& p) { return passes::toChromeTrace(p.program, p.simulation); },
           "The Chrome / Perfetto trace JSON of the simulated step.")
      .def(
          "write_trace",
          [](const PlacementPlan& p, const std::string& path) {
            passes::writeChromeTrace(path, p.program, p.simulation);
          },
          py::arg("path"),
          "Writes the Chrome / Perfetto trace JSON (chrome://tracing, ui.perfetto.dev).");

  m.def("plan_graph", &planGraph, py::arg("graph"), py::arg("devices"), py::arg("memory"),
        py::arg("placer"), py::arg("machine"), py::arg("coarsen"), py::arg("dump_dir"),
        py::arg("lp_time_limit_s"), py::arg("pinned_layers") = std::vector<std::pair<std::string, int>>{},
        py::arg("receive_in_send_order") = false,
        "passes::plan on a copy of graph; see modelpar.plan_graph.");
  m.def("plan_joint", &planJoint, py::arg("forward"), py::arg("backward"), py::arg("saved"),
        py::arg("tangents"), py::arg("gradients"), py::arg("devices"), py::arg("memory"), py::arg("placer"),
        py::arg("machine"), py::arg("coarsen"), py::arg("dump_dir"), py::arg("lp_time_limit_s"),
        py::arg("symbol_sizes") = std::map<std::string, int64_t>{},
        py::arg("pinned_layers") = std::vector<std::pair<std::string, int>>{},
        py::arg("pinned_inputs") = std::vector<std::pair<std::string, int>>{},
        py::arg("receive_in_send_order") = false,
        "passes::planJoint: forward and backward planned as one, split into one plan each; "
        "returns (joint, forward, backward, moved_to_layer_device, moved_to_parameter_device).");
  m.def("join_step", &joinStep, py::arg("forward"), py::arg("backward"), py::arg("saved"),
        py::arg("tangents"), py::arg("keep_forward_outputs"),
        py::arg("zero_tangents") = std::vector<std::pair<std::string, std::string>>{},
        "passes::joinForwardBackward returning the first keep_forward_outputs forward outputs and "
        "every backward output: (graph, forward output names, backward output names).");
}

// Machines and costs: parse_bytes, format_bytes, calibrated_machine, apply_profile.
void bindMachine(py::module_& m) {
  m.def("parse_bytes", [](const std::string& text) { return passes::parseBytes(text); },
        py::arg("text"));
  m.def("format_bytes", &passes::formatBytes, py::arg("bytes"));
  m.def(
      "calibrated_machine",
      [](const std::vector<std::tuple<double, double, double>>& kernels,
         const std::vector<std::tuple<double, double>>& transfers, int64_t memory_bytes,
         const std::string& name, double extra_latency_us) {
        std::vector<passes::KernelSample> ks;
        for (auto [bytes, flops, us] : kernels) ks.push_back({bytes, flops, us});
        std::vector<passes::TransferSample> ts;
        for (auto [bytes, us] : transfers) ts.push_back({bytes, us});
        passes::DeviceSpec base;
        base.name = name;
        base.memory_bytes = memory_bytes;
        passes::DeviceSpec dev = passes::calibrateDevice(ks, base);
        passes::LinkSpec link = passes::calibrateLink(ts);
        link.latency_us += extra_latency_us;
        return passes::DeviceModel::fromDevices({dev}, link).toJson(2);
      },
      py::arg("kernels"), py::arg("transfers"), py::arg("memory_bytes"), py::arg("name"),
      py::arg("extra_latency_us"),
      "A one-device machine profile (JSON text) fitted by passes/cost/calibrate.h: kernels are "
      "(bytes, flops, time_us) samples, transfers (bytes, time_us); extra_latency_us is added to "
      "the fitted link latency.");
  m.def(
      "apply_profile",
      [](const ir::Graph& g, const std::vector<double>& time_us) {
        ir::Graph out = g;
        passes::applyProfile(out, time_us, passes::DeviceModel::uniform(1));
        return out;
      },
      py::arg("graph"), py::arg("time_us"),
      "A copy of graph with measured node times (one per node; < 0: none) stored as its "
      "profiled costs (passes/cost/cost_model.h applyProfile).");
}

// What a graph or program holds, for the Python side: input specs, run nodes, layers.
void bindGraphQueries(py::module_& m) {
  m.def(
      "graph_input_specs",
      [](const ir::Graph& g) {
        py::list out;
        for (const ir::Input& in : g.inputs()) {
          const ir::Type& t = g.value(in.value).type;
          py::dict d;
          d["name"] = g.value(in.value).name;
          d["role"] = std::string(ir::name(in.role));
          static const char* kKinds[] = {"tensor", "int", "float", "bool"};
          d["kind"] = kKinds[static_cast<int>(t.kind)];
          d["dtype"] = std::string(ir::name(t.dtype));
          py::list shape;
          for (const ir::Dim& dim : t.shape) {
            if (dim.isStatic()) {
              shape.append(dim.size);
            } else {
              shape.append(dim.symbol);
            }
          }
          d["shape"] = shape;
          out.append(d);
        }
        return out;
      },
      py::arg("graph"),
      "Per graph input: name, role, kind (tensor/int/float/bool), dtype (f32, i64, ...), shape "
      "(ints, or symbol names).");
  m.def(
      "graph_written_inputs",
      [](const ir::Graph& g) {
        std::vector<ir::ValueId> roots = passes::storageRoots(g);
        std::vector<bool> written(g.numValues(), false);
        for (const ir::Node& n : g.nodes()) {
          ir::ValueId v = passes::writtenInput(g, n, roots);
          if (v != ir::kNoId) written[static_cast<size_t>(v)] = true;
        }
        std::vector<int64_t> out;
        for (size_t k = 0; k < g.inputs().size(); ++k) {
          if (written[static_cast<size_t>(g.inputs()[k].value)]) out.push_back(static_cast<int64_t>(k));
        }
        return out;
      },
      py::arg("graph"),
      "Indices of the graph inputs that an in-place node writes (through views: "
      "passes/cost/op_family.h writtenInput).");
  m.def(
      "program_run_nodes",
      [](const ir::Program& p) {
        std::vector<std::vector<int64_t>> out;
        for (int d = 0; d < p.numDevices(); ++d) {
          out.emplace_back();
          for (const ir::Instruction& i : p.schedule(d)) {
            out.back().push_back(i.kind == ir::Instruction::Kind::Run ? i.node : -1);
          }
        }
        return out;
      },
      py::arg("program"), "Per device, per instruction: the node id a run runs, -1 otherwise.");
  m.def(
      "node_layers",
      [](const ir::Graph& g) {
        std::vector<std::string> out;
        for (const ir::Node& n : g.nodes()) out.push_back(n.layer);
        return out;
      },
      py::arg("graph"), "The layer of every node, in node order.");
}

// Pipeline parallelism: microbatch, checkpoint, layer_chain, partition_chain,
// PipelinePlan, plan_pipeline, split_phases, microbatch_sizes.
void bindPipeline(py::module_& m) {
  m.def(
      "microbatch",
      [](const ir::Graph& g, int microbatches, std::optional<int64_t> batch_size,
         std::string batch_symbol, std::vector<std::pair<std::string, int>> batch_dims,
         std::string loss, std::string seed, const std::string& loss_reduction,
         bool allow_random, const std::string& batch_norm) {
        passes::MicrobatchOptions o;
        o.microbatches = microbatches;
        o.batch_size = batch_size;
        o.batch_symbol = std::move(batch_symbol);
        o.batch_dims = std::move(batch_dims);
        o.loss = std::move(loss);
        o.seed = std::move(seed);
        o.loss_reduction = passes::parseLossReduction(loss_reduction);
        o.allow_random = allow_random;
        o.batch_norm = passes::parseBatchNormMode(batch_norm);
        return passes::microbatch(g, o);
      },
      py::arg("graph"), py::arg("microbatches"), py::arg("batch_size"), py::arg("batch_symbol"),
      py::arg("batch_dims"), py::arg("loss"), py::arg("seed"), py::arg("loss_reduction"),
      py::arg("allow_random"), py::arg("batch_norm") = "refuse",
      "passes::microbatch; see modelpar.microbatch.");
  m.def(
      "checkpoint",
      [](const ir::Graph& g, const std::vector<int32_t>& stage_of_node, const std::string& mode,
         const std::optional<std::vector<std::string>>& layers) {
        passes::CheckpointOptions o;
        o.mode = passes::parseCheckpointMode(mode);
        if (layers) o.layers.emplace(layers->begin(), layers->end());
        passes::CheckpointResult r = passes::checkpoint(g, stage_of_node, o);
        py::list groups;
        for (const passes::RecomputeGroup& grp : r.groups) {
          std::vector<std::string> names;
          for (ir::NodeId n : grp.nodes) names.push_back(nodeName(r.graph, n));
          groups.append(py::make_tuple(grp.stage, grp.microbatch, names));
        }
        return py::make_tuple(std::move(r.graph), std::move(r.stage_of_node), groups);
      },
      py::arg("graph"), py::arg("stage_of_node"), py::arg("mode"), py::arg("layers") = py::none(),
      "passes::checkpoint -> (graph, stage_of_node, [(stage, mb, [node names])]); see "
      "modelpar.checkpoint.");
  py::class_<passes::PipelinePlan>(
      m, "PipelinePlan",
      "A pipeline-parallel plan of one training step (passes/plan_pipeline.h): the lowered "
      "Program, the layer chain and its partition into stages, the simulated step and the "
      "pass statistics. str() is the summary.")
      .def("summary", &passes::PipelinePlan::summary)
      .def("__str__", &passes::PipelinePlan::summary)
      .def(
          "with_inputs_at_home",
          [](const passes::PipelinePlan& p, const passes::InputHomes& homes) {
            return passes::rehomePlanInputs(p, homes);
          },
          py::arg("homes"),
          "This plan with each (graph input name, device) of `homes` bound on that device and "
          "sent from there to where the program reads it, its step simulated again "
          "(passes/plan_rehome.h).")
      .def("__repr__",
           [](const passes::PipelinePlan& p) {
             return c10::str("<modelpar.PipelinePlan ", p.numStages(), " stages, ",
                             p.microbatch_sizes.size(), " micro-batches, ", p.schedule, ", step ",
                             passes::formatMicros(p.stepTimeUs()), ">");
           })
      .def_property_readonly("program", [](const passes::PipelinePlan& p) { return p.program; },
                             "The lowered Program (a copy): runs on modelpar.Executor with the "
                             "step's inputs at full batch.")
      .def_property_readonly("num_stages", &passes::PipelinePlan::numStages)
      .def_property_readonly("schedule", [](const passes::PipelinePlan& p) { return p.schedule; })
      .def_property_readonly(
          "virtual_stages", [](const passes::PipelinePlan& p) { return p.virtual_stages; },
          "Stages per device: v of interleaved 1F1B (stage s on device s % devices), else 1.")
      .def_property_readonly("partition_method",
                             [](const passes::PipelinePlan& p) { return p.partition.method; })
      .def_property_readonly("checkpoint", [](const passes::PipelinePlan& p) { return p.checkpoint; })
      .def_property_readonly(
          "recomputed_layers", [](const passes::PipelinePlan& p) { return p.recomputed_layers; },
          "checkpoint='per_layer': the layers whose forwards are recomputed, in chain order "
          "(Note [Recompute per layer]); empty for the other modes.")
      .def_property_readonly(
          "recompute_every_microbatch",
          [](const passes::PipelinePlan& p) { return p.recompute_every_microbatch; },
          "checkpoint='per_layer': the recomputed layers are recomputed in every micro-batch "
          "(False: in all but the last, as except_last).")
      .def_property_readonly("microbatch_sizes",
                             [](const passes::PipelinePlan& p) { return p.microbatch_sizes; })
      .def_property_readonly(
          "stage_of_layer",
          [](const passes::PipelinePlan& p) {
            py::dict d;
            for (int l = 0; l < p.chain.size(); ++l) {
              d[py::str(p.chain.layers[static_cast<size_t>(l)].name)] =
                  p.stage_of_layer[static_cast<size_t>(l)];
            }
            return d;
          },
          "{layer: stage} in chain order.")
      .def_property_readonly("stage_device",
                             [](const passes::PipelinePlan& p) { return p.partition.stage_device; })
      .def_property_readonly("partition_period_us",
                             [](const passes::PipelinePlan& p) { return p.partition.period_us; })
      .def_property_readonly("step_time_us", &passes::PipelinePlan::stepTimeUs)
      .def_property_readonly("single_device_us",
                             [](const passes::PipelinePlan& p) { return p.single_device_us; })
      .def_property_readonly("speedup", &passes::PipelinePlan::speedup)
      .def_property_readonly("ideal_speedup", &passes::PipelinePlan::idealSpeedup)
      .def_property_readonly("bubble_fraction", &passes::PipelinePlan::bubbleFraction)
      .def_property_readonly(
          "peak_bytes",
          [](const passes::PipelinePlan& p) {
            std::vector<int64_t> out;
            for (const auto& d : p.simulation.devices) out.push_back(d.peak_bytes);
            return out;
          })
      .def_property_readonly("num_transfers",
                             [](const passes::PipelinePlan& p) { return p.simulation.num_transfers; })
      .def_property_readonly(
          "compute_busy_us",
          [](const passes::PipelinePlan& p) {
            std::vector<double> v;
            for (const auto& d : p.simulation.devices) v.push_back(d.compute_busy_us);
            return v;
          },
          "Simulated compute busy time per device.")
      .def_property_readonly("machine_json",
                             [](const passes::PipelinePlan& p) { return p.machine.toJson(2); },
                             "The machine planned for, as a profile (JSON text).")
      .def("trace",
           [](const passes::PipelinePlan& p) {
             return passes::toChromeTrace(p.program, p.simulation);
           },
           "The Chrome / Perfetto trace JSON of the simulated step.")
      .def(
          "write_trace",
          [](const passes::PipelinePlan& p, const std::string& path) {
            passes::writeChromeTrace(path, p.program, p.simulation);
          },
          py::arg("path"), "Writes the Chrome / Perfetto trace JSON of the simulated step.");
  m.def(
      "layer_chain",
      [](const ir::Graph& g, double weight_copies) {
        passes::ChainOptions co;
        co.weight_copies = weight_copies;
        co.inherit_layers = true;
        passes::LayerChain c = passes::chainFromGraph(g, co);
        py::list rows;
        for (const passes::ChainLayer& l : c.layers) {
          py::dict d;
          d["name"] = l.name;
          d["fwd_us"] = l.fwd_us;
          d["bwd_us"] = l.bwd_us;
          d["weight_bytes"] = l.weight_bytes;
          d["stored_bytes"] = l.stored_bytes;
          d["out_bytes"] = l.out_bytes;
          rows.append(d);
        }
        return rows;
      },
      py::arg("graph"), py::arg("weight_copies") = 3.0,
      "passes::chainFromGraph: one dict per layer (name, fwd_us, bwd_us, weight_bytes, "
      "stored_bytes, out_bytes); the graph needs costs (plan or profile it first).");
  m.def(
      "partition_chain",
      [](const ir::Graph& g, const std::string& method, int devices, int microbatches,
         int64_t memory, double bandwidth, double latency_us, const std::string& schedule,
         double weight_copies) {
        passes::ChainOptions co;
        co.weight_copies = weight_copies;
        co.inherit_layers = true;
        passes::LayerChain c = passes::chainFromGraph(g, co);
        passes::PartitionOptions o;
        o.method = method;
        o.devices = devices;
        o.microbatches = microbatches;
        o.memory_bytes = memory;
        o.bandwidth_bytes_per_s = bandwidth;
        o.latency_us = latency_us;
        auto kind = passes::parsePipelineSchedule(schedule);
        if (!kind) {
          throw ConfigError("modelpar partition: schedule='" + schedule +
                            "' is not valid; schedule takes one of " +
                            passes::quotedList(passes::kPipelineScheduleNames));
        }
        o.schedule = *kind;
        passes::StagePartition p;
        {
          py::gil_scoped_release no_gil;
          p = passes::partitionChain(c, o);
        }
        py::dict d;
        d["method"] = p.method;
        d["stage_begin"] = p.stage_begin;
        d["stage_device"] = p.stage_device;
        d["period_us"] = p.period_us;
        d["load_period_us"] = p.load_period_us;
        d["memory_bytes"] = p.memory_bytes;
        d["stage_activations"] = p.stage_activations;
        d["fits"] = p.fits;
        return d;
      },
      py::arg("graph"), py::arg("method"), py::arg("devices"), py::arg("microbatches"),
      py::arg("memory"), py::arg("bandwidth"), py::arg("latency_us"), py::arg("schedule"),
      py::arg("weight_copies") = 3.0,
      "passes::partitionChain on chainFromGraph(graph): stages, devices, period, memory.");
  m.def(
      "plan_pipeline",
      [](const ir::Graph& g, int devices, int microbatches, int64_t batch_size,
         std::string schedule, std::string partition, std::string checkpoint, bool portals,
         std::vector<int64_t> memory, std::optional<std::string> machine,
         std::string loss_reduction, bool allow_random, const std::string& batch_norm,
         int virtual_stages, bool receive_in_send_order) {
        passes::PipelinePlanOptions o;
        o.receive_in_send_order = receive_in_send_order;
        o.devices = devices;
        o.microbatches = microbatches;
        o.batch_size = batch_size;
        o.schedule = std::move(schedule);
        o.virtual_stages = virtual_stages;
        o.partition = std::move(partition);
        o.checkpoint = std::move(checkpoint);
        o.portals = portals;
        o.memory_bytes = std::move(memory);
        o.microbatch.loss_reduction = passes::parseLossReduction(loss_reduction);
        o.microbatch.allow_random = allow_random;
        o.microbatch.batch_norm = passes::parseBatchNormMode(batch_norm);
        o.record_timeline = true;  // write_trace works on every plan
        py::gil_scoped_release no_gil;
        if (machine) o.machine = passes::DeviceModel::load(*machine);
        return passes::planPipeline(g, o);
      },
      py::arg("graph"), py::arg("devices"), py::arg("microbatches"), py::arg("batch_size"),
      py::arg("schedule"), py::arg("partition"), py::arg("checkpoint"), py::arg("portals"),
      py::arg("memory"), py::arg("machine"), py::arg("loss_reduction"), py::arg("allow_random"),
      py::arg("batch_norm") = "refuse", py::arg("virtual_stages") = 0,
      py::arg("receive_in_send_order") = false,
      "passes::planPipeline; see modelpar.plan_pipeline.");
  m.def(
      "split_phases",
      [](const passes::PipelinePlan& p) {
        passes::PhaseSplit s = passes::splitPhases(p.graph, p.placement);
        return py::make_tuple(std::move(s.first), std::move(s.second), std::move(s.carried));
      },
      py::arg("plan"),
      "passes::splitPhases of a PipelinePlan: (first Program, second Program, carried names).");
  m.def("microbatch_sizes", &passes::microbatchSizes, py::arg("batch"), py::arg("microbatches"));
}

}  // namespace

void bindPlan(py::module_& m) {
  bindPlacement(m);
  bindMachine(m);
  bindGraphQueries(m);
  bindPipeline(m);
}

}  // namespace modelpar

#else  // built without passes/: nothing to bind

namespace modelpar {
void bindPlan(pybind11::module_& /*m*/) {}
}  // namespace modelpar

#endif  // MODELPAR_HAS_PASSES
