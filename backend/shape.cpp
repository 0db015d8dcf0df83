// Output metadata without running ops on real data (shape.h).
#include "backend/shape.h"

#include <cstring>
#include <list>
#include <map>
#include <mutex>
#include <sstream>
#include <unordered_map>

#include <ATen/EmptyTensor.h>
#include <ATen/core/Tensor.h>
#include <c10/core/DefaultDtype.h>
#include <c10/util/Exception.h>

#include "backend/storage.h"

namespace modelpar::backend {
namespace {

/// Rebuilds call arguments on another device, keeping each storage's
/// elements shared between the arguments that share it (so views and their
/// bases alias there as they do here).
class Rebuild {
 public:
  explicit Rebuild(bool meta) : meta_(meta) {}

  c10::IValue operator()(const c10::IValue& v) {
    if (v.isTensor()) return tensor(v.toTensor());
    if (v.isTensorList()) {
      c10::List<at::Tensor> out;
      for (const at::Tensor& t : v.toTensorVector()) out.push_back(tensor(t));
      return out;
    }
    if (v.isList()) {
      c10::impl::GenericList in = v.toList();
      c10::impl::GenericList out(in.elementType());
      for (const c10::IValue& e : in) out.push_back((*this)(e));
      return out;
    }
    if (v.isDevice()) return c10::Device(meta_ ? c10::kMeta : c10::kCPU);
    return v;
  }

 private:
  at::Tensor tensor(const at::Tensor& t) {
    if (!t.defined()) return t;
    if (!meta_ && !isModelpar(t)) return t;  // CPU scalars and CPU data run as they are
    const Geometry g = Geometry::of(t);
    const c10::Storage& st = t.unsafeGetTensorImpl()->unsafe_storage();
    const auto itemsize = static_cast<int64_t>(c10::elementSize(g.dtype));
    const int64_t numel = (static_cast<int64_t>(st.nbytes()) + itemsize - 1) / itemsize;
    auto key = std::make_pair(static_cast<const void*>(st.unsafeGetStorageImpl()), g.dtype);
    auto it = bases_.find(key);
    if (it == bases_.end()) {
      at::Tensor base = meta_ ? at::Tensor(at::detail::empty_meta({numel}, g.dtype))
                              : at::Tensor(at::detail::empty_cpu({numel}, g.dtype));
      if (!meta_ && base.nbytes() > 0) std::memset(base.data_ptr(), 0, base.nbytes());
      it = bases_.emplace(key, base).first;
    }
    const at::Tensor& base = it->second;
    auto out = at::detail::make_tensor<c10::TensorImpl>(
        c10::TensorImpl::VIEW, c10::Storage(base.storage()), base.key_set(), base.dtype());
    out.unsafeGetTensorImpl()->set_sizes_and_strides(g.sizes, g.strides, g.offset);
    if (t.unsafeGetTensorImpl()->is_wrapped_number()) out.unsafeGetTensorImpl()->set_wrapped_number(true);
    return out;
  }

  bool meta_;
  std::map<std::pair<const void*, c10::ScalarType>, at::Tensor> bases_;
};

at::Tensor metaLike(const at::Tensor& t, std::optional<c10::ScalarType> dtype = std::nullopt) {
  if (!t.defined()) return t;
  return at::detail::empty_strided_meta(t.sizes(), t.strides(), dtype.value_or(t.scalar_type()));
}

c10::IValue toMeta(const c10::IValue& v) {
  if (v.isTensor()) return metaLike(v.toTensor());
  if (v.isTensorList()) {
    c10::List<at::Tensor> out;
    for (const at::Tensor& t : v.toTensorVector()) out.push_back(metaLike(t));
    return out;
  }
  return v;
}

bool hasGenerator(const c10::FunctionSchema& s) {
  for (const c10::Argument& a : s.arguments()) {
    const c10::Type* t = a.real_type().get();
    if (t->kind() == c10::TypeKind::OptionalType) {
      t = t->expectRef<c10::OptionalType>().getElementType().get();
    }
    if (t->kind() == c10::TypeKind::GeneratorType) return true;
  }
  return false;
}

/// Metadata rules for random ops that have no meta kernel in C++: running
/// them would draw from the generator and change the random stream.
std::optional<std::vector<c10::IValue>> randomRule(const c10::FunctionSchema& s,
                                                   const std::vector<c10::IValue>& args) {
  if (s.name() == "aten::native_dropout") {  // (input, p, train) -> (output, mask)
    const at::Tensor& in = args[0].toTensor();
    return std::vector<c10::IValue>{metaLike(in), metaLike(in, c10::ScalarType::Bool)};
  }
  return std::nullopt;
}

void signature(std::ostringstream& os, const c10::IValue& v) {
  if (v.isTensor()) {
    const at::Tensor& t = v.toTensor();
    if (!t.defined()) {
      os << "U;";
      return;
    }
    os << "T" << static_cast<int>(t.scalar_type()) << t.sizes() << t.strides() << "+"
       << t.storage_offset() << "/" << t.unsafeGetTensorImpl()->unsafe_storage().nbytes()
       << (t.unsafeGetTensorImpl()->is_wrapped_number() ? "w" : "") << t.device().type() << ";";
  } else if (v.isList()) {
    os << "[";
    for (const c10::IValue& e : v.toListRef()) signature(os, e);
    os << "]";
  } else if (v.isDouble()) {
    os << std::hexfloat << v.toDouble() << std::defaultfloat << ";";
  } else {
    os << v.tagKind() << ":" << v << ";";
  }
}

/// Inferred outputs by call signature; bounded, oldest dropped first.
class RunCache {
 public:
  std::optional<std::vector<c10::IValue>> find(const std::string& key) {
    std::lock_guard<std::mutex> lock(mu_);
    auto it = map_.find(key);
    if (it == map_.end()) return std::nullopt;
    return it->second;
  }
  void put(const std::string& key, std::vector<c10::IValue> v) {
    std::lock_guard<std::mutex> lock(mu_);
    if (map_.emplace(key, std::move(v)).second) order_.push_back(key);
    if (order_.size() > kMax) {
      map_.erase(order_.front());
      order_.pop_front();
    }
  }

