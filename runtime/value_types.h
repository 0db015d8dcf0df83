// The bridge between IR types and c10 run-time values: enum mappings
// (dtype.f32 -> c10::kFloat), the IR-syntax text of a run-time value, and the
// checks that run-time values have the types the IR declares.
#pragma once

#include <optional>
#include <string>
#include <vector>

#include <ATen/core/ivalue.h>

#include "ir/graph.h"

namespace modelpar::runtime {

c10::ScalarType toC10(ir::ScalarType t);
c10::Layout toC10(ir::Layout l);
c10::MemoryFormat toC10(ir::MemoryFormat m);
/// The IR element type of a c10 dtype; nullopt for dtypes the IR lacks
/// (quantized, unsigned wider than 8 bits, ...).
std::optional<ir::ScalarType> fromC10(c10::ScalarType t);

/// A run-time value in the IR's type syntax: `f32[4, 8]`, `int`, `float`,
/// `bool`; otherwise `None`, `undefined tensor`, or the IValue's tag name.
std::string describe(const c10::IValue& v);

/// True when `v` has type `t`: a defined tensor of t's dtype and rank whose
/// sizes equal t's static dims (a symbolic dim matches any size), or a scalar
/// of t's kind (an int IValue for `int`, a double for `float`, a bool for
/// `bool`).
bool hasType(const c10::IValue& v, const ir::Type& t);

/// Checks run-time inputs against g's inputs, in order: their count, each
/// value's type (hasType), and that every symbolic size (`B` in `f32[B, 16]`)
/// takes one size across all inputs. An int given for a `float` input is
/// converted in place. Throws ExecutionError naming the graph, the input and
/// both types.
void checkGraphInputs(const ir::Graph& g, std::vector<c10::IValue>& inputs);

}  // namespace modelpar::runtime
