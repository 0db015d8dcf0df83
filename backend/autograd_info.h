// What the autograd engine says about the op being recorded: the sequence
// number linking a backward op to the forward op it differentiates. Kept in
// its own file: it is the one backend file that reads autograd internals
// (torch/csrc/autograd/node.h).
#pragma once

#include <cstdint>
#include <vector>

#include <ATen/core/ivalue.h>

namespace modelpar::backend {

/// The autograd sequence number of the op being recorded, or -1. Forward
/// (grad mode on, an input requires grad): the number of the grad_fn node
/// the autograd kernel created for this call just before dispatching here.
/// Backward (on an autograd engine thread): the number of the node being
/// evaluated, which is its forward op's number.
int64_t autogradSequenceNr(const std::vector<c10::IValue>& args, bool on_autograd_thread);

}  // namespace modelpar::backend
