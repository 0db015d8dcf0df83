// chooseRecomputedLayers(): which layers a pipeline recomputes under a memory
// limit, per layer rather than one checkpoint mode for the whole pipeline
// (AdaPipe, Mist). planPipeline's checkpoint='per_layer' calls it (Note
// [Recompute per layer] in recompute_choice.cpp); the caller supplies the
// trial: checkpoint the micro-batched step with the given options, schedule,
// lower and simulate it, and return each device's simulated peak, which is
// what decides every step of the choice.
//
// Preconditions: `step` is the micro-batched, costed step (mb, phase, layer
// and cost on its nodes), stage_of_node one stage per node, `layers` one
// entry per layer of the chain (its device and the micro-batches its stage
// keeps), capacity one entry per device the trial reports.
// Guarantees: the result fits (every device's simulated peak within its
// capacity) or PlanDoesNotFitError names the device furthest over with every
// layer that frees memory recomputed in every micro-batch; no layer of the
// result can be left out and still fit (each was tried).
//
// Example:
//   RecomputeChoice c = chooseRecomputedLayers(mb, stages, layers, capacity,
//                                              /*gpipe=*/false, trial);
//   c.options;      // CheckpointOptions for the checkpoint pass
//   c.layers;       // ["blocks.0.norm", ...] in chain order
#pragma once

#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "ir/graph.h"
#include "passes/pipeline/checkpoint.h"

namespace modelpar::passes {

/// One layer of the chain, as the choice sees it.
struct RecomputeLayer {
  std::string name;
  int device = 0;
  /// Micro-batches of activations its stage keeps (the partition's count).
  int kept = 1;
};

struct RecomputeChoice {
  CheckpointOptions options;       ///< mode and layers for the checkpoint pass
  std::vector<std::string> layers; ///< the recomputed layers, chain order
  int trials = 0;                  ///< simulations run
};

/// Each device's simulated peak bytes with the given checkpoint options.
using RecomputeTrial = std::function<std::vector<int64_t>(const CheckpointOptions&)>;

RecomputeChoice chooseRecomputedLayers(const ir::Graph& step,
                                       const std::vector<int32_t>& stage_of_node,
                                       const std::vector<RecomputeLayer>& layers,
                                       const std::vector<int64_t>& capacity, bool gpipe,
                                       const RecomputeTrial& trial);

}  // namespace modelpar::passes
