// Checks the invariants every pass must keep. Throws InvalidIrError whose
// message names the graph, the node (by its first output or label) and what
// is wrong; passes' pipelines add the name of the pass that broke it.
#pragma once

#include "ir/graph.h"
#include "ir/program.h"

namespace modelpar::ir {

/// Graph invariants: every value defined once and before its uses (inputs
/// first, nodes in order); argument value ids in range; outputs defined;
/// nodes without outputs labelled; tensor types well formed (dims >= 0);
/// device and micro-batch attributes >= 0; costs non-negative.
void verify(const Graph& g);

/// Program invariants (see Note [Program semantics] in program_verifier.cpp):
/// the graph verifies; devices in range; every node run exactly once, on the
/// device its `device` attribute names (if any); every value used on a device
/// is there (produced, received, or an input placed there) and not freed;
/// each send matched by exactly one receive and vice versa; graph outputs
/// still alive somewhere at the end; no deadlock (a cycle in the
/// happens-before order is reported with the instructions on it).
void verify(const Program& p);

}  // namespace modelpar::ir
