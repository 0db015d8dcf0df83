// chooseRecomputedLayers() (recompute_choice.h).
//
// Note [Recompute per layer]. checkpoint='per_layer' recomputes only the
// layers each device's memory needs, as AdaPipe and Mist choose
// recomputation per layer rather than one mode for the whole pipeline.
// Starting from no layer, each round checkpoints the chosen layers,
// schedules, lowers and simulates the step (the caller's trial). Under
// GPipe a chosen layer is recomputed in every micro-batch but the last, as
// except_last: the last micro-batch's backward follows its forward at once,
// so recomputing it frees nothing. Under the other schedules, in every
// micro-batch: another micro-batch's backward runs between a micro-batch's
// forward and its own, and there except_last frees nothing at the peak
// (measured: under 1F1B on 2 devices except_last's simulated peak equals
// never's on bench/recompute_per_layer.py's Llama, since the last
// micro-batch is held whole while the one before it is recomputed).
// On each device whose simulated peak is over its memory it adds layers of
// that device's stages, most bytes freed per microsecond of forward first
// (estimate(): the storages a layer's forward makes that its stage's
// backward reads, over its forward time: least recompute time per byte
// freed), until their estimated saving, bytes freed x (micro-batches the
// stage keeps - 1), covers the excess, and at least one. When an over
// device has no such layer left, all its other layers are added at once: a
// chosen layer's recomputation reads the values of the layers before it,
// which then stay stored unless those are recomputed too, as `always`
// does (measured: on the GPT test model the layers estimated to free
// memory did not fit a limit that always fits). When none is left at all,
// the chosen layers are recomputed in every micro-batch (GPipe too); past
// that the step does not fit
// (PlanDoesNotFitError naming the device). Once it fits, layers are dropped
// again, last chosen first, while it still fits (the estimate may
// overshoot). The simulated peak, what every plan is held to (planPipeline's
// runSimulate), decides each step; with no limit that binds nothing is
// recomputed and the plan is checkpoint='never''s.
#include "passes/pipeline/recompute_choice.h"

#include <algorithm>
#include <map>

#include "ir/check.h"
#include "passes/cost/device_model.h"
#include "passes/cost/op_family.h"

namespace modelpar::passes {
namespace {

class RecomputeSearch {
 public:
  RecomputeSearch(const ir::Graph& step, const std::vector<int32_t>& stage_of_node,
                  const std::vector<RecomputeLayer>& layers, const std::vector<int64_t>& capacity,
                  bool gpipe, const RecomputeTrial& trial)
      : step_(step), stages_(stage_of_node), layers_(layers), capacity_(capacity), trial_(trial) {
    estimate();
    options_.mode = gpipe ? CheckpointMode::ExceptLast : CheckpointMode::Always;
    options_.layers.emplace();
  }

  RecomputeChoice choose() {
    std::vector<int64_t> excess = excessOf(run());
    while (overAny(excess)) {
      std::vector<int> add = layersFor(excess);
      if (add.empty()) {
        if (options_.mode == CheckpointMode::Always) refuse(excess);
        options_.mode = CheckpointMode::Always;
      }
      for (int l : add) {
        options_.layers->insert(layers_[static_cast<size_t>(l)].name);
        chosen_.push_back(l);
      }
      excess = excessOf(run());
    }
    for (size_t i = chosen_.size(); i-- > 0;) {  // drop what the estimate overshot
      const std::string& name = layers_[static_cast<size_t>(chosen_[i])].name;
      options_.layers->erase(name);
      if (overAny(excessOf(run()))) options_.layers->insert(name);
    }
    RecomputeChoice c;
    c.options = options_;
    for (const RecomputeLayer& l : layers_) {
      if (options_.layers->count(l.name)) c.layers.push_back(l.name);
    }
    c.trials = trials_;
    return c;
  }

 private:
  std::vector<int64_t> run() {
    ++trials_;
    return trial_(options_);
  }

