// Which nodes draw from a random generator: by the `random` mark the
// importers set from the schema's `nondeterministic_seeded` tag, else by
// name. What microbatch and checkpoint (passes/) refuse or keep, and what the
// executors seed per op when workers could draw in either order
// (runtime/random_seeding.h).
#pragma once

#include <string_view>

#include "ir/graph.h"

namespace modelpar::ir {

/// True for ops that draw from a random generator (dropout, bernoulli,
/// rand*, normal_, the functional samplers AOTAutograd emits such as
/// uniform, exponential, normal_functional, ...), whatever the overload:
/// running them twice gives different values. The fallback for nodes
/// without the mark: ops outside the list are random only if marked.
///
/// Example:
///   isRandomOp("aten::native_dropout")   // true
///   isRandomOp("aten::bernoulli.p")      // true
///   isRandomOp("aten::uniform")          // true
///   isRandomOp("aten::mm")               // false
bool isRandomOp(std::string_view op);

/// Whether node `n` draws random numbers: marked `random` (its schema has
/// the nondeterministic_seeded tag) or a random op by name. What every pass
/// and executor asks; isRandomOp alone misses ops outside its list.
///
/// Example (text): `%s: f32[4] = mylib::sample(%x) {random=true}` is random.
bool isRandom(const Node& n);

}  // namespace modelpar::ir
