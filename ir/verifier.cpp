// verify(const Graph&): the structural invariants every pass must keep (SSA,
// definition before use, well-formed types and attributes). The program
// checks built on top of these live in program_verifier.cpp.
#include "ir/verifier.h"

#include <cmath>
#include <string>
#include <string_view>
#include <unordered_set>
#include <vector>

#include "ir/check.h"

namespace modelpar::ir {
namespace {

bool inRange(int32_t id, size_t n) { return id >= 0 && static_cast<size_t>(id) < n; }

// `%name` of a value, safe for ids that do not exist.
std::string valueRef(const Graph& g, ValueId v) {
  if (!inRange(v, g.numValues())) return fmt::format("value id {}", v);
  return "%" + g.value(v).name;
}

// Graph::nodeRef, but safe on a broken graph (an output id out of range).
std::string nodeRefSafe(const Graph& g, NodeId n) {
  const Node& nd = g.node(n);
  if (!nd.outputs.empty() && !inRange(nd.outputs[0], g.numValues())) {
    return fmt::format("#{}", n);
  }
  if (nd.outputs.empty() && nd.label.empty()) return fmt::format("#{}", n);
  return g.nodeRef(n);
}

class GraphVerifier {
 public:
  explicit GraphVerifier(const Graph& g) : g_(g) {}

  void run() {
    checkInputs();
    checkValues();
    checkNodes();
    for (ValueId v : g_.outputs()) {
      MP_CHECK(inRange(v, g_.numValues()), InvalidIrError,
               "modelpar verify: graph @{}: graph output value id {} does not exist (the graph "
               "has {} values)", g_.name(), v, g_.numValues());
    }
  }

 private:
  void checkInputs() {
    is_input_.assign(g_.numValues(), 0);
    for (const Input& in : g_.inputs()) {
      MP_CHECK(inRange(in.value, g_.numValues()), InvalidIrError,
               "modelpar verify: graph @{}: graph input names value id {} which does not exist",
               g_.name(), in.value);
      const std::string ref = valueRef(g_, in.value);
      MP_CHECK(!is_input_[static_cast<size_t>(in.value)], InvalidIrError,
               "modelpar verify: graph @{}: graph input {} is listed twice", g_.name(), ref);
      is_input_[static_cast<size_t>(in.value)] = 1;
      MP_CHECK(g_.value(in.value).producer == kNoId, InvalidIrError,
               "modelpar verify: graph @{}: graph input {} is also produced by node {}",
               g_.name(), ref, g_.value(in.value).producer);
      MP_CHECK(!in.device || *in.device >= 0, InvalidIrError,
               "modelpar verify: graph @{}: graph input {} has device={}; devices are >= 0",
               g_.name(), ref, in.device.value_or(0));
    }
  }

  void checkValues() {
    std::unordered_set<std::string_view> names;
    names.reserve(g_.numValues());
    for (size_t i = 0; i < g_.numValues(); ++i) {
      const auto v = static_cast<ValueId>(i);
      const Value& val = g_.value(v);
      MP_CHECK(!val.name.empty(), InvalidIrError,
               "modelpar verify: graph @{}: value id {} has no name", g_.name(), v);
      MP_CHECK(names.insert(val.name).second, InvalidIrError,
               "modelpar verify: graph @{}: value %{} is defined twice", g_.name(), val.name);
      if (val.producer == kNoId) {
        MP_CHECK(is_input_[i], InvalidIrError,
                 "modelpar verify: graph @{}: value %{} has no producer and is not a graph input",
                 g_.name(), val.name);
      } else {
        MP_CHECK(inRange(val.producer, g_.numNodes()), InvalidIrError,
                 "modelpar verify: graph @{}: value %{} names producer node {} which does not "
                 "exist (the graph has {} nodes)", g_.name(), val.name, val.producer,
                 g_.numNodes());
        const auto& outs = g_.node(val.producer).outputs;
        MP_CHECK(val.output_index >= 0 && static_cast<size_t>(val.output_index) < outs.size() &&
                     outs[static_cast<size_t>(val.output_index)] == v,
                 InvalidIrError,
                 "modelpar verify: graph @{}: value %{} says it is output {} of node #{} ({}), "
                 "which does not list it there", g_.name(), val.name, val.output_index,
                 val.producer, g_.node(val.producer).qualifiedName());
      }
      checkType(val);
    }
  }

