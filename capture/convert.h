// From a boxed operator call (schema + IValues) to IR arguments and types:
// tensors become references to trace values through a callback, everything
// else becomes a typed constant, and arguments equal to their schema default
// are left out so that the IR reads like the call a user wrote.
#pragma once

#include <functional>
#include <string>
#include <vector>

#include <ATen/core/function_schema.h>
#include <ATen/core/ivalue.h>

#include "ir/arg.h"
#include "ir/types.h"

namespace c10 {
class OperatorHandle;
}  // namespace c10

namespace modelpar::capture {

/// Whether calls of `op` draw from a random generator: its schema carries
/// PyTorch's `nondeterministic_seeded` tag (dropout, bernoulli, uniform,
/// ...). What marks the recorded node `random` (ir::isRandom), whatever its
/// name.
bool drawsRandom(const c10::OperatorHandle& op);

/// How tensors and devices of a call are written in the IR.
struct ArgContext {
  /// The trace value standing for a (defined) tensor argument.
  std::function<ir::ValueId(const at::Tensor&)> tensor;
  /// The text a PrivateUse1 (modelpar) device argument becomes: captured
  /// graphs run where their inputs live, the CPU today.
  std::string device_as = "cpu";
  /// When set, a floating-point number passed as a `Scalar` or `float`
  /// argument, or inside a `Scalar[]`, becomes the argument this returns
  /// instead of a constant (the backend returns a graph input: Note
  /// [Per-step scalars are inputs] in backend/session.h). Not called for
  /// schema defaults, nor for `float[]` arguments.
  std::function<ir::Arg(double)> floating;
};

/// The IR type of a tensor (dtype + static shape). Throws UnsupportedOpError
/// for a dtype the IR has no name for (quantized, uint16, ...).
ir::Type typeOf(const at::Tensor& t);

/// One argument of schema type `t` (Argument::real_type()). Throws
/// UnsupportedOpError for what the IR cannot express: a complex scalar, a
/// Generator, a Dimname, an undefined tensor where no None is allowed.
ir::Arg toArg(const c10::IValue& v, const c10::Type& t, const ArgContext& ctx);

/// The IR arguments of a call of `schema` with `args` (one IValue per schema
/// argument, as on a boxed stack): positional arguments up to the last one
/// that differs from its default, then the keyword-only ones that differ from
/// their defaults, as keywords.
std::vector<ir::Arg> toArgs(const c10::FunctionSchema& schema, c10::ArrayRef<c10::IValue> args,
                            const ArgContext& ctx);

}  // namespace modelpar::capture
