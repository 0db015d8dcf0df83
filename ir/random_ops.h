// Which operators draw from a random generator, by name: what microbatch and
// checkpoint (passes/) refuse or keep, and what the executor seeds per op
// when workers could draw in either order (runtime/random_seeding.h).
#pragma once

#include <string_view>

namespace modelpar::ir {

/// True for ops that draw from a random generator (dropout, bernoulli,
/// rand*, normal_, ...), whatever the overload: running them twice gives
/// different values.
///
/// Example:
///   isRandomOp("aten::native_dropout")   // true
///   isRandomOp("aten::bernoulli.p")      // true
///   isRandomOp("aten::mm")               // false
bool isRandomOp(std::string_view op);

}  // namespace modelpar::ir
