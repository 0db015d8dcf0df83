// Text form of Graphs and Programs (grammar in ir/README.md). The printer is
// deterministic and the parser reads back exactly what it wrote:
// parseGraph(print(g)) == g and parseProgram(print(p)) == p.
#pragma once

#include <string>

#include "ir/arg.h"
#include "ir/graph.h"
#include "ir/program.h"

namespace modelpar::ir {

std::string print(const Graph& g);
std::string print(const Program& p);
/// One node as the printer writes it inside a graph (no indent, no newline).
std::string printNode(const Graph& g, NodeId n);
/// One argument, e.g. `[%a, %b]` or `dtype.f32`.
std::string printArg(const Graph& g, const Arg& a);
/// One instruction, e.g. `send %h -> 1`.
std::string printInstruction(const Graph& g, const Instruction& inst);
/// A float constant, shortest text that reads back to the same bits (`1.0`,
/// `1e-05`, `inf`, `nan`); always has a '.', an 'e', or is inf/nan.
std::string printFloat(double v);

}  // namespace modelpar::ir
