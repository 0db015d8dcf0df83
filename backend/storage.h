// The memory side of a modelpar tensor. A modelpar tensor is an ordinary
// TensorImpl with the PrivateUse1 key whose storage holds no data: its
// DataPtr points into a reserved, inaccessible address range (so pointer
// comparisons and overlap checks behave, and a stray read faults) and carries
// a StorageState as its context. The StorageState is what the capture keeps
// per storage: the CPU copy of the contents once materialised, and the value
// that stands for the contents in the trace being recorded.
// See Note [Tensors, storages and trace values] in session.h.
#pragma once

#include <cstdint>
#include <functional>
#include <mutex>
#include <memory>
#include <string>
#include <vector>

#include <ATen/core/Tensor.h>
#include <c10/core/Allocator.h>
#include <c10/core/Storage.h>

#include "ir/graph.h"

namespace modelpar::backend {

/// Where a tensor sits in its storage. Two tensors on one storage with equal
/// geometry show the same elements, whichever TensorImpl they are.
struct Geometry {
  c10::ScalarType dtype = c10::ScalarType::Float;
  std::vector<int64_t> sizes;
  std::vector<int64_t> strides;
  int64_t offset = 0;

  static Geometry of(const at::Tensor& t);
  bool operator==(const Geometry&) const = default;
};

/// How a view was made from another view of the same storage: the IR op and
/// its arguments, with `self` left as a placeholder (ir::kNoId). Replaying it
/// on the current value of `source` rebuilds the view after a mutation.
struct ViewStep {
  std::string op;
  std::vector<ir::Arg> args;
  Geometry source;
};

/// A view of a storage met in the current trace.
struct ViewEntry {
  Geometry geometry;
  ir::ValueId value = ir::kNoId;
  uint64_t version = 0;  // the storage version `value` shows
  uint64_t epoch = 0;    // the trace `value` belongs to
  std::shared_ptr<const ViewStep> step;  // null: rebuild with as_strided
};

/// Per-storage capture state; lives as long as the storage (it is the
/// DataPtr's context). Guarded by the session mutex.
struct StorageState {
  size_t nbytes = 0;
  /// The geometry of the tensor that created the storage: graph inputs and
  /// outputs for this storage have this geometry.
  Geometry base;
  /// Materialised contents (a CPU storage of `nbytes`), or empty while the
  /// contents exist only in a trace or were never written (`empty`).
  c10::Storage cpu;

  // --- trace state, meaningful only while epoch == the session's epoch ---
  uint64_t epoch = 0;
  uint64_t version = 0;          // bumped by every captured write
  ir::ValueId value = ir::kNoId;  // the contents, seen through `base`
  bool unchanged_input = false;   // value is a graph input nobody wrote
  std::vector<ViewEntry> views;

  // --- naming (modelpar::attach / nameTensor) ---
  std::string name;
  ir::InputRole role = ir::InputRole::Input;
  bool named = false;
};

/// The one mutex of the capture: it guards every StorageState and the
/// session. Recursive because materialising may re-enter (a graph break runs
/// an op whose outputs are wrapped as modelpar tensors). Never destroyed, so
/// storages freed during static destruction can still take it.
std::recursive_mutex& captureMutex();

/// The allocator registered for PrivateUse1: storages of fake addresses with
/// a fresh StorageState each.
c10::Allocator* allocator();

/// True for a defined tensor on the modelpar device.
inline bool isModelpar(const at::Tensor& t) {
  return t.defined() && t.device().type() == c10::DeviceType::PrivateUse1;
}

/// The state of a modelpar tensor's storage. Throws c10::Error for a tensor
/// whose storage modelpar did not allocate.
StorageState& stateOf(const at::Tensor& t);

/// Calls f(StorageState&) for every live modelpar storage. Caller holds the
/// session mutex.
void forEachLiveStorage(const std::function<void(StorageState&)>& f);

/// A new modelpar tensor with its own storage, shaped like `geometry`; its
/// StorageState's base is `geometry`.
at::Tensor makeFresh(const Geometry& geometry);
/// A modelpar tensor showing `geometry` of `source`'s storage.
at::Tensor makeView(const at::Tensor& source, const Geometry& geometry);
/// A CPU tensor showing `geometry` of `cpu`.
at::Tensor cpuTensor(const c10::Storage& cpu, const Geometry& geometry);
/// A fresh CPU storage of `nbytes` (uninitialised).
c10::Storage newCpuStorage(size_t nbytes);

}  // namespace modelpar::backend
