// Operator registrations for the modelpar device: the capture kernel as the
// PrivateUse1 fallback and for every composite operator, plus the few kernels
// that are not recordings (factories of uninitialised tensors, copies across
// devices, reading a value).
#include <ATen/EmptyTensor.h>
#include <ATen/core/Tensor.h>
#include <ATen/ops/_local_scalar_dense.h>
#include <ATen/ops/_to_copy.h>
#include <ATen/ops/resize.h>
#include <ATen/ops/set_native.h>
#include <c10/core/DefaultDtype.h>
#include <c10/util/strides.h>
#include <torch/library.h>

#include "backend/capture_kernel.h"
#include "backend/session.h"
#include "backend/storage.h"
#include "runtime/check.h"

namespace modelpar::backend {
namespace {

using c10::IValue;
using torch::jit::Stack;

std::vector<int64_t> ints(const IValue& v) {
  if (v.isIntList()) return v.toIntVector();
  std::vector<int64_t> out;
  for (const IValue& e : v.toListRef()) {
    out.push_back(e.isSymInt() ? e.toSymInt().guard_int(__FILE__, __LINE__) : e.toInt());
  }
  return out;
}

c10::ScalarType dtypeOr(const IValue& v) {
  return v.isNone() ? c10::get_default_dtype_as_scalartype() : v.toScalarType();
}

void checkFactory(const IValue& layout, const IValue& device) {
  TORCH_CHECK(layout.isNone() || layout.toLayout() == c10::kStrided,
              "modelpar: only strided tensors can live on the modelpar device, got layout ",
              layout.toLayout());
  if (!device.isNone()) {
    const c10::DeviceIndex i = device.toDevice().index();
    TORCH_CHECK(i == -1 || i == 0, "modelpar: there is one modelpar device (modelpar:0); got ",
                device.toDevice());
  }
}

void result(Stack* stack, size_t n, IValue r) {
  torch::jit::drop(*stack, n);
  stack->push_back(std::move(r));
}

// empty.memory_format(SymInt[] size, *, ScalarType? dtype, Layout? layout,
//                     Device? device, bool? pin_memory, MemoryFormat? memory_format)
// An uninitialised tensor records nothing: the storage enters a trace when
// first read or written (Session::enterTrace).
void emptyKernel(const c10::OperatorHandle&, Stack* stack) {
  auto args = torch::jit::last(*stack, 6);
  checkFactory(args[2], args[3]);
  at::Tensor t(at::detail::empty_generic(ints(args[0]), allocator(),
                                         c10::DispatchKeySet(c10::DispatchKey::PrivateUse1),
                                         dtypeOr(args[1]), args[5].toOptional<c10::MemoryFormat>()));
  stateOf(t).base = Geometry::of(t);
  result(stack, 6, std::move(t));
}

// empty_strided(SymInt[] size, SymInt[] stride, *, ScalarType? dtype,
//               Layout? layout, Device? device, bool? pin_memory)
void emptyStridedKernel(const c10::OperatorHandle&, Stack* stack) {
  auto args = torch::jit::last(*stack, 6);
  checkFactory(args[3], args[4]);
  at::Tensor t = makeFresh(Geometry{dtypeOr(args[2]), ints(args[0]), ints(args[1]), 0});
  result(stack, 6, std::move(t));
}

/// dst.copy_(src) where at least one side is on modelpar; returns dst.
void copyInto(const at::Tensor& dst, const at::Tensor& src, bool non_blocking) {
  std::lock_guard<std::recursive_mutex> lock(captureMutex());
  Session& session = Session::get();
  static const c10::OperatorHandle copy_op =
      c10::Dispatcher::singleton().findSchemaOrThrow("aten::copy_", "");
  if (!isModelpar(dst)) {  // modelpar -> elsewhere: materialise
    dst.copy_(session.cpuView(src), non_blocking);
    return;
  }
  at::Tensor from = src;
  if (!isModelpar(src)) {
    from = src.device().is_cpu() ? src : src.to(c10::kCPU);
    // Filling a whole storage that no trace reads (t.to("modelpar"), loading
    // weights): write the CPU copy directly, no graph.
    const StorageState& s = stateOf(dst);
    if (!session.inTrace(dst) && Geometry::of(dst) == s.base && dst.sizes() == from.sizes()) {
      session.setContents(dst, from);
      return;
    }
  }
  Stack stack{dst, from, non_blocking};
  captureCall(copy_op, &stack, /*allow_cpu_data=*/true);
}

// copy_(Tensor(a!) self, Tensor src, bool non_blocking=False) -> Tensor(a!)
void copyKernel(const c10::OperatorHandle&, Stack* stack) {
  auto args = torch::jit::last(*stack, 3);
  at::Tensor dst = args[0].toTensor();
  copyInto(dst, args[1].toTensor(), args[2].toBool());
  result(stack, 3, std::move(dst));
}

// _copy_from(Tensor self, Tensor dst, bool non_blocking=False) -> Tensor
void copyFromKernel(const c10::OperatorHandle&, Stack* stack) {
  auto args = torch::jit::last(*stack, 3);
  at::Tensor dst = args[1].toTensor();
  copyInto(dst, args[0].toTensor(), args[2].toBool());
  result(stack, 3, std::move(dst));
}

// _copy_from_and_resize(Tensor self, Tensor dst) -> Tensor
void copyFromAndResizeKernel(const c10::OperatorHandle&, Stack* stack) {
  auto args = torch::jit::last(*stack, 2);
  at::Tensor src = args[0].toTensor();
  at::Tensor dst = args[1].toTensor();
  if (!isModelpar(dst)) dst.resize_(src.sizes());
  MP_RT_CHECK(dst.sizes() == src.sizes(), UnsupportedOpError,
              "modelpar: cannot resize a modelpar tensor from ", dst.sizes(), " to ", src.sizes());
  copyInto(dst, src, false);
  result(stack, 2, std::move(dst));
}

// _to_copy(Tensor self, *, ScalarType? dtype, Layout? layout, Device? device,
//          bool? pin_memory, bool non_blocking=False, MemoryFormat? memory_format)
void toCopyKernel(const c10::OperatorHandle& op, Stack* stack) {
  auto args = torch::jit::last(*stack, 7);
  const auto device = args[3].toOptional<c10::Device>();
  const at::Tensor self = args[0].toTensor();
  if (!isModelpar(self)) {  // t.to("modelpar"): a new modelpar tensor filled from self
    checkFactory(args[2], args[3]);
    const auto format = args[6].toOptional<c10::MemoryFormat>().value_or(c10::MemoryFormat::Preserve);
    const bool keep_strides = format == c10::MemoryFormat::Preserve && self.is_non_overlapping_and_dense();
    Geometry g{args[1].toOptional<c10::ScalarType>().value_or(self.scalar_type()), self.sizes().vec(),
               {}, 0};
    if (keep_strides) {
      g.strides = self.strides().vec();
    } else {
      const c10::DimVector st = c10::contiguous_strides(self.sizes());
      g.strides.assign(st.begin(), st.end());
    }
    at::Tensor t = makeFresh(g);
    copyInto(t, self, false);
    result(stack, 7, std::move(t));
    return;
  }
  if (!device || device->type() == c10::DeviceType::PrivateUse1) {
    captureKernel(op, stack);  // a conversion on the device: recorded
    return;
  }
  at::Tensor cpu = Session::get().cpuView(self);
  at::Tensor r = at::_to_copy(cpu, args[1].toOptional<c10::ScalarType>(),
                              args[2].toOptional<c10::Layout>(), device,
                              args[4].toOptional<bool>(), args[5].toBool(),
                              args[6].toOptional<c10::MemoryFormat>());
  result(stack, 7, std::move(r));
}

// _local_scalar_dense(Tensor self) -> Scalar: item() materialises.
void localScalarKernel(const c10::OperatorHandle&, Stack* stack) {
  at::Tensor cpu = Session::get().cpuView(torch::jit::peek(*stack, 0, 1).toTensor());
  result(stack, 1, at::_local_scalar_dense(cpu));
}

// resize_(Tensor(a!) self, SymInt[] size, *, MemoryFormat? memory_format) -> Tensor(a!)
void resizeKernel(const c10::OperatorHandle&, Stack* stack) {
  auto args = torch::jit::last(*stack, 3);
  at::Tensor self = args[0].toTensor();
  const std::vector<int64_t> size = ints(args[1]);
  MP_RT_CHECK(self.sizes() == c10::IntArrayRef(size), UnsupportedOpError,
              "modelpar: resize_ of a modelpar tensor from ", self.sizes(), " to ",
              c10::IntArrayRef(size), " cannot be captured; allocate a new tensor instead");
  result(stack, 3, std::move(self));
}

// _has_compatible_shallow_copy_type(Tensor self, Tensor from) -> bool:
// module->to("modelpar") replaces each parameter's data in place
// (set_data), which PyTorch allows only between dense tensors of the
// backends it knows; modelpar tensors are dense strided tensors too.
void compatibleShallowCopyKernel(const c10::OperatorHandle&, Stack* stack) {
  auto args = torch::jit::last(*stack, 2);
  const c10::DispatchKeySet dense(c10::DispatchKey::Dense);
  const bool ok = args[0].toTensor().key_set().has_any(dense) &&
                  args[1].toTensor().key_set().has_any(dense) &&
                  args[0].toTensor().layout() == c10::kStrided &&
                  args[1].toTensor().layout() == c10::kStrided;
  result(stack, 2, ok);
}

template <void (*F)(const c10::OperatorHandle&, Stack*)>
torch::CppFunction boxed() {
  return torch::CppFunction::makeFromBoxedFunction<F>();
}

TORCH_LIBRARY_IMPL(_, PrivateUse1, m) { m.fallback(boxed<&captureKernel>()); }

TORCH_LIBRARY_IMPL(aten, PrivateUse1, m) {
  m.impl("empty.memory_format", boxed<&emptyKernel>());
  m.impl("empty_strided", boxed<&emptyStridedKernel>());
  m.impl("copy_", boxed<&copyKernel>());
  m.impl("_copy_from", boxed<&copyFromKernel>());
  m.impl("_copy_from_and_resize", boxed<&copyFromAndResizeKernel>());
  m.impl("_to_copy", boxed<&toCopyKernel>());
  m.impl("_local_scalar_dense", boxed<&localScalarKernel>());
  m.impl("resize_", boxed<&resizeKernel>());
  m.impl("_has_compatible_shallow_copy_type", boxed<&compatibleShallowCopyKernel>());
  // Pointing a tensor at (part of) a storage changes only its metadata; the
  // capture keeps its state per storage and geometry, so nothing is recorded
  // (torch.save reaches these through UntypedStorage.cpu()).
  m.impl("set_.source_Storage", TORCH_FN(at::native::set_));
  m.impl("set_.source_Storage_storage_offset", TORCH_FN(at::native::set_storage_cpu_));
  m.impl("set_.source_Tensor", TORCH_FN(at::native::set_tensor_));
}

// Note [Capturing composite operators]
// A CompositeExplicitAutograd kernel (t, transpose, clone, zeros, convolution,
// _foreach_add_, ...) is registered for every backend and beats a backend
// fallback, so without this the fallback would see what the composite
// decomposes into (t -> as_strided, zeros -> empty + zero_). Registering the
// capture kernel for PrivateUse1 on each of them records the op a user wrote.
// Left to their composites: ops returning no tensor (size queries and the
// like), and the empty-like factories, which decompose into empty.
void registerCompositeOverrides() {
  static const char* const kKeep[] = {"aten::empty_like", "aten::new_empty",
                                      "aten::new_empty_strided", "aten::empty_permuted",
                                      "aten::detach_"};
  static torch::Library lib(torch::Library::IMPL, "aten", c10::DispatchKey::PrivateUse1, __FILE__,
                            __LINE__);
  auto& dispatcher = c10::Dispatcher::singleton();
  for (const c10::OperatorName& name : dispatcher.getAllOpNames()) {
    if (name.name.rfind("aten::", 0) != 0) continue;
    auto op = dispatcher.findOp(name);
    if (!op || !op->hasSchema() || op->hasKernelForDispatchKey(c10::DispatchKey::PrivateUse1)) continue;
    if (!op->hasKernelForDispatchKey(c10::DispatchKey::CompositeExplicitAutograd) &&
        !op->hasKernelForDispatchKey(c10::DispatchKey::CompositeExplicitAutogradNonFunctional)) {
      continue;
    }
    bool keep = false;
    for (const char* k : kKeep) keep = keep || name.name == k;
    bool returns_tensor = false;
    for (const c10::Argument& r : op->schema().returns()) {
      const c10::TypePtr& t = r.real_type();
      returns_tensor = returns_tensor || t->kind() == c10::TypeKind::TensorType ||
                       (t->kind() == c10::TypeKind::ListType &&
                        t->expectRef<c10::ListType>().getElementType()->kind() == c10::TypeKind::TensorType);
    }
    if (keep || (!returns_tensor && !op->schema().is_mutable())) continue;
    const std::string qualified =
        name.overload_name.empty() ? name.name.substr(6) : name.name.substr(6) + "." + name.overload_name;
    lib.impl(qualified.c_str(), boxed<&captureKernel>());
  }
}

struct RegisterOverrides {
  RegisterOverrides() { registerCompositeOverrides(); }
} register_overrides;

}  // namespace
}  // namespace modelpar::backend
