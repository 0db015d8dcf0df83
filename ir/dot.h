// Graphviz export, for people who would rather look than read.
#pragma once

#include <string>

#include "ir/graph.h"
#include "ir/program.h"

namespace modelpar::ir {

/// Dataflow graph: one box per node (op, layer, device), one edge per value
/// use labelled with its type; inputs as ellipses, outputs as double circles.
/// Nodes are coloured by device when devices are set.
std::string toDot(const Graph& g);
/// One cluster per device with its instructions in order, and dashed edges
/// from each send to its receive.
std::string toDot(const Program& p);

}  // namespace modelpar::ir
