// Forward and backward placed as one (issue 5): AOTAutograd hands a training
// step over as two graphs, a forward that returns the values it saves and a
// backward that takes them (with the output gradients, the tangents) as
// inputs. Planning each on its own loses the edges between them: a saved
// activation could be produced on one device and read on another, and a
// layer's backward could run far from its weights. This file joins the two
// into one graph, plans it once with planPlacement() (plan_placement.h), and splits the
// joint placement back into one Program per graph.
//
// Source: seed 000 §1.3.2 (Baechi-PyTorch's assigner places a layer, and with
// it its parameters and its backward, on one device) and §1.2.3 (a tensor
// used on a device other than the one that made it needs an explicit,
// synchronised transfer: here no saved value moves between the two graphs).
//
// joinForwardBackward(fw, bw, saved):
//   * inputs: fw's inputs (same names, roles, order), then bw's inputs that no
//     link names, renamed `bw.<name>` when the name is taken; a `saved` bw
//     input *is* the fw value it names (same type, checked);
//   * a `tangents` bw input (the gradient of a forward output, which the
//     caller computes between the two graphs) becomes a node
//     `aten::ones_like(<forward output>)` after the forward's nodes, so the
//     backward cannot be scheduled before the forward output it starts from;
//     a `zero_tangents` bw input becomes `aten::zeros_like(<forward
//     output>)`: a gradient the caller holds to be zero (a step run as one
//     program seeds the loss alone: Note [Only the loss has a gradient] in
//     python/modelpar/compile/pipeline_step.py);
//   * nodes: fw's nodes, then bw's, arguments rewired; a bw output or label
//     whose name is taken gets a `bw.` prefix; layer, phase, microbatch and
//     cost are kept, devices dropped;
//   * outputs: fw's outputs no link reads (the user's outputs), then bw's.
//   Preconditions: fw and bw verify; every link names a bw input and a fw
//   value of the same type, each bw input at most once (InvalidIrError
//   naming the value otherwise). Guarantees: the result verifies; neither
//   input graph is modified.
//
// planJoint(fw, bw, options, plan options):
//   1. planPlacement(joint). Coarsening groups a layer's nodes across both phases, so
//      a layer's backward normally lands with its forward; every backward or
//      recompute node whose layer's first forward node sits on another device
//      is moved there, and each gradient's producer is moved to its
//      parameter's device (JointPlanOptions::gradients). When anything moved,
//      the joint graph is planned again from that fixed placement
//      (PlacementOptions::placement), so the reported simulation is of what runs.
//   2. split: the forward Program runs the joint placement's forward nodes,
//      the backward Program its backward nodes, each device in the joint
//      order; every graph input keeps its joint device, and a backward input
//      that is a saved value is bound on the device that produced it (so the
//      executor never moves it between the two graphs). Both are lowered and
//      simulated from those fixed placements.
//   The joint plan's simulated step is the step time of training; the two
//   halves' simulations are each graph alone (the saved values' transfers
//   between them are none by construction).
//
// Note [Saved values cross after the forward]. What runs is the two halves,
// and there a saved value read on another device stays on the device that
// made it until the backward program sends it. The joint plan's simulation
// sends it as soon as it is made and frees it on its maker, so per device
// its peak is not what runs: measured with torch.compile's measure_memory
// on the GPT test model placed on 2 devices, device 0 held 0.82x and device
// 1 1.23x the joint plan's simulated peak (the sum over the devices within
// 0.3 %). The memory limit is therefore held to each half's own simulated
// peak as well (planPlacement with the fixed placement checks it), and
// plans() reports the larger of the halves' per device: on that GPT within
// 0.4 % of what each device held; above it elsewhere (the U-Net's backward
// half 1.43x on device 0: a refusal may come early, an overrun should not).
//
// Example:
//   JointPlanOptions jo;
//   jo.saved = {{"relu", "relu"}, {"t", "t"}};   // bw input <- fw value
//   jo.gradients = {{0, 1}};                      // bw output 0 is d(fw input 1)
//   JointPlan jp = planJoint(fw, bw, jo, plan_options);
//   run jp.forward.program, then jp.backward.program; report jp.joint.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "ir/graph.h"
#include "passes/plan_placement.h"

namespace modelpar::passes {

inline constexpr std::string_view kJointPassId = "joint";

/// A backward input that is a value the forward returned for it.
struct SavedLink {
  std::string backward_input;  ///< a bw input's name
  std::string forward_value;   ///< a fw input's or node output's name
};

/// The two graphs as one, and where each of their nodes and values went.
struct JointGraph {
  ir::Graph graph;
  std::vector<ir::NodeId> forward_node;    ///< per fw NodeId: the joint NodeId
  std::vector<ir::NodeId> backward_node;   ///< per bw NodeId: the joint NodeId
  std::vector<ir::ValueId> forward_value;  ///< per fw ValueId: the joint ValueId
  std::vector<ir::ValueId> backward_value; ///< per bw ValueId: the joint ValueId
};

/// Joins fw and bw (see the header comment). Throws InvalidIrError for a bad
/// link or a graph that does not verify.
JointGraph joinForwardBackward(const ir::Graph& fw, const ir::Graph& bw,
                               const std::vector<SavedLink>& saved,
                               const std::vector<SavedLink>& tangents = {},
                               const std::vector<SavedLink>& zero_tangents = {});

struct JointPlanOptions {
  std::vector<SavedLink> saved;
  /// (bw tangent input, the fw output it is the gradient of).
  std::vector<SavedLink> tangents;
  /// (bw output index, fw input index): that output is the gradient of that
  /// input (a parameter); its producing node runs on the input's device.
  std::vector<std::pair<int, int>> gradients;
};

struct JointPlan {
  PlacementPlan joint;     ///< the plan of the joined graph: its step is training's
  PlacementPlan forward;   ///< the forward graph on the joint placement
  PlacementPlan backward;  ///< the backward graph on the joint placement
  /// Backward nodes moved to their layer's forward device, and gradient
  /// producers moved to their parameter's device, after the placer.
  int64_t moved_to_layer_device = 0;
  int64_t moved_to_parameter_device = 0;
};

/// Plans fw and bw as one (see the header comment). Throws what planPlacement()
/// throws (ConfigError, PlanDoesNotFitError naming layer, device and bytes),
/// InvalidIrError for a bad link or gradient index. `o.placement` must be
/// unset.
JointPlan planJoint(const ir::Graph& fw, const ir::Graph& bw, const JointPlanOptions& jo,
                    const PlacementOptions& o = {});

}  // namespace modelpar::passes
