// Symbolic-size arithmetic as dispatcher operators. Graphs captured with
// dynamic shapes compute sizes from SymInt inputs (`%n: int = ...`) with
// Python's int operators, which have no c10 dispatcher schema (TorchScript's
// aten::mul.int lives in the JIT registry only). registerSymOps() defines
// them in the `modelpar` namespace so that the Interpreter resolves and calls
// them like any ATen operator:
//
//   %bt: int = modelpar::sym_mul(%s0, 16)
//   %v: f32[e_16xs0, 32] = aten::view(%x, [%bt, 32])
#pragma once

#include <string>
#include <vector>

namespace modelpar::runtime {

/// Defines modelpar::sym_{add,sub,mul,floordiv,mod,truediv,pow,neg,max,min,
/// eq,ne,lt,le,gt,ge,not,float,int,ceil,floor}. Each takes and returns
/// `Scalar`s with Python semantics (int op int -> int, floor division and
/// modulo round toward minus infinity, truediv -> float; comparisons ->
/// bool). Where Python would raise or an int64 would overflow (division or
/// modulo by zero, INT64_MIN // -1, a sum, product or power outside int64,
/// int() of nan / inf) the op throws a c10::Error that the interpreters
/// report as an ExecutionError (Note [Checked size arithmetic]). Idempotent and thread-safe; call it before resolving a graph that
/// uses them (the Python module does so on import).
void registerSymOps();

/// The operator names registerSymOps() defines, without the namespace
/// (`sym_add`, ...).
const std::vector<std::string>& symOpNames();

}  // namespace modelpar::runtime
