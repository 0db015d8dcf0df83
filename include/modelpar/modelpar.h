// modelpar for LibTorch programs: tensors on device "modelpar" are recorded
// into a graph instead of running op by op; sync() (or reading a value:
// item(), printing, .to("cpu")) runs the recorded step, and an identical next
// step replays the plan already built.
//
// Example:
//   #include <torch/torch.h>
//   #include <modelpar/modelpar.h>
//   torch::Device dev = modelpar::device();        // == torch::Device("modelpar")
//                                                  // (which needs this call first
//                                                  // only where a GPU is visible)
//   model->to(dev);
//   modelpar::attach(*model);                      // names parameters -> layers
//   for (auto& [x, y] : data) {
//     optimizer.zero_grad();
//     auto loss = torch::mse_loss(model->forward(x.to(dev)), y.to(dev));
//     loss.backward();
//     optimizer.step();
//     float l = loss.item<float>();                // runs the step (or modelpar::sync())
//   }
//   modelpar::counters().captures == 1;            // every later step replayed
//
// Several devices: torch.compile's planning options (devices, device_map,
// placer, memory, pipeline), checked up front:
//   modelpar::Options opts;
//   opts.devices = 2;  opts.placer = "m-etf";
//   modelpar::configure(opts);       // each step placed, run on 2 CPU workers
//   std::cout << modelpar::lastPlan();
//
// This header needs only ATen; it is installed with the library
// (find_package(modelpar) -> modelpar::modelpar).
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include <ATen/core/Tensor.h>
#include <c10/core/Device.h>

