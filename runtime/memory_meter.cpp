// StorageMeter (memory_meter.h, Note [Measured memory]).
#include "runtime/memory_meter.h"


#include <ATen/core/Tensor.h>
#include <c10/core/StorageImpl.h>

namespace modelpar::runtime::detail {
namespace {

// Calls f on every defined tensor with a storage in v.
template <typename F>
void forEachTensor(const c10::IValue& v, const F& f) {
  if (v.isTensor()) {
    const at::Tensor& t = v.toTensor();
    if (t.defined() && t.has_storage()) f(t);
  } else if (v.isTensorList()) {
    for (const at::Tensor& t : v.toTensorVector()) {
      if (t.defined() && t.has_storage()) f(t);
    }
  } else if (v.isList()) {
    for (const c10::IValue& e : v.toListRef()) forEachTensor(e, f);
  } else if (v.isTuple()) {
    for (const c10::IValue& e : v.toTupleRef().elements()) forEachTensor(e, f);
  }
}

}  // namespace

void StorageMeter::reset() {
  held_.clear();
  current_ = 0;
  m_ = DeviceMemory{};
}

void StorageMeter::addTensor(const at::Tensor& t) {
  const c10::StorageImpl* s = t.storage().unsafeGetStorageImpl();
  const auto bytes = static_cast<int64_t>(s->nbytes());
  Held& h = held_[s];
  // A storage held already may have grown (an out= or resize_ op): count its size now.
  current_ += bytes - h.bytes;
  h.bytes = bytes;
  ++h.refs;
}

void StorageMeter::removeTensor(const at::Tensor& t) {
  auto it = held_.find(t.storage().unsafeGetStorageImpl());
  if (it == held_.end()) return;
  if (--it->second.refs == 0) {
    current_ -= it->second.bytes;
    held_.erase(it);
  }
}

void StorageMeter::add(const c10::IValue& v) {
  forEachTensor(v, [this](const at::Tensor& t) { addTensor(t); });
}

void StorageMeter::remove(const c10::IValue& v) {
  forEachTensor(v, [this](const at::Tensor& t) { removeTensor(t); });
}

void StorageMeter::mark(int64_t i) {
  if (i < 0) {
    m_.start_bytes = m_.peak_bytes = current_;
    m_.peak_instruction = -1;
  } else if (current_ > m_.peak_bytes) {
    m_.peak_bytes = current_;
    m_.peak_instruction = i;
  }
  m_.end_bytes = current_;
}

}  // namespace modelpar::runtime::detail