  // Per layer, from micro-batch 0 of the step: the bytes its recomputation
  // frees (storages its forward nodes make that a backward node of the same
  // stage reads, directly or through a view) and its forward time (what
  // recomputing it costs). A linear layer's own input, which its weight
  // gradient reads, is the previous layer's value: recomputing the linear
  // layer alone frees its output only where a backward reads that.
  void estimate() {
    std::map<std::string, int, std::less<>> index;
    for (size_t l = 0; l < layers_.size(); ++l) index[layers_[l].name] = static_cast<int>(l);
    freed_.assign(layers_.size(), 0);
    fwd_us_.assign(layers_.size(), 0.0);
    const std::vector<ir::ValueId> root = storageRoots(step_);
    std::vector<char> counted(step_.numValues(), 0);
    for (size_t n = 0; n < step_.numNodes(); ++n) {
      const ir::Node& node = step_.nodes()[n];
      if (!node.microbatch || *node.microbatch != 0) continue;
      auto it = index.find(node.layer);
      if (node.phase == ir::Phase::Forward && it != index.end() && node.cost) {
        fwd_us_[static_cast<size_t>(it->second)] += node.cost->time_us;
      }
      if (node.phase != ir::Phase::Backward) continue;
      for (ir::ValueId v : node.inputs()) {
        const ir::ValueId r = root[static_cast<size_t>(v)];
        const ir::NodeId p = step_.value(r).producer;
        if (p == ir::kNoId || counted[static_cast<size_t>(r)]) continue;
        const ir::Node& producer = step_.node(p);
        auto layer = index.find(producer.layer);
        if (producer.phase != ir::Phase::Forward || layer == index.end() ||
            stages_[static_cast<size_t>(p)] != stages_[n]) {
          continue;
        }
        counted[static_cast<size_t>(r)] = 1;
        freed_[static_cast<size_t>(layer->second)] += allocBytes(step_, r);
      }
    }
  }

  std::vector<int64_t> excessOf(const std::vector<int64_t>& peaks) {
    last_peaks_ = peaks;
    std::vector<int64_t> excess;
    for (size_t d = 0; d < peaks.size(); ++d) {
      excess.push_back(std::max<int64_t>(0, peaks[d] - capacity_[d]));
    }
    return excess;
  }
  static bool overAny(const std::vector<int64_t>& excess) {
    return std::any_of(excess.begin(), excess.end(), [](int64_t e) { return e > 0; });
  }

  // Layers to add for every device over its memory (see the Note).
  std::vector<int> layersFor(const std::vector<int64_t>& excess) const {
    std::vector<int> add;
    for (size_t d = 0; d < excess.size(); ++d) {
      if (excess[d] <= 0) continue;
      std::vector<int> open, unestimated;
      for (size_t l = 0; l < layers_.size(); ++l) {
        if (layers_[l].device != static_cast<int>(d) || options_.layers->count(layers_[l].name)) {
          continue;
        }
        (freed_[l] > 0 ? open : unestimated).push_back(static_cast<int>(l));
      }
      if (open.empty()) {  // the rest at once: they free what they read
        add.insert(add.end(), unestimated.begin(), unestimated.end());
        continue;
      }
      std::stable_sort(open.begin(), open.end(),
                       [&](int a, int b) { return bytesPerMicro(a) > bytesPerMicro(b); });
      int64_t saved = 0;
      for (int l : open) {
        if (saved >= excess[d]) break;
        add.push_back(l);
        saved += freed_[static_cast<size_t>(l)] * std::max(1, layers_[static_cast<size_t>(l)].kept - 1);
      }
    }
    return add;
  }
  double bytesPerMicro(int l) const {
    return static_cast<double>(freed_[static_cast<size_t>(l)]) /
           std::max(fwd_us_[static_cast<size_t>(l)], 1e-3);
  }

  [[noreturn]] void refuse(const std::vector<int64_t>& excess) const {
    const auto d =
        static_cast<size_t>(std::max_element(excess.begin(), excess.end()) - excess.begin());
    MP_THROW(PlanDoesNotFitError,
             "modelpar pipeline: the pipelined step does not fit device {} with "
             "checkpoint='per_layer' even with every layer of its stages recomputed in every "
             "micro-batch: its simulated peak memory is {} ({} bytes) but the device has {} ({} "
             "bytes); use more micro-batches, more devices, or more memory",
             d, formatBytes(last_peaks_[d]), last_peaks_[d], formatBytes(capacity_[d]),
             capacity_[d]);
  }

  const ir::Graph& step_;
  const std::vector<int32_t>& stages_;
  const std::vector<RecomputeLayer>& layers_;
  const std::vector<int64_t>& capacity_;
  const RecomputeTrial& trial_;
  CheckpointOptions options_;
  std::vector<int64_t> freed_;  // per layer (estimate())
  std::vector<double> fwd_us_;
  std::vector<int> chosen_;  // in the order added
  std::vector<int64_t> last_peaks_;
  int trials_ = 0;
};

}  // namespace

RecomputeChoice chooseRecomputedLayers(const ir::Graph& step,
                                       const std::vector<int32_t>& stage_of_node,
                                       const std::vector<RecomputeLayer>& layers,
                                       const std::vector<int64_t>& capacity, bool gpipe,
                                       const RecomputeTrial& trial) {
  MP_CHECK(stage_of_node.size() == step.numNodes(), ConfigError,
           "modelpar pipeline: per_layer recomputation got {} stages for {} nodes",
           stage_of_node.size(), step.numNodes());
  return RecomputeSearch(step, stage_of_node, layers, capacity, gpipe, trial).choose();
}

}  // namespace modelpar::passes
