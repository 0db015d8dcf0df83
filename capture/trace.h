// Trace: the ops the modelpar backend records during one step, in program
// order, and the Graph they become at a sync. Kept free of PyTorch so that it
// can be built and tested on values alone; backend/ keeps the tensor data of
// the inputs beside it, index for index.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "ir/graph.h"

namespace modelpar::capture {

/// A recorded graph input: data the backend holds (parameter, buffer, user
/// input, CPU scalar), in the order the trace first read it.
struct TracedInput {
  ir::ValueId value = ir::kNoId;
  ir::InputRole role = ir::InputRole::Input;
  std::string name;   // preferred value name, e.g. "conv1.weight"; may be empty
  std::string owner;  // module that owns it ("conv1"), or empty
  /// Extra text that makes two traces different although their graphs print
  /// the same (e.g. a wrapped-number CPU scalar); part of the cache key.
  std::string key_note;
};

/// A recorded operator call. `args` refer to trace value ids.
struct TracedNode {
  std::string op;  // "aten::add.Tensor"
  std::vector<ir::Arg> args;
  std::vector<ir::ValueId> outputs;
  std::string layer;
  std::optional<ir::Phase> phase;
  /// Autograd sequence number: a backward node shares it with the forward
  /// node it differentiates (-1: none).
  int64_t seq = -1;
  /// The op draws random numbers (its schema's nondeterministic_seeded tag,
  /// drawsRandom in convert.h): the graph's node is marked `random`.
  bool random = false;
};

/// The result of Trace::build.
struct BuiltGraph {
  ir::Graph graph;
  /// For each graph input in order, the index of the TracedInput it is.
  std::vector<size_t> input_slots;
  /// The structural key: the printed graph plus the inputs' key notes. Two
  /// traces with equal keys run the same plan.
  std::string key;
};

/// Example:
///   Trace t;
///   ir::ValueId w = t.addInput(Type::tensor(F32, {4, 4}),
///       TracedInput{.role = InputRole::Parameter, .name = "fc.weight", .owner = "fc"});
///   ir::ValueId y = t.addNode("aten::relu", {Arg::value(w)}, {Type::tensor(F32, {4, 4})})[0];
///   BuiltGraph b = t.build({y});
///   // graph @step(%fc.weight: f32[4, 4] param) {
///   //   %v0: f32[4, 4] = aten::relu(%fc.weight) {layer="fc"}
///   //   return %v0
///   // }
class Trace {
 public:
  /// Adds an input of type `type`; `in.value` is set here.
  ir::ValueId addInput(ir::Type type, TracedInput in);
  /// Appends a node and returns the ids of its outputs (one per type).
  std::vector<ir::ValueId> addNode(std::string op, std::vector<ir::Arg> args,
                                   std::vector<ir::Type> output_types, std::string layer = {},
                                   std::optional<ir::Phase> phase = std::nullopt, int64_t seq = -1,
                                   bool random = false);

  const ir::Type& type(ir::ValueId v) const { return types_.at(static_cast<size_t>(v)); }
  /// The node defining `v`, or -1 for an input.
  int64_t producer(ir::ValueId v) const { return producer_.at(static_cast<size_t>(v)); }
  const std::vector<TracedInput>& inputs() const { return inputs_; }
  const std::vector<TracedNode>& nodes() const { return nodes_; }
  size_t numValues() const { return types_.size(); }
  bool empty() const { return inputs_.empty() && nodes_.empty(); }

  /// The graph computing `outputs` (trace value ids, in that order): nodes no
  /// output depends on and inputs nobody reads are left out; values are
  /// renamed `%v0, %v1, ...` in order, inputs keep their names (made unique
  /// and IR-legal); layers are completed by attributeLayers (with the nodes'
  /// autograd sequence numbers). Throws
  /// InvalidIrError if an output id does not exist.
  BuiltGraph build(const std::vector<ir::ValueId>& outputs, const std::string& name = "step") const;

  void clear();

 private:
  std::vector<ir::Type> types_;
  std::vector<int64_t> producer_;  // node index, or -1 for inputs
  std::vector<TracedInput> inputs_;
  std::vector<TracedNode> nodes_;
};

}  // namespace modelpar::capture
