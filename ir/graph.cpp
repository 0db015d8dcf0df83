// Graph construction, lookup and equality.
#include "ir/graph.h"

#include <array>
#include <cstring>

#include "ir/check.h"

namespace modelpar::ir {
namespace {

constexpr std::array<std::string_view, 4> kPhaseNames = {"fwd", "bwd", "recompute", "update"};
constexpr std::array<std::string_view, 3> kRoleNames = {"input", "param", "buffer"};

}  // namespace

std::string_view name(Phase p) { return kPhaseNames[static_cast<size_t>(p)]; }
std::optional<Phase> parsePhase(std::string_view s) {
  for (size_t i = 0; i < kPhaseNames.size(); ++i) {
    if (kPhaseNames[i] == s) return static_cast<Phase>(i);
  }
  return std::nullopt;
}

std::string_view name(InputRole r) { return kRoleNames[static_cast<size_t>(r)]; }
std::optional<InputRole> parseInputRole(std::string_view s) {
  for (size_t i = 0; i < kRoleNames.size(); ++i) {
    if (kRoleNames[i] == s) return static_cast<InputRole>(i);
  }
  return std::nullopt;
}

bool Arg::operator==(const Arg& o) const {
  return kind_ == o.kind_ && int_ == o.int_ &&
         std::memcmp(&float_, &o.float_, sizeof(double)) == 0 && str_ == o.str_ &&
         list_ == o.list_ && keyword_ == o.keyword_;
}

bool Cost::operator==(const Cost& o) const {
  return std::memcmp(&time_us, &o.time_us, sizeof(double)) == 0 &&
         output_bytes == o.output_bytes && temp_bytes == o.temp_bytes &&
         persistent_bytes == o.persistent_bytes;
}

std::string Node::qualifiedName() const {
  return overload.empty() ? op : op + "." + overload;
}

std::vector<ValueId> Node::inputs() const {
  std::vector<ValueId> ins;
  for (const Arg& a : args) a.forEachValue([&](ValueId v) { ins.push_back(v); });
  return ins;
}

ValueId Graph::addValue(std::string name, Type type, NodeId producer, int32_t index) {
  MP_CHECK(!name.empty(), InvalidIrError, "modelpar ir: graph @{}: a value needs a name", name_);
  MP_CHECK(!by_name_.count(name), InvalidIrError,
           "modelpar ir: graph @{}: value %{} is defined twice", name_, name);
  auto id = static_cast<ValueId>(values_.size());
  by_name_.emplace(name, id);
  values_.push_back(Value{std::move(name), std::move(type), producer, index});
  return id;
}

ValueId Graph::addInput(std::string name, Type type, InputRole role, std::optional<int> device) {
  // Inputs come first so that value ids follow text order and print/parse round-trips exactly.
  MP_CHECK(nodes_.empty(), InvalidIrError,
           "modelpar ir: graph @{}: input %{} added after the first node; add all inputs first",
           name_, name);
  ValueId v = addValue(std::move(name), std::move(type), kNoId, 0);
  inputs_.push_back(Input{v, role, device});
  return v;
}

NodeId Graph::addNode(std::string_view qualified_op, std::vector<Arg> args,
                      std::vector<std::pair<std::string, Type>> outputs) {
  auto id = static_cast<NodeId>(nodes_.size());
  for (const Arg& a : args) {
    a.forEachValue([&](ValueId v) {
      MP_CHECK(v >= 0 && static_cast<size_t>(v) < values_.size(), InvalidIrError,
               "modelpar ir: graph @{}: node {} ({}) reads value id {} which does not exist",
               name_, id, qualified_op, v);
    });
  }
  Node node;
  // "aten::add.Tensor": the overload follows the last '.' after the "::".
  size_t ns = qualified_op.find("::");
  size_t dot = qualified_op.find('.', ns == std::string_view::npos ? 0 : ns + 2);
  node.op = std::string(qualified_op.substr(0, dot));
  if (dot != std::string_view::npos) node.overload = std::string(qualified_op.substr(dot + 1));
  node.args = std::move(args);
  // Define outputs only after all checks that can fail, so nothing is half-added.
  for (const auto& [out_name, _] : outputs) {
    MP_CHECK(!by_name_.count(out_name), InvalidIrError,
             "modelpar ir: graph @{}: value %{} is defined twice (again by {})", name_, out_name,
             qualified_op);
  }
  int32_t index = 0;
  for (auto& [out_name, type] : outputs) {
    node.outputs.push_back(addValue(out_name, std::move(type), id, index++));
  }
  nodes_.push_back(std::move(node));
  if (nodes_.back().outputs.empty()) {
    std::string label = "n" + std::to_string(id);
    while (by_label_.count(label)) label += "_";
    setLabel(id, label);
  }
  return id;
}

void Graph::setOutputs(std::vector<ValueId> outputs) {
  for (ValueId v : outputs) {
    MP_CHECK(v >= 0 && static_cast<size_t>(v) < values_.size(), InvalidIrError,
             "modelpar ir: graph @{}: output value id {} does not exist", name_, v);
  }
  outputs_ = std::move(outputs);
}

void Graph::setLabel(NodeId n, std::string label) {
  Node& nd = node(n);
  if (nd.label == label) return;
  MP_CHECK(nd.outputs.empty(), InvalidIrError,
           "modelpar ir: graph @{}: node {} ({}) has outputs; only nodes without outputs take a "
           "label (refer to the others by their first output)", name_, n, nd.qualifiedName());
  MP_CHECK(!label.empty(), InvalidIrError,
           "modelpar ir: graph @{}: node {} ({}) has no outputs and needs a label", name_, n,
           nd.qualifiedName());
  MP_CHECK(!by_label_.count(label), InvalidIrError,
           "modelpar ir: graph @{}: label ^{} is used twice", name_, label);
  if (!nd.label.empty()) by_label_.erase(nd.label);
  by_label_.emplace(label, n);
  nd.label = std::move(label);
}

std::optional<ValueId> Graph::findValue(std::string_view name) const {
  auto it = by_name_.find(std::string(name));
  if (it == by_name_.end()) return std::nullopt;
  return it->second;
}

std::optional<NodeId> Graph::findLabel(std::string_view label) const {
  auto it = by_label_.find(std::string(label));
  if (it == by_label_.end()) return std::nullopt;
  return it->second;
}

std::optional<size_t> Graph::inputIndex(ValueId v) const {
  for (size_t i = 0; i < inputs_.size(); ++i) {
    if (inputs_[i].value == v) return i;
  }
  return std::nullopt;
}

std::vector<std::vector<NodeId>> Graph::users() const {
  std::vector<std::vector<NodeId>> users(values_.size());
  for (size_t n = 0; n < nodes_.size(); ++n) {
    for (ValueId v : nodes_[n].inputs()) {
      auto& u = users[static_cast<size_t>(v)];
      if (u.empty() || u.back() != static_cast<NodeId>(n)) u.push_back(static_cast<NodeId>(n));
    }
  }
  return users;
}

std::string Graph::nodeRef(NodeId n) const {
  const Node& nd = node(n);
  if (!nd.outputs.empty()) return "%" + value(nd.outputs[0]).name;
  return "^" + nd.label;
}

bool Graph::operator==(const Graph& o) const {
  return name_ == o.name_ && values_ == o.values_ && inputs_ == o.inputs_ && nodes_ == o.nodes_ &&
         outputs_ == o.outputs_;
}

}  // namespace modelpar::ir
