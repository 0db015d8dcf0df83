// A Program's transfers in the order ranks can pair them: over NCCL a pair
// of ranks matches sends to receives by order, not by tag, so every device
// must receive from each peer in the order that peer sends. Pure IR: the
// rank executor applies it before running (runtime/rank_schedule.h), and
// planning for ranks before simulating (PipelinePlanOptions::
// receive_in_send_order), so that the simulated memory is the program's that
// runs: a value received early lives longer.
#pragma once

#include "ir/program.h"

namespace modelpar::ir {

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
Program receiveInSendOrder(const Program& p);

/// ConfigError unless, for every pair of devices (a, b), the values a sends
/// to b are, in order, the values b receives from a (NCCL pairs transfers
/// by order, not by tag; the verifier's mailbox semantics allow any order).
void checkPairOrder(const Program& p);

}  // namespace modelpar::ir
