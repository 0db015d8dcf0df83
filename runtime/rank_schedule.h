// What a Program's instruction lists imply for the ranks that run them, read
// once before any step: where each graph output is when the program ends,
// and whether every pair of ranks transfers in one order (what NCCL needs).
// No PyTorch: pure analyses of the IR.
#pragma once

#include <vector>

#include "ir/program.h"

namespace modelpar::runtime {

/// Where the graph outputs are when the program ends.
struct OutputPlaces {
  std::vector<int> holder;                 // by graph output: lowest device holding it, -1: none
  std::vector<std::vector<bool>> present;  // by graph output, device: holds it
};

/// Follows every list (inputs where placed, run and recv define, free drops).
OutputPlaces outputPlaces(const ir::Program& p);

/// Note [Receiving in send order]: `p` with every device's receives from
/// each peer in the order that peer sends them, so that transfers pair by
/// order (what NCCL needs; checkPairOrder holds after it). At device b's
/// `recv %v <- a`, the values a sent to b before v that b has not received
/// yet are received first, right there, and their later receives go. That
/// adds no wait: a sends them before v, and sends never block, so they are
/// in b's mailbox whenever v is (Note [Program semantics]); a received value
/// only lives longer. Runs, sends and frees keep their order. A receive of a
/// value its peer does not send is an InvalidIrError; the caller verifies
/// the result (the rank executor does, with `verify` on).
ir::Program receiveInSendOrder(const ir::Program& p);

/// ConfigError unless, for every pair of devices (a, b), the values a sends
/// to b are, in order, the values b receives from a (NCCL pairs transfers
/// by order, not by tag; the verifier's mailbox semantics allow any order).
void checkPairOrder(const ir::Program& p);

}  // namespace modelpar::runtime
