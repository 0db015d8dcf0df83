// modelpar._C.search_strategy and StrategySearch: the strategy search
// (passes/search/strategy_search.h) from Python. modelpar/strategy.py wraps it
// with argument parsing; torch.compile's strategy="auto" and
// `python -m modelpar plan --strategy auto` use it.
#include <torch/csrc/utils/pybind.h>

#ifdef MODELPAR_HAS_PASSES
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "passes/passes.h"

namespace py = pybind11;

namespace modelpar {
namespace {

py::dict candidateDict(const passes::StrategyCandidate& c, bool chosen) {
  py::dict d;
  d["label"] = c.label();
  d["kind"] = c.kind;
  d["placer"] = c.placer;
  d["schedule"] = c.schedule;
  d["virtual_stages"] = c.virtual_stages;
  d["partition"] = c.partition;
  d["checkpoint"] = c.checkpoint;
  d["microbatches"] = c.microbatches;
  d["status"] = std::string(passes::toString(c.status));
  d["step_us"] = c.status == passes::CandidateStatus::Ok ? py::object(py::float_(c.step_us))
                                                        : py::object(py::none());
  d["peak_bytes"] = c.status == passes::CandidateStatus::Ok
                        ? py::object(py::int_(c.peak_bytes))
                        : py::object(py::none());
  d["lower_bound_us"] = c.lower_bound_us;
  d["plan_seconds"] = c.plan_seconds;
  d["reason"] = c.reason;
  d["chosen"] = chosen;
  return d;
}

}  // namespace

void bindSearch(py::module_& m) {
  py::class_<passes::StrategySearch>(
      m, "StrategySearch",
      "The result of the strategy search (passes/search/strategy_search.h): every candidate "
      "with its simulated step and peak memory, the chosen one and its plan. str() is the "
      "table.")
      .def("table", &passes::StrategySearch::table)
      .def("__str__", &passes::StrategySearch::table)
      .def_property_readonly("chosen", [](const passes::StrategySearch& s) { return s.chosen; })
      .def_property_readonly("seconds", [](const passes::StrategySearch& s) { return s.seconds; })
      .def_property_readonly("t1_us", [](const passes::StrategySearch& s) { return s.t1_us; })
      .def_property_readonly(
          "candidates",
          [](const passes::StrategySearch& s) {
            py::list out;
            for (size_t i = 0; i < s.candidates.size(); ++i) {
              out.append(candidateDict(s.candidates[i], static_cast<int>(i) == s.chosen));
            }
            return out;
          },
          "One dict per candidate (label, kind, placer, schedule, virtual_stages, partition, checkpoint, "
          "microbatches, status, step_us, peak_bytes, lower_bound_us, plan_seconds, reason, "
          "chosen), in enumeration order.")
      .def_property_readonly(
          "placement",
          [](const passes::StrategySearch& s) -> py::object {
            return s.placement ? py::cast(*s.placement) : py::none();
          },
          "The chosen PlacementPlan (one-device or placement), else None.")
      .def_property_readonly(
          "pipeline",
          [](const passes::StrategySearch& s) -> py::object {
            return s.pipeline ? py::cast(*s.pipeline) : py::none();
          },
          "The chosen PipelinePlan, else None.");
  m.def(
      "search_strategy",
      [](const ir::Graph& g, int devices, int64_t batch_size, std::optional<std::string> machine,
         std::vector<int64_t> memory, const std::string& loss_reduction, bool allow_random,
         const std::string& batch_norm, bool portals, std::vector<std::string> placers,
         std::vector<std::string> schedules, std::vector<std::string> partitions,
         std::vector<std::string> checkpoints, std::vector<int> microbatches, bool one_device,
         bool placements, bool pipelines, bool prune, double lp_time_limit_s,
         std::vector<std::pair<int, double>> microbatch_launch_overhead_us,
         std::vector<int> virtual_stages) {
        passes::StrategySearchOptions o;
        o.microbatch_launch_overhead_us = std::move(microbatch_launch_overhead_us);
        o.devices = devices;
        o.batch_size = batch_size;
        o.memory_bytes = std::move(memory);
        o.microbatch.loss_reduction = passes::parseLossReduction(loss_reduction);
        o.microbatch.allow_random = allow_random;
        o.microbatch.batch_norm = passes::parseBatchNormMode(batch_norm);
        o.portals = portals;
        o.placers = std::move(placers);
        o.schedules = std::move(schedules);
        o.virtual_stages = std::move(virtual_stages);
        o.partitions = std::move(partitions);
        o.checkpoints = std::move(checkpoints);
        o.microbatches = std::move(microbatches);
        o.one_device = one_device;
        o.placements = placements;
        o.pipelines = pipelines;
        o.prune = prune;
        o.msct_lp_time_limit_s = lp_time_limit_s;
        o.record_timeline = true;  // write_trace works on the chosen plan, as on every plan
        py::gil_scoped_release no_gil;
        if (machine) o.machine = passes::DeviceModel::load(*machine);
        return passes::searchStrategy(g, o);
      },
      py::arg("graph"), py::arg("devices"), py::arg("batch_size"), py::arg("machine"),
      py::arg("memory"), py::arg("loss_reduction"), py::arg("allow_random"),
      py::arg("batch_norm"), py::arg("portals"), py::arg("placers"), py::arg("schedules"),
      py::arg("partitions"), py::arg("checkpoints"), py::arg("microbatches"),
      py::arg("one_device"), py::arg("placements"), py::arg("pipelines"), py::arg("prune"),
      py::arg("lp_time_limit_s"), py::arg("microbatch_launch_overhead_us"),
      py::arg("virtual_stages"),
      "passes::searchStrategy; see modelpar.search_strategy.");
}

}  // namespace modelpar

#else

namespace modelpar {
void bindSearch(pybind11::module_&) {}
}  // namespace modelpar

#endif
