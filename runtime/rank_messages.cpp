// Packing values into the rank executor's messages (rank_messages.h).
#include "runtime/rank_messages.h"

#include <algorithm>
#include <cstring>

#include <ATen/ops/empty.h>
#include <ATen/ops/empty_strided.h>

#include "runtime/check.h"
#include "runtime/value_types.h"

namespace modelpar::runtime {
namespace {

constexpr int64_t kAlign = 16;  // the data starts aligned for every element type

int64_t headerBytes(size_t ndim) {
  const auto raw = static_cast<int64_t>(ndim * sizeof(int64_t));
  return (raw + kAlign - 1) / kAlign * kAlign;
}

std::vector<int64_t> wireStrides(const at::Tensor& t) {
  if (t.is_non_overlapping_and_dense()) return t.strides().vec();
  return contiguousStrides(t.sizes());
}

/// Whether no two elements of a tensor of these sizes and strides share
/// memory (a sufficient test: each dim, by increasing stride, steps over
/// the extent of the ones before it).
bool nonOverlapping(c10::IntArrayRef sizes, c10::IntArrayRef strides) {
  std::vector<std::pair<int64_t, int64_t>> dims;  // (stride, size)
  for (size_t k = 0; k < sizes.size(); ++k) {
    if (sizes[k] == 0) return true;
    if (sizes[k] > 1) dims.emplace_back(strides[k], sizes[k]);
  }
  std::sort(dims.begin(), dims.end());
  int64_t extent = 1;  // elements spanned by the dims so far
  for (const auto& [stride, size] : dims) {
    if (stride < extent) return false;
    extent = stride * size;
  }
  return true;
}

// Note [Framed tensors keep their layout]: a framed tensor's header carries
// its own strides whenever its elements do not overlap, gaps included (a
// KV cache's sliding window is a slice of a longer tensor: strides (128, 64,
// 8, 1) for sizes (2, 2, 7, 8)), and the receiver lays the data out with
// them (empty_strided). Ranks that received an output then hold it in the
// same layout as the rank that computed it, so Dynamo, which guards on
// strides and makes them dynamic when they change, traces the same graph on
// every rank (measured: Mistral's generate over 2 ranks traced a decode
// step with two more stride symbols on the holder, and the plans differed).
// Dynamo also traces a view's base (`keys._base.size()`), so the holder of a
// broadcast output that is a view keeps a copy of its own in the same layout
// instead (asFramed): no rank holds a view the others lack.
std::vector<int64_t> frameStrides(const at::Tensor& t) {
  if (nonOverlapping(t.sizes(), t.strides())) return t.strides().vec();
  return contiguousStrides(t.sizes());
}

}  // namespace

std::vector<int64_t> contiguousStrides(c10::IntArrayRef sizes) {
  std::vector<int64_t> strides(sizes.size(), 1);
  for (size_t k = sizes.size(); k-- > 1;) strides[k - 1] = strides[k] * std::max<int64_t>(sizes[k], 1);
  return strides;
}

std::optional<int64_t> packedBytes(const ir::Type& t) {
  if (!t.isTensor()) return 8;
  const std::optional<int64_t> n = t.numel();
  if (!n) return std::nullopt;
  return headerBytes(t.shape.size()) + *n * ir::elementSize(t.dtype);
}

at::Tensor pack(const c10::IValue& v, const ir::Type& t, c10::Device device) {
  const int64_t bytes = *packedBytes(t);
  at::Tensor msg = at::empty({bytes}, at::TensorOptions().dtype(c10::kByte).device(device));
  if (!t.isTensor()) {
    at::Tensor cpu = at::empty({8}, at::TensorOptions().dtype(c10::kByte));
    if (v.isDouble()) {
      const double d = v.toDouble();
      std::memcpy(cpu.data_ptr(), &d, 8);
    } else {
      const int64_t i = v.isBool() ? static_cast<int64_t>(v.toBool()) : v.toInt();
      std::memcpy(cpu.data_ptr(), &i, 8);
    }
    msg.copy_(cpu);
    return msg;
  }
  const at::Tensor& x = v.toTensor();
  const std::vector<int64_t> strides = wireStrides(x);
  const int64_t head = headerBytes(strides.size());
  if (head > 0) {
    at::Tensor h = at::empty({head}, at::TensorOptions().dtype(c10::kByte));
    std::memcpy(h.data_ptr(), strides.data(), strides.size() * sizeof(int64_t));
    msg.narrow(0, 0, head).copy_(h);
  }
  msg.narrow(0, head, bytes - head).view(x.scalar_type()).as_strided(x.sizes(), strides).copy_(x);
  return msg;
}

c10::IValue unpack(const at::Tensor& message, const ir::Type& t) {
  if (!t.isTensor()) {
    at::Tensor cpu = message.cpu();
    if (t.kind == ir::Type::Kind::Float) {
      double d = 0;
      std::memcpy(&d, cpu.data_ptr(), 8);
      return d;
    }
    int64_t i = 0;
    std::memcpy(&i, cpu.data_ptr(), 8);
    if (t.kind == ir::Type::Kind::Bool) return i != 0;
    return i;
  }
  const size_t ndim = t.shape.size();
  const int64_t head = headerBytes(ndim);
  std::vector<int64_t> sizes;
  for (const ir::Dim& d : t.shape) sizes.push_back(d.size);
  std::vector<int64_t> strides(ndim);
  if (ndim > 0) {
    at::Tensor h = message.narrow(0, 0, head).cpu();
    std::memcpy(strides.data(), h.data_ptr(), ndim * sizeof(int64_t));
  }
  return message.narrow(0, head, message.numel() - head).view(toC10(t.dtype)).as_strided(sizes, strides);
}

c10::IValue asFramed(const c10::IValue& v) {
  if (!v.isTensor() || !v.toTensor().defined() || v.toTensor().dim() == 0) return v;
  const at::Tensor& t = v.toTensor();
  const std::vector<int64_t> strides = frameStrides(t);
  if (!t.is_view() && t.storage_offset() == 0 && t.strides().vec() == strides) return v;
  at::Tensor out = at::empty_strided(t.sizes(), strides, t.options());
  out.copy_(t);
  return out;
}

std::vector<at::Tensor> frame(const c10::IValue& v, const ir::Type& type, c10::Device device) {
  if (!type.isTensor()) {
    if (v.isDouble()) {
      at::Tensor t = at::empty({1}, at::TensorOptions().dtype(c10::kDouble).device(device));
      t.fill_(v.toDouble());
      return {t};
    }
    at::Tensor t = at::empty({1}, at::TensorOptions().dtype(c10::kLong).device(device));
    t.fill_(v.isBool() ? static_cast<int64_t>(v.toBool()) : v.toInt());
    return {t};
  }
  const at::Tensor& t = v.toTensor();
  if (t.dim() == 0) return {t.contiguous()};
  std::vector<int64_t> header(t.sizes().begin(), t.sizes().end());
  const std::vector<int64_t> strides = frameStrides(t);
  header.insert(header.end(), strides.begin(), strides.end());
  at::Tensor h = at::empty({static_cast<int64_t>(header.size())}, at::TensorOptions().dtype(c10::kLong));
  std::copy(header.begin(), header.end(), h.data_ptr<int64_t>());
  return {h.to(device), t.contiguous()};
}

}  // namespace modelpar::runtime
