// The capture kernel (capture_kernel.h): classify the call, record it, or
// break the graph.
#include "backend/capture_kernel.h"

#include <unordered_map>

#include <ATen/core/Tensor.h>
#include <c10/util/Exception.h>

#include "backend/functional.h"
#include "backend/session.h"
#include "backend/shape.h"
#include "backend/storage.h"
#include "capture/convert.h"
#include "runtime/check.h"

namespace modelpar::backend {
namespace {

using c10::IValue;

Session& session() { return Session::get(); }

std::string opName(const c10::FunctionSchema& s) {
  return s.overload_name().empty() ? s.name() : s.name() + "." + s.overload_name();
}

template <typename F>
void forEachTensor(const IValue& v, F&& f) {
  if (v.isTensor()) {
    f(v.toTensor());
  } else if (v.isTensorList()) {
    for (const at::Tensor& t : v.toTensorVector()) f(t);
  } else if (v.isList()) {
    for (const IValue& e : v.toListRef()) forEachTensor(e, f);
  }
}

/// Eager CUDA accepts CPU 0-dim tensors beside device tensors (Python
/// numbers often arrive as such); everything else must be on modelpar.
void checkDevices(const c10::FunctionSchema& s, const std::vector<IValue>& args, bool allow_cpu_data) {
  for (size_t i = 0; i < args.size(); ++i) {
    forEachTensor(args[i], [&](const at::Tensor& t) {
      if (!t.defined() || isModelpar(t)) return;
      if (t.device().is_cpu() && (t.dim() == 0 || allow_cpu_data)) return;
      TORCH_CHECK(false, "modelpar: ", opName(s), " got tensors on two devices, ",
                  c10::Device(c10::DeviceType::PrivateUse1, 0), " and ", t.device(), " (argument '",
                  s.arguments()[i].name(), "' of shape ", t.sizes(),
                  "); move the other tensors to the modelpar device with .to(\"modelpar\"), "
                  "or bring the modelpar ones back with .to(\"", t.device().str(),
                  "\"), which materialises them");
    });
  }
}

void replaceArgs(torch::jit::Stack* stack, size_t n, std::vector<IValue> results) {
  torch::jit::drop(*stack, n);
  for (IValue& r : results) stack->push_back(std::move(r));
}

/// Records a call of a non-mutating op and returns its results as modelpar
/// tensors: views share their source's storage, other outputs get new ones.
std::vector<IValue> recordCall(const c10::OperatorHandle& op, const std::vector<IValue>& args) {
  const c10::FunctionSchema& s = op.schema();
  // detach / alias / lift_fresh: a new TensorImpl showing the same elements
  // is the same value; nothing to record.
  if ((s.name() == "aten::detach" || s.name() == "aten::alias" || s.name() == "aten::lift_fresh") &&
      args.size() == 1 && args[0].isTensor() && isModelpar(args[0].toTensor())) {
    const at::Tensor& src = args[0].toTensor();
    const ir::ValueId v = session().valueOf(src);
    at::Tensor t = makeView(src, Geometry::of(src));
    session().defineView(t, v, nullptr);
    return {IValue(std::move(t))};
  }
  std::vector<IValue> meta = inferOutputs(op, args);
  capture::ArgContext ctx;
  ctx.tensor = [](const at::Tensor& t) {
    return isModelpar(t) ? session().valueOf(t) : session().scalarInput(t);
  };
  if (session().recordingUpdate()) {  // Note [Per-step scalars are inputs] (session.h)
    ctx.floating = [](double x) { return ir::Arg::value(session().floatInput(x)); };
  }
  std::vector<ir::Arg> ir_args = capture::toArgs(s, args, ctx);

  std::vector<ir::Type> types;
  auto addType = [&](const at::Tensor& m) {
    types.push_back(m.defined() ? capture::typeOf(m) : ir::Type::tensor(ir::ScalarType::Float32, std::vector<int64_t>{}));
  };
  for (const IValue& r : meta) {
    if (r.isTensor()) {
      addType(r.toTensor());
    } else if (r.isTensorList()) {
      for (const at::Tensor& m : r.toTensorVector()) addType(m);
    } else {
      throw CannotCapture(c10::str("it returns a ", r.tagKind(), " computed from tensor data"));
    }
  }
  const std::vector<ir::ValueId> outs =
      session().record(opName(s), ir_args, std::move(types), capture::drawsRandom(op));

  std::vector<IValue> results;
  size_t k = 0;
  for (size_t i = 0; i < meta.size(); ++i) {
    const int src_index = i < s.returns().size() ? aliasedArg(s, s.returns()[i]) : -1;
    const at::Tensor* src = nullptr;
    if (src_index >= 0 && args[static_cast<size_t>(src_index)].isTensor() &&
        isModelpar(args[static_cast<size_t>(src_index)].toTensor())) {
      src = &args[static_cast<size_t>(src_index)].toTensor();
    }
    std::shared_ptr<const ViewStep> step;
    if (src && meta[i].isTensor() && !(Geometry::of(meta[i].toTensor()) == Geometry::of(*src))) {
      // A single-output view that moves elements can be replayed.
      const ir::ValueId src_value = session().valueOf(*src);
      auto vs = std::make_shared<ViewStep>(ViewStep{opName(s), ir_args, Geometry::of(*src)});
      for (ir::Arg& a : vs->args) {
        a.remapValues([&](ir::ValueId x) { return x == src_value ? ir::kNoId : x; });
      }
      step = std::move(vs);
    }
    auto make = [&](const at::Tensor& m) -> at::Tensor {
      const ir::ValueId v = outs[k++];
      if (!m.defined()) return at::Tensor();
      const Geometry g = Geometry::of(m);
      if (src) {
        at::Tensor t = makeView(*src, g);
        session().defineView(t, v, step);
        return t;
      }
      at::Tensor t = makeFresh(g);
      session().defineFresh(t, v);
      return t;
    };
    if (meta[i].isTensor()) {
      results.emplace_back(make(meta[i].toTensor()));
    } else {
      c10::List<at::Tensor> l;
      for (const at::Tensor& m : meta[i].toTensorVector()) l.push_back(make(m));
      results.emplace_back(std::move(l));
    }
  }
  return results;
}

/// Records a mutating call as its functional variant and writes the results
/// back into the mutated tensors (Note [Tensors, storages and trace values]).
std::vector<IValue> recordMutation(const c10::OperatorHandle& op, const FunctionalVariant& fv,
                                   const std::vector<IValue>& args) {
  const c10::FunctionSchema& s = op.schema();
  const c10::FunctionSchema& fs = fv.functional.schema();
  std::vector<IValue> fargs;
  for (size_t i = 0; i < fv.arg_from.size(); ++i) {
    const int from = fv.arg_from[i];
    fargs.push_back(from >= 0 ? args[static_cast<size_t>(from)] : *fs.arguments()[i].default_value());
  }
  std::vector<IValue> res = recordCall(fv.functional, fargs);

  // Pair each written tensor with its new contents; check them all first so
  // that nothing is half written when the call cannot be captured.
  std::vector<std::pair<at::Tensor, at::Tensor>> writes;
  for (size_t k = 0; k < fv.mutated.size(); ++k) {
    const IValue& orig = args[static_cast<size_t>(fv.mutated[k])];
    const IValue& now = res[fv.fresh_returns + k];
    if (orig.isTensor()) {
      writes.emplace_back(orig.toTensor(), now.toTensor());
    } else if (orig.isTensorList()) {
      std::vector<at::Tensor> o = orig.toTensorVector(), n = now.toTensorVector();
      TORCH_INTERNAL_ASSERT(o.size() == n.size(), "modelpar: ", opName(fs), " returned ", n.size(),
                            " tensors for ", o.size());
      for (size_t j = 0; j < o.size(); ++j) writes.emplace_back(o[j], n[j]);
    } else if (!orig.isNone()) {
      throw CannotCapture(c10::str("it writes a ", orig.tagKind(), " argument"));
    }
  }
  for (const auto& [orig, now] : writes) {
    if (!orig.defined()) continue;
    if (!isModelpar(orig)) throw CannotCapture("it writes a tensor that is not on modelpar");
    if (orig.sizes() != now.sizes()) throw CannotCapture("it resizes the tensor it writes");
  }
  for (const auto& [orig, now] : writes) {
    if (!orig.defined()) continue;
    ir::ValueId v = session().valueOf(now);
    if (orig.scalar_type() != now.scalar_type()) {  // in-place ops keep their dtype
      v = session().record(
          "aten::_to_copy",
          {ir::Arg::value(v), ir::Arg::dtype(capture::typeOf(orig).dtype).withKeyword("dtype")},
          {capture::typeOf(orig)})[0];
    }
    session().commit(orig, v);
  }

  std::vector<IValue> out;
  size_t fresh = 0;
  for (const c10::Argument& r : s.returns()) {
    const int a = aliasedArg(s, r);
    out.push_back(a >= 0 ? args[static_cast<size_t>(a)] : res[fresh++]);
  }
  return out;
}

void graphBreak(const c10::OperatorHandle& op, torch::jit::Stack* stack, const std::string& reason) {
  const std::string name = opName(op.schema());
  MP_RT_CHECK(!session().options().strict, UnsupportedOpError, "modelpar: ", name,
              " cannot be captured: ", reason,
              " (strict mode; with strict off it runs eagerly as a counted graph break)");
  session().noteGraphBreak(name, reason);
  runEagerly(op, stack);
}

}  // namespace

void captureCall(const c10::OperatorHandle& op, torch::jit::Stack* stack, bool allow_cpu_data) {
  std::lock_guard<std::recursive_mutex> lock(captureMutex());
  const c10::FunctionSchema& s = op.schema();
  const size_t n = s.arguments().size();
  std::vector<IValue> args(stack->end() - static_cast<std::ptrdiff_t>(n), stack->end());
  checkDevices(s, args, allow_cpu_data);
  struct CallScope {
    int64_t previous;
    ~CallScope() { session().endCall(previous); }
  } call{session().beginCall(args)};
  MP_RT_CHECK(!mutatesMetadata(s), UnsupportedOpError, "modelpar: ", opName(s),
              " changes a tensor's shape or storage in place, which the capture cannot express; "
              "use the out-of-place form (e.g. t() instead of t_())");
  std::string reason;
  try {
    std::optional<FunctionalVariant> fv;
    if (writesArguments(s)) fv = functionalVariant(op, args);
    if (fv) {
      replaceArgs(stack, n, recordMutation(op, *fv, args));
    } else if (s.is_mutable()) {
      throw CannotCapture("it writes its arguments and has no functional variant");
    } else {
      replaceArgs(stack, n, recordCall(op, args));
    }
    return;
  } catch (const CannotCapture& e) {
    reason = e.what();
  } catch (const UnsupportedOpError& e) {
    reason = e.what();
  }
  graphBreak(op, stack, reason);
}

void captureKernel(const c10::OperatorHandle& op, torch::jit::Stack* stack) {
  captureCall(op, stack, /*allow_cpu_data=*/false);
}

void runEagerly(const c10::OperatorHandle& op, torch::jit::Stack* stack) {
  std::lock_guard<std::recursive_mutex> lock(captureMutex());
  const size_t n = op.schema().arguments().size();
  session().sync();
  // CPU views of the modelpar arguments, remembering where each came from.
  std::unordered_map<const c10::TensorImpl*, at::Tensor> same;          // cpu impl -> arg
  std::unordered_map<const c10::StorageImpl*, at::Tensor> storage_of;  // cpu storage -> arg
  auto toCpu = [&](const at::Tensor& t) -> at::Tensor {
    if (!isModelpar(t)) return t;
    at::Tensor c = session().cpuView(t);
    same.emplace(c.unsafeGetTensorImpl(), t);
    storage_of.emplace(c.storage().unsafeGetStorageImpl(), t);
    return c;
  };
  std::function<IValue(const IValue&)> convert = [&](const IValue& v) -> IValue {
    if (v.isTensor()) return toCpu(v.toTensor());
    if (v.isTensorList()) {
      c10::List<at::Tensor> l;
      for (const at::Tensor& t : v.toTensorVector()) l.push_back(toCpu(t));
      return l;
    }
    if (v.isList()) {
      c10::impl::GenericList in = v.toList();
      c10::impl::GenericList out(in.elementType());
      for (const IValue& e : in) out.push_back(convert(e));
      return out;
    }
    if (v.isDevice() && v.toDevice().type() == c10::DeviceType::PrivateUse1) return c10::Device(c10::kCPU);
    return v;
  };
  std::vector<IValue> args(stack->end() - static_cast<std::ptrdiff_t>(n), stack->end());
  torch::jit::drop(*stack, n);
  std::vector<IValue> cpu_stack;
  for (const IValue& a : args) cpu_stack.push_back(convert(a));
  op.callBoxed(cpu_stack);

  auto wrap = [&](const at::Tensor& r) -> at::Tensor {
    if (!r.defined() || !r.device().is_cpu()) return r;
    if (auto it = same.find(r.unsafeGetTensorImpl()); it != same.end()) return it->second;
    if (auto it = storage_of.find(r.storage().unsafeGetStorageImpl()); it != storage_of.end()) {
      return makeView(it->second, Geometry::of(r));
    }
    at::Tensor t = makeFresh(Geometry::of(r));
    session().setContents(t, r);
    return t;
  };
  for (const IValue& r : cpu_stack) {
    if (r.isTensor()) {
      stack->emplace_back(wrap(r.toTensor()));
    } else if (r.isTensorList()) {
      c10::List<at::Tensor> l;
      for (const at::Tensor& t : r.toTensorVector()) l.push_back(wrap(t));
      stack->emplace_back(std::move(l));
    } else {
      stack->push_back(r);
    }
  }
}

}  // namespace modelpar::backend
