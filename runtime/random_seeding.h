// Random ops on several workers, reproducible under torch.manual_seed
// (Note [Reproducible random ops over workers] in random_seeding.cpp).
#pragma once

#include <cstdint>
#include <mutex>
#include <utility>
#include <vector>

#include <ATen/core/Generator.h>
#include <ATen/core/Tensor.h>
#include <c10/core/Device.h>

#include "ir/program.h"

namespace modelpar::runtime {

/// Whether every two random ops (ir::isRandom) of `p` run in one order
/// whatever the workers' timing: one is reached from the other through the
/// devices' instruction orders and send -> recv edges. True with fewer than
/// two, or all on one device.
///
/// Example: a dropout on device 0 whose output device 1 receives before its
/// own dropout: ordered. Dropouts on two pipeline stages in one step: not.
bool randomOpsOrdered(const ir::Program& p);

/// Seeds each random op of a step from the step's seed and its node, so that
/// what it draws does not depend on which worker reached its generator first.
///
/// Example (the executor, around a step and each random op):
///   RandomSeeding seeding;
///   seeding.beginStep({c10::Device(c10::kCPU)});
///   { auto lock = seeding.seed(node, c10::Device(c10::kCPU)); /* call the op */ }
///   seeding.endStep();
class RandomSeeding {
 public:
  /// Draws the step's seed from the default CPU generator (so that
  /// torch.manual_seed decides it) and keeps the state of the default
  /// generator of each of `devices`, which endStep restores.
  void beginStep(const std::vector<c10::Device>& devices);
  /// The seed beginStep drew.
  uint64_t stepSeed() const { return step_seed_; }
  /// Replaces the step's seed (after beginStep): the rank executor uses
  /// rank 0's on every rank (Note [Random ops over ranks], rank_executor.cpp).
  void setStepSeed(uint64_t seed) { step_seed_ = seed; }
  /// Seeds `device`'s default generator for node `node` and returns the lock
  /// that keeps every other worker's random op out until the op has run.
  std::unique_lock<std::mutex> seed(ir::NodeId node, c10::Device device);
  /// The generators as beginStep left them (after a failed step too); the
  /// next step draws a new seed from there.
  void endStep();

 private:
  std::mutex mu_;
  uint64_t step_seed_ = 0;
  std::vector<std::pair<at::Generator, at::Tensor>> saved_;
};

}  // namespace modelpar::runtime
