// ir::Graph: the dataflow graph every front end produces and every pass reads.
// Nodes call ATen operators by name; values are SSA with dtype and shape.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <unordered_map>
#include <utility>
#include <vector>

#include "ir/arg.h"
#include "ir/types.h"

namespace modelpar::ir {

/// What part of a training step a node belongs to.
enum class Phase : uint8_t { Forward, Backward, Recompute, Update };
std::string_view name(Phase p);  // fwd bwd recompute update
std::optional<Phase> parsePhase(std::string_view s);

/// What a graph input is to the model.
enum class InputRole : uint8_t { Input, Parameter, Buffer };
std::string_view name(InputRole r);  // input param buffer
std::optional<InputRole> parseInputRole(std::string_view s);

/// Cost of one node on its device. Times in microseconds, sizes in bytes.
/// persistent_bytes: memory the node keeps for the whole step (weights,
/// gradients, optimizer state); temp_bytes: workspace freed when it ends.
struct Cost {
  double time_us = 0.0;
  int64_t output_bytes = 0;
  int64_t temp_bytes = 0;
  int64_t persistent_bytes = 0;
  /// Exact equality; time_us compares bitwise (as Arg's floats do), so that a
  /// NaN time, which the parser reads and the verifier refuses, still
  /// round-trips: parseGraph(print(g)) == g. Found by tests/fuzz/ir_parser_fuzz.
  bool operator==(const Cost& o) const;
};

/// An SSA value: defined once, by a node or as a graph input.
struct Value {
  std::string name;  // without the leading '%'
  Type type;
  NodeId producer = kNoId;  // kNoId for graph inputs
  int32_t output_index = 0;
  bool operator==(const Value&) const = default;
};

/// A graph input: a parameter, a buffer or a user input, and (in a Program)
/// the logical device it lives on.
struct Input {
  ValueId value = kNoId;
  InputRole role = InputRole::Input;
  std::optional<int> device;
  bool operator==(const Input&) const = default;
};

/// One call of an ATen operator (`aten::addmm`, overload "" or `aten::add`,
/// overload "Tensor"), with its attributes.
struct Node {
  std::string op;        // qualified name without overload: "aten::add"
  std::string overload;  // "Tensor", or empty for the default overload
  std::vector<Arg> args;
  std::vector<ValueId> outputs;
  /// Name of a node without outputs (text `^label`); empty otherwise.
  std::string label;
  std::string layer;  // module path, e.g. "encoder.layers.3.attn"
  std::optional<Phase> phase;
  std::optional<int> device;      // logical device id
  std::optional<int> microbatch;  // micro-batch index
  std::optional<Cost> cost;
  /// The op draws from a random generator (text `random=true`): set by the
  /// importers from the schema's `nondeterministic_seeded` tag, read through
  /// ir::isRandom (random_ops.h), which also knows random ops by name.
  bool random = false;

  /// "aten::add.Tensor" or "aten::mm".
  std::string qualifiedName() const;
  /// The value ids this node reads, in argument order (duplicates kept).
  std::vector<ValueId> inputs() const;
  bool operator==(const Node&) const = default;
};

/// A dataflow graph in SSA form. Nodes are kept in a valid execution order.
///
/// Example:
///   Graph g("linear");
///   ValueId x = g.addInput("x", Type::tensor(ScalarType::Float32, {8, 16}), InputRole::Input);
///   ValueId w = g.addInput("w", Type::tensor(ScalarType::Float32, {32, 16}), InputRole::Parameter);
///   NodeId t = g.addNode("aten::t", {Arg::value(w)}, {{"wt", Type::tensor(ScalarType::Float32, {16, 32})}});
///   NodeId mm = g.addNode("aten::mm", {Arg::value(x), Arg::value(g.node(t).outputs[0])},
///                         {{"y", Type::tensor(ScalarType::Float32, {8, 32})}});
///   g.setOutputs({g.node(mm).outputs[0]});
/// Text:
///   graph @linear(%x: f32[8, 16] input, %w: f32[32, 16] param) {
///     %wt: f32[16, 32] = aten::t(%w)
///     %y: f32[8, 32] = aten::mm(%x, %wt)
///     return %y
///   }
class Graph {
 public:
  explicit Graph(std::string name = "main") : name_(std::move(name)) {}

  const std::string& name() const { return name_; }
  void setName(std::string n) { name_ = std::move(n); }

  /// Adds a graph input. Throws InvalidIrError if the name is taken or a node
  /// was already added (inputs come first, as in the text).
  ValueId addInput(std::string name, Type type, InputRole role,
                   std::optional<int> device = std::nullopt);
  /// Appends a node calling `qualified_op` ("aten::add.Tensor") and defines
  /// its outputs. Throws InvalidIrError on a taken output name or an argument
  /// naming a value id that does not exist.
  NodeId addNode(std::string_view qualified_op, std::vector<Arg> args,
                 std::vector<std::pair<std::string, Type>> outputs);
  /// Sets the returned values. Each must exist.
  void setOutputs(std::vector<ValueId> outputs);
  /// Renames a node without outputs (addNode gives those a default label
  /// `n<id>`). Throws InvalidIrError if the node has outputs or the label is
  /// empty or taken.
  void setLabel(NodeId n, std::string label);

  const std::vector<Value>& values() const { return values_; }
  const Value& value(ValueId v) const { return values_.at(static_cast<size_t>(v)); }
  Value& value(ValueId v) { return values_.at(static_cast<size_t>(v)); }
  const std::vector<Node>& nodes() const { return nodes_; }
  const Node& node(NodeId n) const { return nodes_.at(static_cast<size_t>(n)); }
  Node& node(NodeId n) { return nodes_.at(static_cast<size_t>(n)); }
  const std::vector<Input>& inputs() const { return inputs_; }
  std::vector<Input>& inputs() { return inputs_; }
  const std::vector<ValueId>& outputs() const { return outputs_; }
  size_t numValues() const { return values_.size(); }
  size_t numNodes() const { return nodes_.size(); }

  /// Value by name (without '%'), or nullopt.
  std::optional<ValueId> findValue(std::string_view name) const;
  /// Node by label (without '^'), or nullopt.
  std::optional<NodeId> findLabel(std::string_view label) const;
  /// The index of `v` in inputs(), or nullopt if `v` is not a graph input.
  std::optional<size_t> inputIndex(ValueId v) const;
  /// For each value, the nodes that read it (each node once, in order).
  std::vector<std::vector<NodeId>> users() const;
  /// Name used to refer to a node: its first output (`%y`) or label (`^l`).
  std::string nodeRef(NodeId n) const;

  /// Structural equality: same name, values, inputs, nodes, outputs.
  bool operator==(const Graph& o) const;

 private:
  ValueId addValue(std::string name, Type type, NodeId producer, int32_t index);

  std::string name_;
  std::vector<Value> values_;
  std::vector<Input> inputs_;
  std::vector<Node> nodes_;
  std::vector<ValueId> outputs_;
  std::unordered_map<std::string, ValueId> by_name_;
  std::unordered_map<std::string, NodeId> by_label_;
};

}  // namespace modelpar::ir
