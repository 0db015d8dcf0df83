// IR <-> c10 type mapping and run-time type checks (see value_types.h).
#include "runtime/value_types.h"

#include <map>
#include <sstream>

#include <ATen/core/Tensor.h>

#include "ir/graph.h"
#include "runtime/check.h"

namespace modelpar::runtime {

c10::ScalarType toC10(ir::ScalarType t) {
  using S = ir::ScalarType;
  switch (t) {
    case S::Bool: return c10::ScalarType::Bool;
    case S::UInt8: return c10::ScalarType::Byte;
    case S::Int8: return c10::ScalarType::Char;
    case S::Int16: return c10::ScalarType::Short;
    case S::Int32: return c10::ScalarType::Int;
    case S::Int64: return c10::ScalarType::Long;
    case S::Float16: return c10::ScalarType::Half;
    case S::BFloat16: return c10::ScalarType::BFloat16;
    case S::Float32: return c10::ScalarType::Float;
    case S::Float64: return c10::ScalarType::Double;
    case S::Complex64: return c10::ScalarType::ComplexFloat;
    case S::Complex128: return c10::ScalarType::ComplexDouble;
    case S::Float8E4M3FN: return c10::ScalarType::Float8_e4m3fn;
    case S::Float8E5M2: return c10::ScalarType::Float8_e5m2;
  }
  MP_RT_INTERNAL_ASSERT(false, "unknown ir::ScalarType ", static_cast<int>(t));
}

c10::Layout toC10(ir::Layout l) {
  switch (l) {
    case ir::Layout::Strided: return c10::kStrided;
    case ir::Layout::SparseCoo: return c10::kSparse;
    case ir::Layout::SparseCsr: return c10::kSparseCsr;
    case ir::Layout::Mkldnn: return c10::kMkldnn;
  }
  MP_RT_INTERNAL_ASSERT(false, "unknown ir::Layout ", static_cast<int>(l));
}

c10::MemoryFormat toC10(ir::MemoryFormat m) {
  switch (m) {
    case ir::MemoryFormat::Contiguous: return c10::MemoryFormat::Contiguous;
    case ir::MemoryFormat::Preserve: return c10::MemoryFormat::Preserve;
    case ir::MemoryFormat::ChannelsLast: return c10::MemoryFormat::ChannelsLast;
    case ir::MemoryFormat::ChannelsLast3d: return c10::MemoryFormat::ChannelsLast3d;
  }
  MP_RT_INTERNAL_ASSERT(false, "unknown ir::MemoryFormat ", static_cast<int>(m));
}

std::optional<ir::ScalarType> fromC10(c10::ScalarType t) {
  for (int i = 0; i <= static_cast<int>(ir::ScalarType::Float8E5M2); ++i) {
    auto s = static_cast<ir::ScalarType>(i);
    if (toC10(s) == t) return s;
  }
  return std::nullopt;
}

std::string describe(const c10::IValue& v) {
  if (v.isTensor()) {
    const at::Tensor& t = v.toTensor();
    if (!t.defined()) return "undefined tensor";
    std::ostringstream os;
    std::optional<ir::ScalarType> s = fromC10(t.scalar_type());
    if (s) {
      os << ir::name(*s);
    } else {
      os << c10::toString(t.scalar_type());
    }
    os << '[';
    for (int64_t d = 0; d < t.dim(); ++d) os << (d ? ", " : "") << t.size(d);
    os << ']';
    return os.str();
  }
  if (v.isInt()) return "int";
  if (v.isDouble()) return "float";
  if (v.isBool()) return "bool";
  if (v.isNone()) return "None";
  return v.tagKind();
}

bool hasType(const c10::IValue& v, const ir::Type& t) {
  switch (t.kind) {
    case ir::Type::Kind::Int: return v.isInt();
    case ir::Type::Kind::Float: return v.isDouble();
    case ir::Type::Kind::Bool: return v.isBool();
    case ir::Type::Kind::Tensor: break;
  }
  if (!v.isTensor()) return false;
  const at::Tensor& x = v.toTensor();
  if (!x.defined() || x.scalar_type() != toC10(t.dtype)) return false;
  if (x.dim() != static_cast<int64_t>(t.shape.size())) return false;
  for (size_t d = 0; d < t.shape.size(); ++d) {
    if (t.shape[d].isStatic() && t.shape[d].size != x.size(static_cast<int64_t>(d))) return false;
  }
  return true;
}

void checkGraphInputs(const ir::Graph& g, std::vector<c10::IValue>& inputs) {
  const auto& decl = g.inputs();
  if (inputs.size() != decl.size()) {
    std::string names;
    for (const ir::Input& in : decl) names += (names.empty() ? "%" : ", %") + g.value(in.value).name;
    MP_RT_THROW(ExecutionError, "graph @", g.name(), " takes ", decl.size(), " inputs (", names,
                "), got ", inputs.size());
  }
  // Symbolic size -> (size, index of the input that bound it).
  std::map<std::string, std::pair<int64_t, size_t>> symbols;
  for (size_t i = 0; i < decl.size(); ++i) {
    const ir::Value& val = g.value(decl[i].value);
    c10::IValue& in = inputs[i];
    if (val.type.kind == ir::Type::Kind::Float && in.isInt()) in = static_cast<double>(in.toInt());
    MP_RT_CHECK(hasType(in, val.type), ExecutionError, "graph @", g.name(), " input ", i, " (%",
                val.name, "): expected ", ir::toString(val.type), ", got ", describe(in));
    if (!val.type.isTensor()) continue;
    const at::Tensor& t = in.toTensor();
    for (size_t d = 0; d < val.type.shape.size(); ++d) {
      const ir::Dim& dim = val.type.shape[d];
      if (dim.isStatic()) continue;
      int64_t size = t.size(static_cast<int64_t>(d));
      auto [it, fresh] = symbols.try_emplace(dim.symbol, size, i);
      MP_RT_CHECK(fresh || it->second.first == size, ExecutionError, "graph @", g.name(), " input ",
                  i, " (%", val.name, "): dim ", d, " is ", size, " but symbolic size ", dim.symbol,
                  " is ", it->second.first, " in input ", it->second.second, " (%",
                  g.value(decl[it->second.second].value).name, ")");
    }
  }
}

}  // namespace modelpar::runtime
