// Names and sizes of the IR's element types and enums.
#include "ir/types.h"

#include <array>
#include <utility>

namespace modelpar::ir {
namespace {

constexpr std::array<std::pair<ScalarType, std::string_view>, 14> kScalarNames = {{
    {ScalarType::Bool, "bool"},        {ScalarType::UInt8, "u8"},
    {ScalarType::Int8, "i8"},          {ScalarType::Int16, "i16"},
    {ScalarType::Int32, "i32"},        {ScalarType::Int64, "i64"},
    {ScalarType::Float16, "f16"},      {ScalarType::BFloat16, "bf16"},
    {ScalarType::Float32, "f32"},      {ScalarType::Float64, "f64"},
    {ScalarType::Complex64, "c64"},    {ScalarType::Complex128, "c128"},
    {ScalarType::Float8E4M3FN, "f8e4m3fn"}, {ScalarType::Float8E5M2, "f8e5m2"},
}};

constexpr std::array<std::pair<Layout, std::string_view>, 4> kLayoutNames = {{
    {Layout::Strided, "strided"},
    {Layout::SparseCoo, "sparse_coo"},
    {Layout::SparseCsr, "sparse_csr"},
    {Layout::Mkldnn, "mkldnn"},
}};

constexpr std::array<std::pair<MemoryFormat, std::string_view>, 4> kFormatNames = {{
    {MemoryFormat::Contiguous, "contiguous_format"},
    {MemoryFormat::Preserve, "preserve_format"},
    {MemoryFormat::ChannelsLast, "channels_last"},
    {MemoryFormat::ChannelsLast3d, "channels_last_3d"},
}};

template <typename E, size_t N>
std::string_view lookupName(const std::array<std::pair<E, std::string_view>, N>& table, E e) {
  for (const auto& [k, v] : table) {
    if (k == e) return v;
  }
  return "?";
}

template <typename E, size_t N>
std::optional<E> lookupValue(const std::array<std::pair<E, std::string_view>, N>& table,
                             std::string_view s) {
  for (const auto& [k, v] : table) {
    if (v == s) return k;
  }
  return std::nullopt;
}

}  // namespace

std::string_view name(ScalarType t) { return lookupName(kScalarNames, t); }
std::string_view name(Layout l) { return lookupName(kLayoutNames, l); }
std::string_view name(MemoryFormat m) { return lookupName(kFormatNames, m); }
std::optional<ScalarType> parseScalarType(std::string_view s) { return lookupValue(kScalarNames, s); }
std::optional<Layout> parseLayout(std::string_view s) { return lookupValue(kLayoutNames, s); }
std::optional<MemoryFormat> parseMemoryFormat(std::string_view s) { return lookupValue(kFormatNames, s); }

int64_t elementSize(ScalarType t) {
  switch (t) {
    case ScalarType::Bool:
    case ScalarType::UInt8:
    case ScalarType::Int8:
    case ScalarType::Float8E4M3FN:
    case ScalarType::Float8E5M2:
      return 1;
    case ScalarType::Int16:
    case ScalarType::Float16:
    case ScalarType::BFloat16:
      return 2;
    case ScalarType::Int32:
    case ScalarType::Float32:
      return 4;
    case ScalarType::Int64:
    case ScalarType::Float64:
    case ScalarType::Complex64:
      return 8;
    case ScalarType::Complex128:
      return 16;
  }
  return 0;
}

Type Type::tensor(ScalarType dtype, const std::vector<int64_t>& sizes) {
  std::vector<Dim> dims;
  dims.reserve(sizes.size());
  for (int64_t s : sizes) dims.push_back(Dim::fixed(s));
  return Type{Kind::Tensor, dtype, std::move(dims)};
}

bool Type::hasStaticShape() const {
  for (const Dim& d : shape) {
    if (!d.isStatic()) return false;
  }
  return true;
}

std::optional<int64_t> Type::numel() const {
  if (!isTensor()) return 1;
  int64_t n = 1;
  for (const Dim& d : shape) {
    if (!d.isStatic()) return std::nullopt;
    n *= d.size;
  }
  return n;
}

std::optional<int64_t> Type::bytes() const {
  if (!isTensor()) return 8;
  auto n = numel();
  if (!n) return std::nullopt;
  return *n * elementSize(dtype);
}

std::string toString(const Type& t) {
  switch (t.kind) {
    case Type::Kind::Int:
      return "int";
    case Type::Kind::Float:
      return "float";
    case Type::Kind::Bool:
      return "bool";
    case Type::Kind::Tensor:
      break;
  }
  std::string s(name(t.dtype));
  s += '[';
  for (size_t i = 0; i < t.shape.size(); ++i) {
    if (i) s += ", ";
    s += t.shape[i].isStatic() ? std::to_string(t.shape[i].size) : t.shape[i].symbol;
  }
  s += ']';
  return s;
}

}  // namespace modelpar::ir
