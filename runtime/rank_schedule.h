// What a Program's instruction lists imply for the ranks that run them, read
// once before any step: where each graph output is when the program ends,
// and whether every pair of ranks transfers in one order (what NCCL needs).
// No PyTorch: pure analyses of the IR.
#pragma once

#include <vector>

#include "ir/program.h"
#include "ir/receive_order.h"

namespace modelpar::runtime {

/// Where the graph outputs are when the program ends.
struct OutputPlaces {
  std::vector<int> holder;                 // by graph output: lowest device holding it, -1: none
  std::vector<std::vector<bool>> present;  // by graph output, device: holds it
};

/// Follows every list (inputs where placed, run and recv define, free drops).
OutputPlaces outputPlaces(const ir::Program& p);

// Note [Receiving in send order]: receiveInSendOrder and checkPairOrder live
// in ir/receive_order.h, where planning for ranks applies them too (what a
// rank runs is what is simulated).
using ir::checkPairOrder;
using ir::receiveInSendOrder;

}  // namespace modelpar::runtime
