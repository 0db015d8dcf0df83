// Reads the text form of Graphs and Programs (grammar in ir/README.md).
// Errors are ParseError with a message `line:column: expected X, found Y`.
#pragma once

#include <string_view>

#include "ir/graph.h"
#include "ir/program.h"

namespace modelpar::ir {

/// Parses one `graph @name(...) { ... }`. Throws ParseError on malformed text,
/// including a use of a value name that is not defined before it.
Graph parseGraph(std::string_view text);
/// Parses `program devices=N`, a graph, and `device K { ... }` blocks.
Program parseProgram(std::string_view text);

}  // namespace modelpar::ir
