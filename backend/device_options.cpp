// Checking the device's options (device_options.h).
#include "backend/device_options.h"

#include <algorithm>
#include <regex>
#include <sstream>
#include <vector>

#include "runtime/check.h"
#include "runtime/device.h"

#ifdef MODELPAR_BACKEND_HAS_PASSES
#include "passes/option_names.h"
#endif

namespace modelpar::backend {
namespace {

std::vector<std::string> splitCommas(const std::string& s) {
  std::vector<std::string> out;
  std::stringstream in(s);
  for (std::string item; std::getline(in, item, ',');) out.push_back(item);
  return out;
}

bool isCudaK(const std::string& s) {
  static const std::regex k("cuda:[0-9]+");
  return std::regex_match(s, k);
}

void checkDeviceMap(const Options& o) {
  const std::string& m = o.device_map;
  if (m == "cpu") return;
  const std::vector<std::string> list = splitCommas(m);
  const bool list_ok = m.find(',') != std::string::npos && !list.empty() &&
                       std::all_of(list.begin(), list.end(), isCudaK);
  MP_RT_CHECK(m == "cuda" || isCudaK(m) || list_ok, ConfigError, "modelpar options: device_map='",
              m, "' is not valid; device_map takes 'cpu', 'cuda', 'cuda:K' or a comma-separated "
              "list of 'cuda:K', one per device");
  MP_RT_CHECK(!list_ok || static_cast<int>(list.size()) == o.devices, ConfigError,
              "modelpar options: device_map='", m, "' names ", list.size(), " devices but devices=",
              o.devices, "; give one device per logical device");
  const char* why = !runtime::cudaDevicesBuilt()       ? "this build of modelpar has no CUDA devices (built without CUDA)"
                    : runtime::cudaDeviceCount() < 1 ? "this machine has no GPU"
                                                     : nullptr;
  MP_RT_CHECK(why == nullptr, ConfigError, "modelpar options: device_map='", m,
              "' needs the executor's CUDA devices, which exist only in a CUDA build of modelpar "
              "on a machine with a GPU; ", why, ". Leave device_map unset (or 'cpu') to run on "
              "CPU worker devices");
}

#ifdef MODELPAR_BACKEND_HAS_PASSES
void checkPipeline(const PipelineOptions& p) {
  MP_RT_CHECK(p.microbatches >= 1, ConfigError, "modelpar options: pipeline['microbatches']=",
              p.microbatches, " is not valid; microbatches takes an int >= 1");
  passes::checkOneOf("options", "schedule", p.schedule, passes::kPipelineScheduleNames);
  passes::checkOneOf("options", "partition", p.partition, passes::kPartitionMethodNames);
  passes::checkOneOf("options", "checkpoint", p.checkpoint, passes::kPipelineCheckpointNames);
  passes::checkOneOf("options", "batch_norm", p.batch_norm, passes::kBatchNormModeNames);
  passes::checkOneOf("options", "loss_reduction", p.loss_reduction, passes::kLossReductionNames);
  MP_RT_CHECK(p.virtual_stages >= 0, ConfigError, "modelpar options: pipeline['virtual_stages']=",
              p.virtual_stages, " is not valid; virtual_stages takes an int >= 0 (0: 2 for "
              "schedule 'interleaved' and 'zb-v', 1 otherwise)");
  using Stages = passes::ScheduleTraits::StagesPerDevice;
  const Stages stages = passes::scheduleTraits(p.schedule).stages_per_device;
  MP_RT_CHECK(stages != Stages::Two || p.virtual_stages == 0 || p.virtual_stages == 2, ConfigError,
              "modelpar options: pipeline['virtual_stages']=", p.virtual_stages, " is not valid; "
              "schedule 'zb-v' runs exactly 2 stages per device, placed in a V: give "
              "virtual_stages=2 or leave it unset");
  MP_RT_CHECK(p.virtual_stages <= 1 || stages != Stages::One, ConfigError,
              "modelpar options: pipeline['virtual_stages']=", p.virtual_stages, " is not valid; "
              "virtual_stages takes more than 1 only with schedule 'interleaved' (got '",
              p.schedule, "'), or exactly 2 with 'zb-v'");
  MP_RT_CHECK(p.partition != "madpipe" || p.schedule == "1f1b*", ConfigError,
              "modelpar options: pipeline['partition']='madpipe' is not valid; partition takes "
              "'madpipe' only with schedule '1f1b*' (MadPipe's schedule for the stages it makes)");
  for (const std::string& name : p.batched_inputs) {
    MP_RT_CHECK(!name.empty(), ConfigError, "modelpar options: pipeline['batched_inputs'] has an "
                "empty name; batched_inputs takes the names of the step's inputs");
  }
}
#endif

}  // namespace

void checkOptions(const Options& o) {
#ifdef MODELPAR_BACKEND_HAS_PASSES
  passes::checkDevices("options", o.devices);
#else
  MP_RT_CHECK(o.devices == 1 && !o.memory && !o.pipeline && o.placer.empty() && o.device_map == "cpu",
              ConfigError, "modelpar options: this build has no passes/ (MODELPAR_WITH_PASSES=OFF), "
              "so the device cannot plan steps; leave devices, device_map, placer, memory and "
              "pipeline unset, or rebuild with passes/");
#endif
  checkDeviceMap(o);
#ifdef MODELPAR_BACKEND_HAS_PASSES
  if (!o.placer.empty()) passes::checkOneOf("options", "placer", o.placer, passes::kPlacerNames);
#endif
  MP_RT_CHECK(o.placer.empty() || o.devices > 1, ConfigError, "modelpar options: placer='",
              o.placer, "' needs devices > 1; give devices=N (N >= 2) or leave placer unset");
  MP_RT_CHECK(!o.memory || *o.memory > 0, ConfigError, "modelpar options: memory=",
              o.memory.value_or(0), " is not valid; memory takes None, a positive number of bytes, "
              "or a size such as \"16GiB\" (at most 2**63 - 1 bytes)");
  MP_RT_CHECK(o.max_plans >= 1, ConfigError, "modelpar options: max_plans=", o.max_plans,
              " is not valid; max_plans takes an int >= 1");
#ifdef MODELPAR_BACKEND_HAS_PASSES
  if (o.pipeline) checkPipeline(*o.pipeline);
#endif
}

bool planned(const Options& o) {
  return o.devices > 1 || o.memory.has_value() || o.pipeline.has_value() || o.device_map != "cpu";
}

bool samePlanning(const Options& a, const Options& b) {
  return a.devices == b.devices && a.device_map == b.device_map && a.placer == b.placer &&
         a.memory == b.memory && a.pipeline.has_value() == b.pipeline.has_value() &&
         (!a.pipeline ||
          (a.pipeline->microbatches == b.pipeline->microbatches &&
           a.pipeline->schedule == b.pipeline->schedule &&
           a.pipeline->virtual_stages == b.pipeline->virtual_stages &&
           a.pipeline->partition == b.pipeline->partition &&
           a.pipeline->checkpoint == b.pipeline->checkpoint && a.pipeline->portals == b.pipeline->portals &&
           a.pipeline->batch_norm == b.pipeline->batch_norm &&
           a.pipeline->allow_random == b.pipeline->allow_random &&
           a.pipeline->loss_reduction == b.pipeline->loss_reduction &&
           a.pipeline->batched_inputs == b.pipeline->batched_inputs));
}

std::string nonDefaultOptions(const Options& o) {
  const Options d;
  std::vector<std::string> parts;
  if (o.strict != d.strict) parts.push_back(c10::str("strict=", o.strict ? "True" : "False"));
  if (o.cache != d.cache) parts.push_back(c10::str("cache=", o.cache ? "True" : "False"));
  if (o.devices != d.devices) parts.push_back(c10::str("devices=", o.devices));
  if (o.device_map != d.device_map) parts.push_back(c10::str("device_map='", o.device_map, "'"));
  if (o.placer != d.placer) parts.push_back(c10::str("placer='", o.placer, "'"));
  if (o.memory) parts.push_back(c10::str("memory=", *o.memory));
  if (o.pipeline) {
    const PipelineOptions& p = *o.pipeline;
    std::string batched;
    for (const std::string& n : p.batched_inputs) batched += c10::str(batched.empty() ? "" : ", ", "'", n, "'");
    parts.push_back(c10::str("pipeline={'microbatches': ", p.microbatches, ", 'schedule': '", p.schedule, "'",
                             p.virtual_stages == 0 ? "" : c10::str(", 'virtual_stages': ", p.virtual_stages),
                             ", 'partition': '", p.partition, "', 'checkpoint': '", p.checkpoint,
                             "', 'batch_norm': '", p.batch_norm, "'",
                             p.batched_inputs.empty() ? "" : c10::str(", 'batched_inputs': [", batched, "]"),
                             "}"));
  }
  if (o.max_plans != d.max_plans) parts.push_back(c10::str("max_plans=", o.max_plans));
  std::string out;
  for (const std::string& p : parts) out += (out.empty() ? "" : ", ") + p;
  return out;
}

}  // namespace modelpar::backend
