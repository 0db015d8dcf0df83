// Resolving an IR node to an ATen operator and calling it boxed (op_call.h).
#include "runtime/op_call.h"

#include <algorithm>
#include <optional>

#include <ATen/core/Tensor.h>
#include <ATen/EmptyTensor.h>
#include <c10/util/Exception.h>

#include "ir/printer.h"
#include "runtime/check.h"
#include "runtime/value_types.h"

namespace modelpar::runtime {
namespace {

using ArgKind = ir::Arg::Kind;
using c10::TypeKind;

c10::OperatorHandle findOp(const ir::Graph& g, ir::NodeId n) {
  const ir::Node& node = g.node(n);
  try {
    return c10::Dispatcher::singleton().findSchemaOrThrow(node.op.c_str(), node.overload.c_str());
  } catch (const c10::Error&) {
    // Say which overloads do exist: the usual slip is a missing or wrong one.
    std::string overloads;
    for (const c10::OperatorName& name : c10::Dispatcher::singleton().getAllOpNames()) {
      if (name.name != node.op) continue;
      overloads += overloads.empty() ? "" : ", ";
      overloads += name.overload_name.empty() ? "<default>" : name.overload_name;
    }
    MP_RT_THROW(UnsupportedOpError, "node ", g.nodeRef(n), ": unknown operator ",
                node.qualifiedName(),
                overloads.empty() ? std::string()
                                  : c10::str(" (", node.op, " has overloads: ", overloads, ")"));
  }
}

const c10::Type& elementOf(const c10::Type& t) {
  if (t.kind() == TypeKind::OptionalType) return *t.expectRef<c10::OptionalType>().getElementType();
  return *t.expectRef<c10::ListType>().getElementType();
}

bool isIntLike(const c10::Type& t) {
  return t.kind() == TypeKind::IntType || t.kind() == TypeKind::SymIntType;
}
bool isFloatLike(const c10::Type& t) {
  return t.kind() == TypeKind::FloatType || t.kind() == TypeKind::SymFloatType;
}

// The element types a list argument may have (see ResolvedOp::build).
bool listElementSupported(const c10::Type& e) {
  switch (e.kind()) {
    case TypeKind::TensorType:
    case TypeKind::IntType:
    case TypeKind::SymIntType:
    case TypeKind::FloatType:
    case TypeKind::BoolType:
    case TypeKind::NumberType:
      return true;
    case TypeKind::OptionalType:
      return elementOf(e).kind() == TypeKind::TensorType;
    default:
      return false;
  }
}

/// Whether `a` can be passed where the schema has type `t`. Sets
/// `unsupported` when `t` is a type the IR has no argument form for.
bool fits(const ir::Arg& a, const c10::Type& t, const ir::Graph& g, bool& unsupported) {
  auto valueOf = [&](ir::Type::Kind k) {
    return a.isValue() && g.value(a.toValue()).type.kind == k;
  };
  using VK = ir::Type::Kind;
  switch (t.kind()) {
    case TypeKind::OptionalType:
      return a.isNone() || fits(a, elementOf(t), g, unsupported);
    case TypeKind::TensorType:  // a number becomes a wrapped-number tensor (wrappedNumber)
      // None is an undefined tensor, as the dispatcher takes it: AOTAutograd's
      // backward of efficient attention passes attn_bias=None to a `Tensor`.
      return a.isNone() || valueOf(VK::Tensor) || a.kind() == ArgKind::Int || a.kind() == ArgKind::Float ||
             a.kind() == ArgKind::Bool || valueOf(VK::Int) || valueOf(VK::Float) ||
             valueOf(VK::Bool);
    case TypeKind::IntType:
    case TypeKind::SymIntType:
      return a.kind() == ArgKind::Int || valueOf(VK::Int);
    case TypeKind::FloatType:
    case TypeKind::SymFloatType:
      return a.kind() == ArgKind::Int || a.kind() == ArgKind::Float || valueOf(VK::Int) ||
             valueOf(VK::Float);
    case TypeKind::BoolType:
    case TypeKind::SymBoolType:
      return a.kind() == ArgKind::Bool || valueOf(VK::Bool);
    case TypeKind::NumberType:  // Scalar
      return a.kind() == ArgKind::Int || a.kind() == ArgKind::Float ||
             a.kind() == ArgKind::Bool || valueOf(VK::Int) || valueOf(VK::Float) ||
             valueOf(VK::Bool);
    case TypeKind::StringType:
      return a.kind() == ArgKind::String;
    case TypeKind::ScalarTypeType:
      return a.kind() == ArgKind::Dtype;
    case TypeKind::LayoutType:
      return a.kind() == ArgKind::Layout;
    case TypeKind::MemoryFormatType:
      return a.kind() == ArgKind::MemoryFormat;
    case TypeKind::DeviceObjType:
      return a.kind() == ArgKind::Device;
    case TypeKind::ListType: {
      const c10::Type& elem = elementOf(t);
      if (!listElementSupported(elem)) {
        unsupported = true;
        return false;
      }
      if (!a.isList()) return false;
      return std::all_of(a.items().begin(), a.items().end(),
                         [&](const ir::Arg& item) { return fits(item, elem, g, unsupported); });
    }
    default:
      unsupported = true;
      return false;
  }
}

/// `int[2] stride` also takes a single int (`3` means `[3, 3]`), as in
/// TorchScript; returns the list form of such an argument, else `a` itself.
ir::Arg broadcastFixedList(const ir::Arg& a, const c10::Argument& param, const ir::Graph& g) {
  const c10::Type* t = param.real_type().get();
  if (t->kind() == TypeKind::OptionalType) t = &elementOf(*t);
  if (!param.N() || t->kind() != TypeKind::ListType || !isIntLike(elementOf(*t))) return a;
  const bool single_int = a.kind() == ArgKind::Int ||
                          (a.isValue() && g.value(a.toValue()).type.kind == ir::Type::Kind::Int);
  if (!single_int) return a;
  ir::Arg item = a;
  item.withKeyword("");
  return ir::Arg::list(std::vector<ir::Arg>(static_cast<size_t>(*param.N()), item));
}

/// A number passed where the schema wants a Tensor (`aten::add.Tensor(%x, 1)`,
/// as FX graphs write it): a 0-dim CPU tensor marked as a wrapped number,
/// exactly what PyTorch's Python argument parser makes of it, so type
/// promotion treats it as a Python scalar (an f16 tensor plus 0.5 stays f16).
/// Made without the dispatcher: resolution may run under a Python dispatch
/// mode (torch.compile resolves inside FakeTensorMode), which must not see it.
at::Tensor wrappedNumber(const c10::Scalar& s) {
  at::Tensor t = at::detail::empty_cpu({}, s.type(), /*pin_memory=*/false, std::nullopt);
  switch (s.type()) {
    case c10::ScalarType::Long:
      *t.mutable_data_ptr<int64_t>() = s.toLong();
      break;
    case c10::ScalarType::Bool:
      *t.mutable_data_ptr<bool>() = s.toBool();
      break;
    default:
      *t.mutable_data_ptr<double>() = s.toDouble();
      break;
  }
  t.unsafeGetTensorImpl()->set_wrapped_number(true);
  return t;
}

c10::Scalar scalarOf(const ir::Arg& a) {
  if (a.kind() == ArgKind::Int) return c10::Scalar(a.toInt());
  if (a.kind() == ArgKind::Bool) return c10::Scalar(a.toBool());
  return c10::Scalar(a.toDouble());
}

bool refersToValues(const ir::Arg& a) {
  bool any = false;
  a.forEachValue([&](ir::ValueId) { any = true; });
  return any;
}

std::string argText(const ir::Graph& g, const ir::Arg& a) {
  std::string s = ir::printArg(g, a);
  if (a.isValue()) s += c10::str(" (", ir::toString(g.value(a.toValue()).type), ")");
  return s;
}

std::string names(const std::vector<c10::Argument>& params) {
  std::string s;
  for (const c10::Argument& p : params) s += (s.empty() ? "" : ", ") + p.name();
  return s;
}

}  // namespace

ResolvedOp::ResolvedOp(const ir::Graph& g, ir::NodeId n) : handle_(findOp(g, n)) {
  const ir::Node& node = g.node(n);
  node_ref_ = g.nodeRef(n);
  op_name_ = node.qualifiedName();
  const std::string where = c10::str("node ", node_ref_, " (", op_name_, ")");
  const c10::FunctionSchema& schema = handle_.schema();
  const std::vector<c10::Argument>& params = schema.arguments();

  // 1. Match node arguments to schema arguments: positional ones in order
  //    over the non-kwarg-only parameters, keywords by name.
  std::vector<size_t> positional;
  for (size_t i = 0; i < params.size(); ++i) {
    if (!params[i].kwarg_only()) positional.push_back(i);
  }
  const auto num_positional_given = std::count_if(
      node.args.begin(), node.args.end(), [](const ir::Arg& a) { return a.keyword().empty(); });
  MP_RT_CHECK(static_cast<size_t>(num_positional_given) <= positional.size(), InvalidIrError, where,
              ": ", num_positional_given, " positional arguments given, but ", op_name_,
              " takes at most ", positional.size(), "; schema: ", schema);
  std::vector<const ir::Arg*> given(params.size(), nullptr);
  size_t next_positional = 0;
  for (const ir::Arg& a : node.args) {
    size_t i = 0;
    if (a.keyword().empty()) {
      i = positional[next_positional++];
    } else {
      auto it = std::find_if(params.begin(), params.end(),
                             [&](const c10::Argument& p) { return p.name() == a.keyword(); });
      MP_RT_CHECK(it != params.end(), InvalidIrError, where, ": unknown keyword argument '",
                  a.keyword(), "'; valid names: ", names(params));
      i = static_cast<size_t>(it - params.begin());
    }
    MP_RT_CHECK(given[i] == nullptr, InvalidIrError, where, ": argument '", params[i].name(),
                "' given twice");
    given[i] = &a;
  }

  // 2. Check each argument against its schema type and build the constants;
  //    missing arguments take the schema default.
  slots_.resize(params.size());
  for (size_t i = 0; i < params.size(); ++i) {
    const c10::Argument& p = params[i];
    Slot& slot = slots_[i];
    slot.type = p.real_type();
    const c10::Type& plain = slot.type->kind() == TypeKind::OptionalType
                                 ? *slot.type->castRaw<c10::OptionalType>()->getElementType()
                                 : *slot.type;
    slot.device = plain.kind() == TypeKind::DeviceObjType;
    if (given[i] == nullptr) {
      MP_RT_CHECK(p.default_value().has_value(), InvalidIrError, where, ": missing argument '",
                  p.name(), "' (", slot.type->str(), "); schema: ", schema);
      slot.constant = *p.default_value();
      continue;
    }
    ir::Arg a = broadcastFixedList(*given[i], p, g);
    bool unsupported = false;
    if (!fits(a, *slot.type, g, unsupported)) {
      MP_RT_CHECK(!unsupported, UnsupportedOpError, where, ": argument '", p.name(),
                  "' has schema type ", slot.type->str(), ", which modelpar cannot pass");
      MP_RT_THROW(InvalidIrError, where, ": argument '", p.name(), "' expects ", slot.type->str(),
                  ", got ", argText(g, *given[i]));
    }
    if (refersToValues(a)) {
      slot.arg = std::move(a);
      slot.dynamic = true;
      continue;
    }
    try {
      slot.constant = build(a, *slot.type, nullptr);
    } catch (const c10::Error& e) {  // e.g. device("nowhere:0")
      MP_RT_THROW(InvalidIrError, where, ": argument '", p.name(), "': ",
                  e.what_without_backtrace());
    }
  }

  // 3. What the outputs must look like, and names for messages.
  for (ir::ValueId v : node.outputs) {
    output_types_.push_back(g.value(v).type);
    output_names_.push_back(g.value(v).name);
  }
  for (ir::ValueId v : node.inputs()) {
    auto known = [&](const auto& e) { return e.first == v; };
    if (std::none_of(input_names_.begin(), input_names_.end(), known)) {
      input_names_.emplace_back(v, g.value(v).name);
    }
  }
}

const c10::IValue& ResolvedOp::read(ir::ValueId v, const Env& env) const {
  const c10::IValue& x = env.at(static_cast<size_t>(v));
  if (x.isNone()) {
    auto it = std::find_if(input_names_.begin(), input_names_.end(),
                           [&](const auto& e) { return e.first == v; });
    MP_RT_THROW(ExecutionError, "node ", node_ref_, " (", op_name_, "): input %",
                it == input_names_.end() ? std::to_string(v) : it->second,
                " is not available (not computed yet, freed, or not on this device)");
  }
  return x;
}

// Precondition: fits(a, t) held at resolution; env is null only for
// arguments without values.
c10::IValue ResolvedOp::build(const ir::Arg& a, const c10::Type& t, const Env* env) const {
  if (t.kind() == TypeKind::OptionalType) {
    return a.isNone() ? c10::IValue() : build(a, elementOf(t), env);
  }
  if (a.isValue()) {
    const c10::IValue& v = read(a.toValue(), *env);
    if (isFloatLike(t) && v.isInt()) return static_cast<double>(v.toInt());
    if (t.kind() == TypeKind::TensorType && !v.isTensor()) return wrappedNumber(v.toScalar());
    return v;
  }
  switch (t.kind()) {
    case TypeKind::TensorType:
      if (a.isNone()) return at::Tensor();
      return wrappedNumber(scalarOf(a));
    case TypeKind::IntType:
    case TypeKind::SymIntType:
      return a.toInt();
    case TypeKind::FloatType:
    case TypeKind::SymFloatType:
      return a.kind() == ArgKind::Int ? static_cast<double>(a.toInt()) : a.toDouble();
    case TypeKind::BoolType:
    case TypeKind::SymBoolType:
      return a.toBool();
    case TypeKind::NumberType:
      if (a.kind() == ArgKind::Int) return a.toInt();
      if (a.kind() == ArgKind::Bool) return a.toBool();
      return a.toDouble();
    case TypeKind::StringType:
      return a.toStringRef();
    case TypeKind::ScalarTypeType:
      return toC10(a.toDtype());
    case TypeKind::LayoutType:
      return toC10(a.toLayout());
    case TypeKind::MemoryFormatType:
      return toC10(a.toMemoryFormat());
    case TypeKind::DeviceObjType:
      return c10::Device(a.toStringRef());
    case TypeKind::ListType:
      break;
    default:
      MP_RT_INTERNAL_ASSERT(false, "node ", node_ref_, ": cannot build ",
                            t.str());
  }
  return buildList(a, t, env);
}

// Lists: the element type decides the IValue list type the kernel unboxes.
c10::IValue ResolvedOp::buildList(const ir::Arg& a, const c10::Type& t, const Env* env) const {
  const c10::Type& elem = elementOf(t);
  const std::vector<ir::Arg>& items = a.items();
  switch (elem.kind()) {
    case TypeKind::TensorType: {
      c10::List<at::Tensor> l;
      l.reserve(items.size());
      for (const ir::Arg& item : items) l.push_back(build(item, elem, env).toTensor());
      return l;
    }
    case TypeKind::OptionalType: {  // Tensor?[]
      c10::List<std::optional<at::Tensor>> l;
      l.reserve(items.size());
      for (const ir::Arg& item : items) {
        l.push_back(item.isNone() ? std::nullopt
                                  : std::optional<at::Tensor>(
                                        build(item, elementOf(elem), env).toTensor()));
      }
      return l;
    }
    case TypeKind::IntType:
    case TypeKind::SymIntType: {
      std::vector<int64_t> l;
      l.reserve(items.size());
      for (const ir::Arg& item : items) {
        l.push_back(item.isValue() ? read(item.toValue(), *env).toInt() : item.toInt());
      }
      return l;
    }
    case TypeKind::FloatType: {
      std::vector<double> l;
      l.reserve(items.size());
      for (const ir::Arg& item : items) l.push_back(build(item, elem, env).toDouble());
      return l;
    }
    case TypeKind::BoolType: {
      c10::List<bool> l;
      l.reserve(items.size());
      for (const ir::Arg& item : items) l.push_back(build(item, elem, env).toBool());
      return l;
    }
    case TypeKind::NumberType: {  // Scalar[]: kernels unbox a list typed `Scalar`
      c10::impl::GenericList l(c10::NumberType::get());
      l.reserve(items.size());
      for (const ir::Arg& item : items) l.push_back(build(item, elem, env));
      return l;
    }
    default:
      MP_RT_INTERNAL_ASSERT(false, "node ", node_ref_, ": cannot build ",
                            t.str());
  }
}

// Note [Factory ops follow their device]
// A graph traced on the CPU (torch.compile's fake tensors on the caller's
// device, or an IR file) names devices as constants: torch.arange(T,
// device=x.device) becomes aten::arange(..., device=cpu), and a factory op
// with device=None makes a CPU tensor. Run on a GPU, such a tensor meets the
// GPU tensors of its consumers and the op fails ("index is on cpu"; seen on
// the first GPU run). The plan placed the node on a logical device, so its
// tensors belong there: the executor passes the device's GPU and every
// Device / Device? argument becomes it. CPU workers pass nothing and run the
// graph as written (they all share the CPU).
std::vector<c10::IValue> ResolvedOp::call(const Env& env, const c10::Device* place_on) const {
  std::vector<c10::IValue> stack;
  stack.reserve(slots_.size());
  for (const Slot& s : slots_) {
    if (place_on != nullptr && s.device) {
      stack.emplace_back(*place_on);
      continue;
    }
    stack.push_back(s.dynamic ? build(s.arg, *s.type, &env) : s.constant);
  }
  handle_.callBoxed(stack);

  std::vector<c10::IValue> out;
  out.reserve(output_types_.size());
  for (c10::IValue& r : stack) {
    if (r.isList()) {  // Tensor[] and friends: one output per element
      for (const c10::IValue& e : r.toListRef()) out.push_back(e);
    } else {
      out.push_back(std::move(r));
    }
  }
  checkOutputs(out);
  return out;
}

void ResolvedOp::checkOutputs(const std::vector<c10::IValue>& out) const {
  if (out.size() != output_types_.size()) {
    std::string declared;
    for (const std::string& name : output_names_) declared += (declared.empty() ? "%" : ", %") + name;
    MP_RT_THROW(ExecutionError, "node ", node_ref_, " (", op_name_, ") returned ", out.size(),
                " values but the IR declares ", output_types_.size(), " outputs",
                declared.empty() ? std::string() : " (" + declared + ")");
  }
  for (size_t i = 0; i < out.size(); ++i) {
    const c10::IValue& v = out[i];
    if (v.isTensor() && !v.toTensor().defined() && output_types_[i].isTensor()) continue;
    MP_RT_CHECK(hasType(v, output_types_[i]), ExecutionError, "node ", node_ref_, " (", op_name_,
                "): output ", i, " (%", output_names_[i], ") is ", describe(v),
                " at run time but the IR says ", ir::toString(output_types_[i]));
  }
}

}  // namespace modelpar::runtime
