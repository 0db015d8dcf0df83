// Pass `cost`: fills the cost (time, output / temporary / persistent bytes) of
// every node that has none.
//
// Sources, in order (issue 7, "Cost model"):
//   1. a profile: a node that already carries a cost keeps it untouched (the
//      runtime's profiling run writes median times there);
//   2. an analytic roofline per op family (op_family.h) on the reference
//      device: time = max(flops / peak_flops, bytes / memory_bandwidth) +
//      launch_overhead, with
//        matmul   flops = 2 m n k (+ m n for the add of addmm / baddbmm)
//        conv     flops = 2 * numel(out) * numel(weight) / weight.size(0)
//                 (transposed: numel(in) instead of numel(out)); backward x2
//        attention flops = 2 * B * L * S * (E + Ev) for q[B,L,E], k[B,S,E],
//                 v[B,S,Ev]; backward x2.5
//        elementwise flops = numel(out); reduction flops = numel(in)
//        copy     flops = 0;  view: no bytes moved (launch overhead only)
//      and bytes = tensor inputs read + outputs written (views: 0);
//   3. defaults: an op outside the tables (family Other) is costed as
//      memory-bound: launch + (inputs + outputs) / memory_bandwidth.
// Output bytes are what the node allocates (op_family.h allocBytes: views and
// in-place outputs allocate nothing). Persistent bytes: each parameter or
// buffer is charged to its first user, parameters times (1 + gradient +
// optimizer-state factor). Temporary bytes are 0 in the analytic model.
//
// Preconditions: none (symbolic dimensions take CostOptions::symbol_sizes,
// else default_symbol_size). Guarantees: every node has a cost afterwards;
// all costs are computed before any is written. Does not: model per-device
// speed differences (placers use one time per node, from the reference
// device), fusion, or tensor-core dtypes.
#pragma once

#include <cstdint>
#include <map>
#include <string>
#include <string_view>
#include <vector>

#include "ir/graph.h"
#include "passes/cost/device_model.h"
#include "passes/cost/op_family.h"

namespace modelpar::passes {

inline constexpr std::string_view kCostPassId = "cost";

struct CostOptions {
  /// Device whose spec the analytic model uses.
  int reference_device = 0;
  /// Add one parameter size for its gradient to the persistent bytes. Leave
  /// false when the graph's backward nodes produce the gradients as values.
  bool count_gradients = false;
  /// Optimizer state per parameter byte (Adam: 2, SGD with momentum: 1).
  double optimizer_state_factor = 0.0;
  /// Values of symbolic dimensions ("B" -> 32).
  std::map<std::string, int64_t, std::less<>> symbol_sizes;
  /// Value of a symbolic dimension missing from symbol_sizes.
  int64_t default_symbol_size = 1;
};

/// What the pass did, for the pipeline's statistics table.
struct CostStats {
  int64_t profiled = 0;  ///< nodes that kept their cost
  int64_t analytic = 0;  ///< nodes costed by an op-family formula
  int64_t defaulted = 0; ///< nodes costed by the memory-bound default
};

/// The analytic estimate of one node, whatever cost it carries.
struct NodeCostEstimate {
  ir::Cost cost;
  OpFamily family = OpFamily::Other;
  double flops = 0;
  double bytes_moved = 0;
};
NodeCostEstimate estimateNodeCost(const ir::Graph& g, ir::NodeId n, const DeviceSpec& device,
                                  const CostOptions& options = {});

/// Runs pass `cost` on g. Throws ConfigError for a reference device out of
/// range or a negative factor.
CostStats estimateCosts(ir::Graph& g, const DeviceModel& machine, const CostOptions& options = {});

/// Stores a profile in g's cost attributes (source 1 above): node n gets
/// time_us[n] with the bytes its cost already has, else the bytes the
/// analytic model gives it (outputs, temporaries, persistent bytes as the
/// pass charges them). A negative time leaves the node as it is. Afterwards
/// pass `cost` keeps these costs. Throws ConfigError when time_us does not
/// have one entry per node or a time is not finite; writes nothing then.
void applyProfile(ir::Graph& g, const std::vector<double>& time_us, const DeviceModel& machine,
                  const CostOptions& options = {});

}  // namespace modelpar::passes
