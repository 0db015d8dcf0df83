// Element types, enums and value types of the IR. Names follow the text
// format (`f32`, `bf16`, `i64`, ...); runtime/ maps them to c10 by name.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

namespace modelpar::ir {

/// Tensor element type. Text names: bool u8 i8 i16 i32 i64 f16 bf16 f32 f64
/// c64 c128 f8e4m3fn f8e5m2.
enum class ScalarType : uint8_t {
  Bool, UInt8, Int8, Int16, Int32, Int64, Float16, BFloat16, Float32, Float64,
  Complex64, Complex128, Float8E4M3FN, Float8E5M2,
};

/// Tensor layout constant (`layout.strided`, ...).
enum class Layout : uint8_t { Strided, SparseCoo, SparseCsr, Mkldnn };

/// Memory format constant (`memory_format.channels_last`, ...).
enum class MemoryFormat : uint8_t {
  Contiguous, Preserve, ChannelsLast, ChannelsLast3d,
};

std::string_view name(ScalarType t);
std::string_view name(Layout l);
std::string_view name(MemoryFormat m);
std::optional<ScalarType> parseScalarType(std::string_view s);
std::optional<Layout> parseLayout(std::string_view s);
std::optional<MemoryFormat> parseMemoryFormat(std::string_view s);
/// Bytes per element (1 for bool and the 8-bit types).
int64_t elementSize(ScalarType t);

/// One dimension of a shape: a static size, or a named symbolic size whose
/// value is only known at run time (`size` is then -1).
struct Dim {
  int64_t size = 0;
  std::string symbol;  // empty for a static dimension

  static Dim fixed(int64_t n) { return Dim{n, {}}; }
  static Dim symbolic(std::string s) { return Dim{-1, std::move(s)}; }
  bool isStatic() const { return symbol.empty(); }
  bool operator==(const Dim&) const = default;
};

/// The type of an SSA value: a tensor (dtype + shape) or a scalar.
/// Text: `f32[8, 16]`, `f32[]` (0-d), `i64[B, 128]` (symbolic B), `int`,
/// `float`, `bool`.
struct Type {
  enum class Kind : uint8_t { Tensor, Int, Float, Bool };
  Kind kind = Kind::Tensor;
  ScalarType dtype = ScalarType::Float32;  // tensors only
  std::vector<Dim> shape;                  // tensors only

  static Type tensor(ScalarType dtype, std::vector<Dim> shape) {
    return Type{Kind::Tensor, dtype, std::move(shape)};
  }
  static Type tensor(ScalarType dtype, const std::vector<int64_t>& sizes);
  static Type scalar(Kind k) { return Type{k, ScalarType::Float32, {}}; }

  bool isTensor() const { return kind == Kind::Tensor; }
  bool hasStaticShape() const;
  /// Element count; nullopt when a dimension is symbolic.
  std::optional<int64_t> numel() const;
  /// Bytes of a dense tensor of this type; nullopt when symbolic. Scalars: 8.
  std::optional<int64_t> bytes() const;
  bool operator==(const Type&) const = default;
};

/// Text form of a type, as the printer writes it.
std::string toString(const Type& t);

}  // namespace modelpar::ir