namespace modelpar {

/// The modelpar device, modelpar:0 (PrivateUse1 renamed). Where no GPU is
/// visible, loading the library names it, so torch::Device("modelpar") parses
/// from the program's first line. Where a GPU is visible, the first call of
/// this function names it, and torch::Device("modelpar") parses only after
/// (before, PyTorch's parser raises "Expected one of cpu, cuda, ..."): call
/// modelpar::device() first there. Naming it makes it PyTorch's one
/// accelerator in this process: the backward of CUDA tensors outside
/// modelpar fails from then on (a PyTorch limit; README, "The modelpar
/// device and CUDA"; Note [Naming the device is not free]).
c10::Device device();

/// Ends the step: runs everything recorded since the last sync and stores
/// the results in the live tensors. Throws modelpar::ExecutionError when an
/// operator fails (naming the node and operator).
void sync();

/// The pipeline option: torch.compile's `pipeline` dict, the same names,
/// values and defaults (passes/option_names.h holds the valid values), plus
/// batched_inputs. Each captured step is micro-batched, cut into stages over
/// Options::devices, scheduled and checkpointed (passes' planPipeline); the
/// batch dimension is found by size (backend/symbolic_batch.h), and the first
/// run of each plan is checked against the unpipelined step.
struct PipelineOptions {
  int microbatches = 4;                    // >= 1
  std::string schedule = "gpipe";          // "gpipe", "1f1b", "1f1b*", "interleaved", "zb-h1", "zb-v"
  int virtual_stages = 0;                  // >= 0; stages per device, > 1 only with "interleaved" or "zb-v" (only 2) (0: 2 for them, else 1)
  std::string partition = "balance-time";  // "balance-time", "balance-size", "balance-time-comm", "madpipe" (set schedule "1f1b*" with it: here the schedule is always given)
  std::string checkpoint = "except_last";  // "always", "except_last", "never", "per_layer"
  bool portals = true;
  std::string batch_norm = "deferred";     // "refuse", "deferred"
  bool allow_random = true;               // dropout & co. per micro-batch; randperm never (Note [Random ops per micro-batch])
  std::string loss_reduction = "auto";     // "auto", "mean", "sum"
  /// Names of the step's inputs whose dimension 0 is the batch (as in
  /// lastGraph(); modelpar::nameTensor names them). Empty: every data input
  /// whose leading size is the one they all share (a ConfigError at the sync
  /// when they differ).
  std::vector<std::string> batched_inputs;
};

/// How the device captures and runs steps. The planning options have
/// torch.compile's names, values and checks (options.py, passes/option_names.h).
struct Options {
  /// An op that cannot be captured (data-dependent output shape such as
  /// nonzero, unique, masked_select; no way to infer its shapes) raises
  /// modelpar::UnsupportedOpError instead of running eagerly as a graph
  /// break.
  bool strict = false;
  /// Warn once per op name at a graph break.
  bool warn_on_graph_break = true;
  /// Replay a cached plan when a step's graph equals an earlier one.
  bool cache = true;
  /// Logical devices, 1 to 64. With N >= 2 every captured step is placed
  /// over N devices (passes' planPlacement) and run by the multi-device
  /// Executor; with 1 it runs on the one-device interpreter.
  int devices = 1;
  /// Where the logical devices run: "cpu" (one CPU worker thread per
  /// logical device), "cuda" (logical i on cuda:i), "cuda:K" (all on GPU K),
  /// or "cuda:0,cuda:1,..." (one per logical device; needs a CUDA build).
  std::string device_map = "cpu";
  /// "m-topo", "m-etf" or "m-sct" (Baechi's placers); "" means m-etf.
  /// Needs devices > 1.
  std::string placer;
  /// Memory per device in bytes (> 0): the plan must fit it, or the sync
  /// throws modelpar::PlanDoesNotFitError naming layer, device and bytes.
  /// Setting it plans the step even on one device.
  std::optional<int64_t> memory;
  /// Pipeline parallelism (see PipelineOptions) instead of placement.
  std::optional<PipelineOptions> pipeline;
  /// Cached plans kept (>= 1); the least recently used one is dropped when a
  /// new capture would exceed it (Counters::evictions).
  int max_plans = 8;
};
Options options();
/// Checks every option, then applies them all; a bad value throws
/// modelpar::ConfigError naming the option and its valid values, and
/// nothing changes. Changing a planning option (devices, device_map, placer,
/// memory, pipeline) drops the cached plans: the next step plans again.
void configure(const Options& options);
/// The same as configure().
void setOptions(const Options& options);

struct Counters {
  int64_t captures = 0;      // graphs built and planned (cache misses)
  int64_t replays = 0;       // steps that reused a cached plan
  int64_t syncs = 0;         // steps run (captures + replays)
  int64_t graph_breaks = 0;  // ops run eagerly because they cannot be captured
  int64_t ops_recorded = 0;  // operator calls recorded
  int64_t evictions = 0;     // cached plans dropped (Options::max_plans)
};
Counters counters();
void resetCounters();

/// A cached plan: the IR text of its graph, how many steps ran it, and its
/// summary (what modelpar.plans() prints for torch.compile: the graph's
/// inputs and nodes, the options, and with planning options the placement
/// report: devices, simulated step, memory per device).
struct PlanInfo {
  std::string graph;
  int64_t runs = 0;
  std::string summary;
};
/// Cached plans in the order they were captured.
std::vector<PlanInfo> plans();
/// Drops every cached plan (the next step captures again).
void clearPlans();
/// IR text of the graph the last sync ran ("" before the first).
std::string lastGraph();
/// The summary (PlanInfo::summary) of the plan the last sync ran ("" before
/// the first).
std::string lastPlan();

enum class TensorRole { Input, Parameter, Buffer };
/// Names a tensor for the IR: graph inputs take the name, and a parameter or
/// buffer "block.conv.weight" puts the nodes reading it in layer
/// "block.conv". Keyed by the tensor object, so it survives module->to().
void nameTensor(const at::Tensor& t, const std::string& name, TensorRole role);

/// Names every parameter and buffer of a torch::nn module (anything with
/// named_parameters() / named_buffers()) by its path.
template <typename Module>
void attach(const Module& module, const std::string& prefix = "") {
  const std::string p = prefix.empty() ? prefix : prefix + ".";
  for (const auto& item : module.named_parameters(/*recurse=*/true)) {
    nameTensor(item.value(), p + item.key(), TensorRole::Parameter);
  }
  for (const auto& item : module.named_buffers(/*recurse=*/true)) {
    nameTensor(item.value(), p + item.key(), TensorRole::Buffer);
  }
}

/// Names the layer of the ops recorded on this thread while it lives;
/// nested scopes join with '.': Scope a("block1"); Scope b("conv") -> "block1.conv".
class Scope {
 public:
  explicit Scope(const std::string& name);
  ~Scope();
  Scope(const Scope&) = delete;
  Scope& operator=(const Scope&) = delete;
};

namespace detail {
/// Loads the backend (device registration). Called by the inline variable
/// below so that linking modelpar::modelpar is enough, even with --as-needed.
bool linked();
inline const bool kLinked = linked();
}  // namespace detail

}  // namespace modelpar
