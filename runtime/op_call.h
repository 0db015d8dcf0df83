// ResolvedOp: one IR node bound, once, to its ATen operator. Resolution finds
// the schema in the c10 dispatcher, matches the node's arguments to the
// schema's (positional, then keyword by name, then schema defaults) and turns
// every constant into an IValue; a call then only reads the node's input
// values and calls the operator boxed.
#pragma once

#include <string>
#include <utility>
#include <vector>

#include <ATen/core/dispatch/Dispatcher.h>
#include <ATen/core/ivalue.h>

#include "ir/graph.h"

namespace modelpar::runtime {

/// The environment of a call: one slot per ir::ValueId of the graph; a slot
/// is None while its value is not available (not produced yet, freed, or not
/// on this device).
using Env = std::vector<c10::IValue>;

/// Example:
///   ResolvedOp mm(g, n);             // g.node(n) is `%y: f32[4, 2] = aten::mm(%x, %w)`
///   Env env(g.numValues());
///   env[x] = ...; env[w] = ...;
///   std::vector<c10::IValue> out = mm.call(env);   // {y}
class ResolvedOp {
 public:
  /// Resolves node `n` of `g`. Throws UnsupportedOpError when the dispatcher
  /// has no such operator or an argument has a schema type the IR cannot
  /// express; InvalidIrError when the arguments do not fit the schema (too
  /// many positional, unknown or repeated keyword, missing argument, wrong
  /// kind of argument). Messages name the node, the operator and the argument.
  /// A number (constant or scalar value) where the schema wants a Tensor is
  /// passed as a 0-dim wrapped-number tensor, as PyTorch's Python API does.
  ResolvedOp(const ir::Graph& g, ir::NodeId n);

  /// Calls the operator with the node's inputs read from `env` and returns its
  /// results flattened in order (a Tensor[] result gives one entry per
  /// element), one per node output. Throws ExecutionError when an input slot
  /// is empty or the results do not match the node's output count or types
  /// (symbolic dims are not checked; an undefined tensor passes). Errors of
  /// the operator itself propagate as c10::Error.
  ///
  /// `place_on`, when given, replaces every Device / Device? argument (Note
  /// [Factory ops follow their device]): the executor passes its GPU for the
  /// logical devices it maps to one.
  std::vector<c10::IValue> call(const Env& env, const c10::Device* place_on = nullptr) const;

  /// `%y` (the node's first output) or `^label`.
  const std::string& nodeRef() const { return node_ref_; }
  /// `aten::add.Tensor`.
  const std::string& opName() const { return op_name_; }
  const c10::OperatorHandle& handle() const { return handle_; }

 private:
  /// One schema argument: a constant built at resolution, or (when the node
  /// argument refers to values) the IR argument rebuilt at every call.
  struct Slot {
    c10::IValue constant;
    ir::Arg arg;
    c10::TypePtr type;
    bool dynamic = false;
    bool device = false;  // a Device or Device? argument
  };

  c10::IValue build(const ir::Arg& a, const c10::Type& t, const Env* env) const;
  /// build() for a list type `t`.
  c10::IValue buildList(const ir::Arg& a, const c10::Type& t, const Env* env) const;
  const c10::IValue& read(ir::ValueId v, const Env& env) const;
  void checkOutputs(const std::vector<c10::IValue>& out) const;

  c10::OperatorHandle handle_;
  std::vector<Slot> slots_;
  std::vector<ir::Type> output_types_;
  std::vector<std::string> output_names_;
  std::vector<std::pair<ir::ValueId, std::string>> input_names_;
  std::string node_ref_;
  std::string op_name_;
};

}  // namespace modelpar::runtime