  void checkType(const Value& val) {
    const Type& t = val.type;
    if (!t.isTensor()) {
      MP_CHECK(t.shape.empty(), InvalidIrError,
               "modelpar verify: graph @{}: value %{} is a scalar but has a shape", g_.name(),
               val.name);
      return;
    }
    for (const Dim& d : t.shape) {
      MP_CHECK(!d.isStatic() || d.size >= 0, InvalidIrError,
               "modelpar verify: graph @{}: value %{} has type {} with a negative dimension",
               g_.name(), val.name, toString(t));
    }
  }

  void checkNodes() {
    // Inputs are defined from the start; a node's outputs once it has read its arguments.
    std::vector<char> defined = is_input_;
    std::unordered_set<std::string_view> labels;
    for (size_t i = 0; i < g_.numNodes(); ++i) {
      const auto n = static_cast<NodeId>(i);
      const Node& nd = g_.node(n);
      const std::string op = nd.qualifiedName();
      for (size_t k = 0; k < nd.outputs.size(); ++k) {
        const ValueId out = nd.outputs[k];
        MP_CHECK(inRange(out, g_.numValues()) && g_.value(out).producer == n &&
                     g_.value(out).output_index == static_cast<int32_t>(k),
                 InvalidIrError,
                 "modelpar verify: graph @{}: node #{} ({}) lists {} as output {}, but that value "
                 "does not name the node as its producer", g_.name(), n, op, valueRef(g_, out),
                 k);
      }
      const std::string ref = nodeRefSafe(g_, n);
      MP_CHECK(!nd.op.empty(), InvalidIrError,
               "modelpar verify: graph @{}: node {} has no operator name", g_.name(), ref);
      if (nd.outputs.empty()) {
        MP_CHECK(!nd.label.empty(), InvalidIrError,
                 "modelpar verify: graph @{}: node #{} ({}) has no outputs and no label; give it "
                 "one with Graph::setLabel", g_.name(), n, op);
        MP_CHECK(labels.insert(nd.label).second, InvalidIrError,
                 "modelpar verify: graph @{}: label ^{} is used twice", g_.name(), nd.label);
      }
      for (ValueId v : nd.inputs()) {
        MP_CHECK(inRange(v, g_.numValues()), InvalidIrError,
                 "modelpar verify: graph @{}: node {} ({}) reads value id {} which does not exist",
                 g_.name(), ref, op, v);
        MP_CHECK(defined[static_cast<size_t>(v)], InvalidIrError,
                 "modelpar verify: graph @{}: node {} ({}) reads %{} before it is defined; nodes "
                 "must be listed in execution order", g_.name(), ref, op, g_.value(v).name);
      }
      for (ValueId out : nd.outputs) defined[static_cast<size_t>(out)] = 1;
      checkAttributes(nd, ref, op);
    }
  }

  void checkAttributes(const Node& nd, const std::string& ref, const std::string& op) {
    MP_CHECK(!nd.device || *nd.device >= 0, InvalidIrError,
             "modelpar verify: graph @{}: node {} ({}) has device={}; devices are >= 0",
             g_.name(), ref, op, nd.device.value_or(0));
    MP_CHECK(!nd.microbatch || *nd.microbatch >= 0, InvalidIrError,
             "modelpar verify: graph @{}: node {} ({}) has mb={}; micro-batches are >= 0",
             g_.name(), ref, op, nd.microbatch.value_or(0));
    if (!nd.cost) return;
    const Cost& c = *nd.cost;
    // `!(x >= 0)` also rejects NaN.
    MP_CHECK(c.time_us >= 0.0 && std::isfinite(c.time_us) && c.output_bytes >= 0 &&
                 c.temp_bytes >= 0 && c.persistent_bytes >= 0,
             InvalidIrError,
             "modelpar verify: graph @{}: node {} ({}) has a negative or non-finite cost "
             "(time_us={}, out={}, temp={}, persist={})", g_.name(), ref, op, c.time_us,
             c.output_bytes, c.temp_bytes, c.persistent_bytes);
  }

  const Graph& g_;
  std::vector<char> is_input_;  // per value: is it a graph input
};

}  // namespace

void verify(const Graph& g) { GraphVerifier(g).run(); }

}  // namespace modelpar::ir
