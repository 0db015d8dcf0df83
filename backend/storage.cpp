// Storages of modelpar tensors: the fake-address allocator, the per-storage
// state and tensor constructors (storage.h).
#include "backend/storage.h"

#include <sys/mman.h>

#include <atomic>
#include <unordered_set>

#include <ATen/EmptyTensor.h>
#include <c10/core/CPUAllocator.h>
#include <c10/core/TensorImpl.h>
#include <c10/util/Exception.h>

namespace modelpar::backend {
namespace {

// Note [Fake addresses]
// A modelpar storage has no memory of its own, but PyTorch code compares data
// pointers (is this copy a no-op? do these tensors overlap?). Each storage
// therefore gets a distinct address range inside one reserved, inaccessible
// region: comparisons mean what they mean for real memory, and code that
// tries to read a modelpar tensor's bytes faults at once instead of reading
// another tensor. Addresses wrap around after 16 TiB of allocations; only
// live storages need distinct ranges and none lives that long.
constexpr uint64_t kArenaBytes = uint64_t{1} << 44;

char* arena() {
  static char* base = [] {
    void* p = mmap(nullptr, kArenaBytes, PROT_NONE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
    return p == MAP_FAILED ? nullptr : static_cast<char*>(p);
  }();
  return base;
}

void* fakeAddress(size_t nbytes) {
  static std::atomic<uint64_t> cursor{0};
  char* base = arena();
  if (!base) return nullptr;
  const uint64_t span = (static_cast<uint64_t>(nbytes) + 127) & ~uint64_t{63};
  return base + (cursor.fetch_add(span) % (kArenaBytes - span));
}

std::unordered_set<StorageState*>& liveStates() {
  static auto* set = new std::unordered_set<StorageState*>();
  return *set;
}

void deleteState(void* ctx) {
  auto* s = static_cast<StorageState*>(ctx);
  std::lock_guard<std::recursive_mutex> lock(captureMutex());
  liveStates().erase(s);
  delete s;
}

class CaptureAllocator final : public c10::Allocator {
 public:
  c10::DataPtr allocate(size_t n) override {
    auto* s = new StorageState;
    s->nbytes = n;
    s->base = Geometry{c10::ScalarType::Byte, {static_cast<int64_t>(n)}, {1}, 0};
    {
      std::lock_guard<std::recursive_mutex> lock(captureMutex());
      liveStates().insert(s);
    }
    return {fakeAddress(n), s, &deleteState, c10::Device(c10::DeviceType::PrivateUse1, 0)};
  }
  void copy_data(void*, const void*, std::size_t) const override {
    TORCH_CHECK(false, "modelpar: the bytes of a modelpar tensor cannot be copied directly; "
                       "move it to the CPU first (t.to(\"cpu\"))");
  }
};

}  // namespace

std::recursive_mutex& captureMutex() {
  static auto* m = new std::recursive_mutex();
  return *m;
}

Geometry Geometry::of(const at::Tensor& t) {
  return Geometry{t.scalar_type(), t.sizes().vec(), t.strides().vec(), t.storage_offset()};
}

c10::Allocator* allocator() {
  static CaptureAllocator a;
  return &a;
}

StorageState& stateOf(const at::Tensor& t) {
  const c10::DataPtr& dp = t.unsafeGetTensorImpl()->unsafe_storage().data_ptr();
  TORCH_CHECK(dp.get_deleter() == &deleteState,
              "modelpar: this ", t.device(), " tensor's storage was not allocated by modelpar");
  return *static_cast<StorageState*>(dp.get_context());
}

void forEachLiveStorage(const std::function<void(StorageState&)>& f) {
  for (StorageState* s : liveStates()) f(*s);
}

at::Tensor makeFresh(const Geometry& g) {
  const size_t itemsize = c10::elementSize(g.dtype);
  const size_t nbytes = at::detail::computeStorageNbytes(g.sizes, g.strides, itemsize,
                                                         static_cast<size_t>(g.offset));
  c10::Storage storage(c10::Storage::use_byte_size_t(), nbytes, allocator(), /*resizable=*/true);
  auto t = at::detail::make_tensor<c10::TensorImpl>(
      std::move(storage), c10::DispatchKeySet(c10::DispatchKey::PrivateUse1),
      c10::scalarTypeToTypeMeta(g.dtype));
  t.unsafeGetTensorImpl()->set_sizes_and_strides(g.sizes, g.strides, g.offset);
  stateOf(t).base = g;
  return t;
}

at::Tensor makeView(const at::Tensor& source, const Geometry& g) {
  auto t = at::detail::make_tensor<c10::TensorImpl>(
      c10::TensorImpl::VIEW, c10::Storage(source.storage()), source.key_set(),
      c10::scalarTypeToTypeMeta(g.dtype));
  t.unsafeGetTensorImpl()->set_sizes_and_strides(g.sizes, g.strides, g.offset);
  return t;
}

at::Tensor cpuTensor(const c10::Storage& cpu, const Geometry& g) {
  auto t = at::detail::make_tensor<c10::TensorImpl>(
      c10::Storage(cpu), c10::DispatchKeySet(c10::DispatchKey::CPU), c10::scalarTypeToTypeMeta(g.dtype));
  t.unsafeGetTensorImpl()->set_sizes_and_strides(g.sizes, g.strides, g.offset);
  return t;
}

c10::Storage newCpuStorage(size_t nbytes) {
  return c10::Storage(c10::Storage::use_byte_size_t(), nbytes, c10::GetCPUAllocator(),
                      /*resizable=*/true);
}

}  // namespace modelpar::backend
