// The reference Graph interpreter (interpreter.h).
#include "runtime/interpreter.h"

#include <c10/util/Exception.h>

#include "ir/verifier.h"
#include "runtime/check.h"
#include "runtime/value_types.h"

namespace modelpar::runtime {

Interpreter::Interpreter(const ir::Graph& g) : graph_(g) {
  ir::verify(graph_);
  const size_t num_nodes = graph_.numNodes();
  ops_.reserve(num_nodes);
  for (size_t n = 0; n < num_nodes; ++n) ops_.emplace_back(graph_, static_cast<ir::NodeId>(n));

  // Last reader of each value; a value nobody reads dies where it is made.
  // Graph outputs stay alive to the end. Inputs nobody reads are never bound
  // to anything but their slot, which run() drops with the rest.
  std::vector<bool> is_output(graph_.numValues(), false);
  for (ir::ValueId v : graph_.outputs()) is_output[static_cast<size_t>(v)] = true;
  std::vector<ir::NodeId> last(graph_.numValues(), ir::kNoId);
  for (size_t v = 0; v < graph_.numValues(); ++v) last[v] = graph_.values()[v].producer;
  for (size_t n = 0; n < num_nodes; ++n) {
    for (ir::ValueId v : graph_.node(static_cast<ir::NodeId>(n)).inputs()) {
      last[static_cast<size_t>(v)] = static_cast<ir::NodeId>(n);
    }
  }
  drops_after_.resize(num_nodes);
  for (size_t v = 0; v < graph_.numValues(); ++v) {
    if (!is_output[v] && last[v] != ir::kNoId) {
      drops_after_[static_cast<size_t>(last[v])].push_back(static_cast<ir::ValueId>(v));
    }
  }
}

std::vector<c10::IValue> Interpreter::run(std::vector<c10::IValue> inputs) const {
  checkGraphInputs(graph_, inputs);
  Env env(graph_.numValues());
  for (size_t i = 0; i < inputs.size(); ++i) {
    env[static_cast<size_t>(graph_.inputs()[i].value)] = std::move(inputs[i]);
  }
  for (size_t n = 0; n < ops_.size(); ++n) {
    const ResolvedOp& op = ops_[n];
    std::vector<c10::IValue> out;
    try {
      out = op.call(env);
    } catch (const c10::Error& e) {
      MP_RT_THROW(ExecutionError, "node ", op.nodeRef(), " (", op.opName(),
                  "): ", e.what_without_backtrace());
    }
    const std::vector<ir::ValueId>& defs = graph_.node(static_cast<ir::NodeId>(n)).outputs;
    for (size_t i = 0; i < defs.size(); ++i) env[static_cast<size_t>(defs[i])] = std::move(out[i]);
    for (ir::ValueId v : drops_after_[n]) env[static_cast<size_t>(v)] = c10::IValue();
  }
  std::vector<c10::IValue> result;
  result.reserve(graph_.outputs().size());
  for (ir::ValueId v : graph_.outputs()) result.push_back(env[static_cast<size_t>(v)]);
  return result;
}

}  // namespace modelpar::runtime