 private:
  static constexpr size_t kMax = 1 << 16;
  std::mutex mu_;
  std::unordered_map<std::string, std::vector<c10::IValue>> map_;
  std::list<std::string> order_;
};

}  // namespace

bool isDataDependent(const c10::FunctionSchema& s) {
  static const char* const kNames[] = {
      "aten::nonzero",      "aten::nonzero_numpy", "aten::argwhere",     "aten::unique_consecutive",
      "aten::unique_dim",   "aten::unique_dim_consecutive", "aten::_unique", "aten::_unique2",
      "aten::masked_select", "aten::bincount",     "aten::histogram",    "aten::histogramdd",
      "aten::_local_scalar_dense", "aten::equal",  "aten::is_nonzero",   "aten::allclose",
      "aten::item",         "aten::_assert_async", "aten::_assert_scalar"};
  for (const char* n : kNames) {
    if (s.name() == n) return true;
  }
  if (s.name() == "aten::repeat_interleave") return s.overload_name() != "self_int";
  if (s.name() == "aten::where") return s.overload_name().empty();  // where(cond) == nonzero
  return false;
}

std::vector<c10::IValue> inferOutputs(const c10::OperatorHandle& op,
                                      const std::vector<c10::IValue>& args) {
  const c10::FunctionSchema& s = op.schema();
  if (isDataDependent(s)) {
    throw CannotCapture("its output shape or value depends on the data of its inputs");
  }
  // 0. Output metadata is a function of the arguments' metadata: a step
  //    that repeats an earlier one is answered from the cache without
  //    calling anything (meta kernels cost tens of microseconds, the ones
  //    PyTorch registers from Python far more).
  static RunCache cache;
  std::ostringstream key;
  key << s.name() << "." << s.overload_name() << "/" << c10::get_default_dtype_as_scalartype() << "(";
  for (const c10::IValue& a : args) signature(key, a);
  const std::string k = key.str();
  if (auto hit = cache.find(k)) return *hit;

  // 1. The meta kernel, unless it failed before for this op (a failure
  //    throws a c10::Error, whose backtrace costs far more than the call).
  static std::mutex no_meta_mu;
  static std::unordered_map<c10::OperatorName, std::string> no_meta;
  std::string meta_error;
  {
    std::lock_guard<std::mutex> lock(no_meta_mu);
    auto it = no_meta.find(op.operator_name());
    if (it != no_meta.end()) meta_error = it->second;
  }
  if (meta_error.empty()) {
    try {
      Rebuild meta(true);
      std::vector<c10::IValue> stack;
      stack.reserve(args.size());
      for (const c10::IValue& a : args) stack.push_back(meta(a));
      op.callBoxed(stack);
      cache.put(k, stack);
      return stack;
    } catch (const std::exception& e) {
      const c10::Error* ce = dynamic_cast<const c10::Error*>(&e);
      meta_error = ce ? ce->what_without_backtrace() : e.what();
      meta_error = meta_error.substr(0, meta_error.find('\n'));
      if (meta_error.empty()) meta_error = "no meta kernel";
      std::lock_guard<std::mutex> lock(no_meta_mu);
      no_meta.emplace(op.operator_name(), meta_error);
    }
  }
  // 2. Random ops: a rule, or nothing (a zero-filled run would draw numbers).
  if (auto r = randomRule(s, args)) {
    cache.put(k, *r);
    return *r;
  }
  if (hasGenerator(s)) {
    throw CannotCapture("it is a random op without a meta kernel (" + meta_error + ")");
  }
  // 3. One run on zero-filled CPU tensors.
  std::vector<c10::IValue> stack;
  try {
    Rebuild zeros(false);
    for (const c10::IValue& a : args) stack.push_back(zeros(a));
    op.callBoxed(stack);
  } catch (const std::exception& e) {
    const c10::Error* ce = dynamic_cast<const c10::Error*>(&e);
    std::string msg = ce ? ce->what_without_backtrace() : e.what();
    throw CannotCapture("it has no meta kernel (" + meta_error +
                        ") and fails on zero-filled inputs: " + msg.substr(0, msg.find('\n')));
  }
  for (c10::IValue& v : stack) v = toMeta(v);
  cache.put(k, stack);
  return stack;
}

}  // namespace modelpar::backend
