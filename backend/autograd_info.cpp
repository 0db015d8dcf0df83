// Autograd sequence numbers of recorded ops (autograd_info.h).
#include "backend/autograd_info.h"

#include <limits>

#include <ATen/SequenceNumber.h>
#include <c10/core/GradMode.h>
#include <torch/csrc/autograd/function.h>  // Node; node.h alone exists only from torch 2.12

namespace modelpar::backend {
namespace {

bool anyRequiresGrad(const c10::IValue& v) {
  if (v.isTensor()) return v.toTensor().defined() && v.toTensor().requires_grad();
  if (v.isTensorList()) {
    for (const at::Tensor& t : v.toTensorVector()) {
      if (t.defined() && t.requires_grad()) return true;
    }
  }
  if (v.isList()) {
    for (const c10::IValue& e : v.toListRef()) {
      if (anyRequiresGrad(e)) return true;
    }
  }
  return false;
}

}  // namespace

int64_t autogradSequenceNr(const std::vector<c10::IValue>& args, bool on_autograd_thread) {
  if (on_autograd_thread) {
    // A shared_ptr before torch 2.12, an intrusive_ptr after: either holds the node.
    const auto node = torch::autograd::get_current_node();
    if (!node) return -1;
    const uint64_t seq = node->sequence_nr();
    // AccumulateGrad nodes carry UINT64_MAX: they belong to no forward op.
    return seq >= static_cast<uint64_t>(std::numeric_limits<int64_t>::max()) ? -1 : static_cast<int64_t>(seq);
  }
  if (!c10::GradMode::is_enabled()) return -1;
  for (const c10::IValue& a : args) {
    if (anyRequiresGrad(a)) {
      const uint64_t next = at::sequence_number::peek();
      return next == 0 ? -1 : static_cast<int64_t>(next - 1);
    }
  }
  return -1;
}

}  // namespace modelpar::backend
