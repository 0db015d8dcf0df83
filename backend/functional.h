// Functional variants of mutating operators: `add_.Tensor` -> `add.Tensor`,
// `add.out` -> `add.Tensor`, `_foreach_mul_.Scalar` -> `_foreach_mul.Scalar`,
// `_batch_norm_with_update` -> `_batch_norm_with_update_functional`. The
// capture records the functional call and writes its results back into the
// mutated tensors (Note [Tensors, storages and trace values], session.h).
#pragma once

#include <optional>
#include <vector>

#include <ATen/core/dispatch/Dispatcher.h>

namespace modelpar::backend {

/// How to call `functional` instead of a mutating operator and read back
/// what it wrote. Its returns are the mutating op's own fresh (non-aliasing)
/// returns, then one value per entry of `mutated`, in that order (the
/// convention of PyTorch's generated functional variants).
struct FunctionalVariant {
  c10::OperatorHandle functional;
  /// For each argument of `functional`: the index of the mutating op's
  /// argument that provides it, or -1 to take the schema default.
  std::vector<int> arg_from;
  /// The mutating op's arguments that it writes, in order.
  std::vector<int> mutated;
  /// How many of the mutating op's returns alias no argument.
  size_t fresh_returns = 0;
};

/// The alias annotation of an argument or return: its own, or for a list
/// (`Tensor(a)[]`) the one of its elements; null when it has none.
const c10::AliasInfo* aliasOf(const c10::Argument& a);

/// The argument a return aliases (`-> Tensor(a)` of `Tensor(a) self`), or
/// -1 when the return is a fresh tensor.
int aliasedArg(const c10::FunctionSchema& s, const c10::Argument& ret);

/// True when the op writes one of its arguments (per its schema, or the
/// known exception native_batch_norm in training mode, whose schema does not
/// say that it updates the running statistics).
bool writesArguments(const c10::FunctionSchema& schema);

/// True for ops that change a tensor's metadata or storage rather than its
/// elements (`set_`, `resize_`, `t_`, `squeeze_`, `as_strided_`, ...): these
/// have no functional form in the capture.
bool mutatesMetadata(const c10::FunctionSchema& schema);

/// The functional variant of a mutating op, found once per operator and
/// cached; nullopt when there is none. `args` is needed only for the
/// operators whose mutation depends on arguments (native_batch_norm).
std::optional<FunctionalVariant> functionalVariant(const c10::OperatorHandle& op,
                                                   c10::ArrayRef<c10::IValue> args);

}  // namespace modelpar::backend
