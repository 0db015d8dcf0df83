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

// Note [Peer data is checked]
// ~~~~~~~~~~~~~~~~~~~~~~~~~~~
// What a peer sends is data, not a promise: a rank of another program (a
// rank restarted with other code, a plan that differs), a corrupt message or
// a process that is not a modelpar rank at all can put anything in a header.
// The receiver allocates and lays out memory from headers (empty(sizes),
// empty_strided, as_strided over a packed message), so before it does, every
// header is checked against the IR type the value has in the receiver's own
// program: the rank, each fixed size, one size per symbol, sizes and strides
// >= 0, elements that do not overlap, and bytes (element count and stride
// span) within a bound. A header that fails is an ExecutionError naming the
// receiving instruction, the sending rank, the value and the fault; the step
// fails as a failed transfer does, and every rank is expected to stop.
namespace {

[[noreturn]] void refuse(const MessageSource& from, const char* what, const ir::Type& t,
                         const std::string& fault) {
  const std::string where = from.where.empty() ? std::string("modelpar rank executor") : from.where;
  const std::string sender = from.sender >= 0 ? c10::str("rank ", from.sender) : std::string("a peer");
  const std::string value = from.value.empty() ? std::string("a value") : "%" + from.value;
  MP_RT_THROW(ExecutionError, where, ": ", sender, " sent ", what, " for ", value, " (",
              ir::toString(t), ") with ", fault,
              "; the ranks run different programs, or the sender is not a modelpar rank of "
              "this one: every rank must run the same compiled program");
}

std::string joined(c10::ArrayRef<int64_t> xs) {
  std::string s = "(";
  for (size_t k = 0; k < xs.size(); ++k) s += c10::str(k ? ", " : "", xs[k]);
  return s + ")";
}

// Strides >= 0, elements not overlapping, and the offset of the last
// element; the number of elements the strides span (0 for no elements).
int64_t checkedSpan(c10::ArrayRef<int64_t> sizes, c10::ArrayRef<int64_t> strides,
                    const MessageSource& from, const char* what, const ir::Type& t) {
  for (size_t k = 0; k < strides.size(); ++k) {
    if (strides[k] < 0) refuse(from, what, t, c10::str("stride ", strides[k], " in dim ", k, "; strides are >= 0"));
  }
  if (!nonOverlapping(sizes, strides)) {
    refuse(from, what, t, c10::str("strides ", joined(strides), " overlap for sizes ", joined(sizes),
                                   ": two elements would share memory"));
  }
  int64_t last = 0;
  for (size_t k = 0; k < sizes.size(); ++k) {
    if (sizes[k] == 0) return 0;
    int64_t step = 0;
    if (__builtin_mul_overflow(sizes[k] - 1, strides[k], &step) ||
        __builtin_add_overflow(last, step, &last)) {
      refuse(from, what, t, c10::str("strides ", joined(strides), " whose span for sizes ",
                                     joined(sizes), " overflows int64"));
    }
  }
  return last + 1;
}

}  // namespace

FrameLayout checkFrameHeader(c10::ArrayRef<int64_t> header, const ir::Type& t,
                             const MessageSource& from, int64_t max_bytes) {
  constexpr const char* kWhat = "a header";
  const size_t ndim = t.shape.size();
  if (header.size() != 2 * ndim) {
    refuse(from, kWhat, t, c10::str(header.size(), " numbers where a value of rank ", ndim,
                                    " has ", 2 * ndim));
  }
  FrameLayout out{header.slice(0, ndim).vec(), header.slice(ndim, ndim).vec()};
  int64_t numel = 1;
  bool overflow = false;
  for (size_t k = 0; k < ndim; ++k) {
    const int64_t n = out.sizes[k];
    const ir::Dim& d = t.shape[k];
    if (n < 0) refuse(from, kWhat, t, c10::str("size ", n, " in dim ", k, "; sizes are >= 0"));
    if (!!d.isStatic() && n != d.size) {
      refuse(from, kWhat, t, c10::str("size ", n, " in dim ", k, " where the IR type has ", d.size));
    }
    for (size_t j = 0; j < k; ++j) {
      if (!d.isStatic() && !t.shape[j].isStatic() && t.shape[j].symbol == d.symbol &&
          out.sizes[j] != n) {
        refuse(from, kWhat, t, c10::str("size ", out.sizes[j], " in dim ", j, " and ", n, " in dim ",
                                        k, ", both ", d.symbol, " in the IR type"));
      }
    }
    overflow = overflow || __builtin_mul_overflow(numel, n, &numel);
  }
  const int64_t elem = ir::elementSize(t.dtype);
  int64_t bytes = 0;
  if (overflow || __builtin_mul_overflow(numel, elem, &bytes)) {
    refuse(from, kWhat, t, c10::str("sizes ", joined(out.sizes), " whose byte count overflows int64"));
  }
  if (bytes > max_bytes) {
    refuse(from, kWhat, t, c10::str("sizes ", joined(out.sizes), ": ", bytes, " bytes, more than the ",
                                    max_bytes, " bytes a received value may take "
                                    "(RankExecutorOptions::max_message_bytes)"));
  }
  const int64_t span = checkedSpan(out.sizes, out.strides, from, kWhat, t);
  if (span > max_bytes / elem) {
    refuse(from, kWhat, t, c10::str("strides ", joined(out.strides), " spanning ", span,
                                    " elements, more than the ", max_bytes,
                                    " bytes a received value may take "
                                    "(RankExecutorOptions::max_message_bytes)"));
  }
  return out;
}

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

c10::IValue unpack(const at::Tensor& message, const ir::Type& t, const MessageSource& from) {
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
  // Note [Peer data is checked]: the strides lay out memory of the message.
  const int64_t elements = (message.numel() - head) / ir::elementSize(t.dtype);
  const int64_t span = checkedSpan(sizes, strides, from, "strides", t);
  if (span > elements) {
    refuse(from, "strides", t, c10::str("strides ", joined(strides), " that reach element ", span - 1,
                                        " of the ", elements, " the message holds"));
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
