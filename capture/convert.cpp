// Boxed call -> IR arguments (convert.h).
#include "capture/convert.h"

#include <ATen/core/Tensor.h>
#include <ATen/core/dispatch/Dispatcher.h>
#include <c10/util/StringUtil.h>

#include "ir/error.h"
#include "runtime/value_types.h"

namespace modelpar::capture {
namespace {

using c10::TypeKind;

[[noreturn]] void unsupported(const std::string& what) {
  throw UnsupportedOpError("modelpar capture: cannot express " + what + " in the IR");
}

const c10::Type& elementOf(const c10::Type& t) {
  if (t.kind() == TypeKind::OptionalType) return *t.expectRef<c10::OptionalType>().getElementType();
  return *t.expectRef<c10::ListType>().getElementType();
}

int64_t toInt(const c10::IValue& v) {
  if (v.isSymInt()) return v.toSymInt().guard_int(__FILE__, __LINE__);
  return v.toInt();
}

ir::Arg scalar(const c10::IValue& v) {
  if (v.isBool()) return ir::Arg::boolean(v.toBool());
  if (v.isInt() || v.isSymInt()) return ir::Arg::integer(toInt(v));
  if (v.isDouble()) return ir::Arg::floating(v.toDouble());
  if (v.isSymFloat()) return ir::Arg::floating(v.toSymFloat().guard_float(__FILE__, __LINE__));
  unsupported(c10::str("a ", v.tagKind(), " scalar"));
}

ir::Arg layoutArg(c10::Layout l) {
  for (auto k : {ir::Layout::Strided, ir::Layout::SparseCoo, ir::Layout::SparseCsr, ir::Layout::Mkldnn}) {
    if (runtime::toC10(k) == l) return ir::Arg::layout(k);
  }
  unsupported(c10::str("layout ", l));
}

ir::Arg memoryFormatArg(c10::MemoryFormat m) {
  for (auto k : {ir::MemoryFormat::Contiguous, ir::MemoryFormat::Preserve,
                 ir::MemoryFormat::ChannelsLast, ir::MemoryFormat::ChannelsLast3d}) {
    if (runtime::toC10(k) == m) return ir::Arg::memoryFormat(k);
  }
  unsupported(c10::str("memory format ", m));
}

}  // namespace

ir::Type typeOf(const at::Tensor& t) {
  std::optional<ir::ScalarType> s = runtime::fromC10(t.scalar_type());
  if (!s) unsupported(c10::str("a tensor of dtype ", t.scalar_type()));
  return ir::Type::tensor(*s, t.sizes().vec());
}

ir::Arg toArg(const c10::IValue& v, const c10::Type& t, const ArgContext& ctx) {
  if (t.kind() == TypeKind::OptionalType) {
    if (v.isNone()) return ir::Arg::none();
    if (v.isTensor() && !v.toTensor().defined()) return ir::Arg::none();
    return toArg(v, elementOf(t), ctx);
  }
  switch (t.kind()) {
    case TypeKind::TensorType:
      if (!v.isTensor() || !v.toTensor().defined()) unsupported("an undefined tensor argument");
      return ir::Arg::value(ctx.tensor(v.toTensor()));
    case TypeKind::IntType:
    case TypeKind::SymIntType:
      return ir::Arg::integer(toInt(v));
    case TypeKind::FloatType:
    case TypeKind::SymFloatType:
      if (v.isDouble() && ctx.floating) return ctx.floating(v.toDouble());
      return v.isDouble() ? ir::Arg::floating(v.toDouble()) : scalar(v);
    case TypeKind::BoolType:
    case TypeKind::SymBoolType:
      return ir::Arg::boolean(v.toBool());
    case TypeKind::NumberType:
      if (v.isDouble() && ctx.floating) return ctx.floating(v.toDouble());
      return scalar(v);
    case TypeKind::StringType:
      return ir::Arg::string(v.toStringRef());
    case TypeKind::ScalarTypeType: {
      std::optional<ir::ScalarType> s = runtime::fromC10(v.toScalarType());
      if (!s) unsupported(c10::str("dtype ", v.toScalarType()));
      return ir::Arg::dtype(*s);
    }
    case TypeKind::LayoutType:
      return layoutArg(v.toLayout());
    case TypeKind::MemoryFormatType:
      return memoryFormatArg(v.toMemoryFormat());
    case TypeKind::DeviceObjType: {
      const c10::Device d = v.toDevice();
      return ir::Arg::device(d.type() == c10::DeviceType::PrivateUse1 ? ctx.device_as : d.str());
    }
    case TypeKind::ListType:
      break;
    default:
      unsupported(c10::str("an argument of type ", t.str()));
  }
  const c10::Type& elem = elementOf(t);
  std::vector<ir::Arg> items;
  if (v.isTensorList()) {
    for (const at::Tensor& x : v.toTensorVector()) items.push_back(toArg(x, elem, ctx));
  } else if (v.isIntList()) {
    for (int64_t x : v.toIntVector()) items.push_back(ir::Arg::integer(x));
  } else if (v.isDoubleList()) {
    for (double x : v.toDoubleVector()) items.push_back(ir::Arg::floating(x));
  } else if (v.isBoolList()) {
    for (bool x : v.toBoolList()) items.push_back(ir::Arg::boolean(x));
  } else if (v.isList()) {
    for (const c10::IValue& x : v.toListRef()) items.push_back(toArg(x, elem, ctx));
  } else {
    unsupported(c10::str("a ", v.tagKind(), " value for a ", t.str(), " argument"));
  }
  return ir::Arg::list(std::move(items));
}

std::vector<ir::Arg> toArgs(const c10::FunctionSchema& schema, c10::ArrayRef<c10::IValue> args,
                            const ArgContext& ctx) {
  const std::vector<c10::Argument>& params = schema.arguments();
  std::vector<ir::Arg> converted(params.size());
  std::vector<bool> is_default(params.size(), false);
  ArgContext plain = ctx;  // defaults are constants: never make inputs for them
  plain.floating = nullptr;
  for (size_t i = 0; i < params.size() && i < args.size(); ++i) {
    const c10::Type& t = *params[i].real_type();
    converted[i] = toArg(args[i], t, ctx);
    if (params[i].default_value() && !converted[i].isValue()) {
      try {
        is_default[i] = toArg(*params[i].default_value(), t, plain) == converted[i];
      } catch (const UnsupportedOpError&) {
        is_default[i] = false;
      }
    }
  }
  std::vector<ir::Arg> out;
  size_t last_positional = 0;  // one past the last positional argument to write
  for (size_t i = 0; i < params.size(); ++i) {
    if (!params[i].kwarg_only() && !is_default[i]) last_positional = i + 1;
  }
  for (size_t i = 0; i < last_positional; ++i) {
    if (!params[i].kwarg_only()) out.push_back(std::move(converted[i]));
  }
  for (size_t i = 0; i < params.size(); ++i) {
    if (params[i].kwarg_only() && !is_default[i]) {
      out.push_back(std::move(converted[i].withKeyword(params[i].name())));
    }
  }
  return out;
}

bool drawsRandom(const c10::OperatorHandle& op) { return op.hasTag(at::Tag::nondeterministic_seeded); }

}  // namespace modelpar::capture
