// An argument of an IR node: a reference to an SSA value, a typed constant,
// or a list of arguments (int lists, tensor lists, optional-tensor lists).
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "ir/types.h"

namespace modelpar::ir {

/// Index of a value in its Graph.
using ValueId = int32_t;
/// Index of a node in its Graph.
using NodeId = int32_t;
inline constexpr int32_t kNoId = -1;

/// A node argument. Text forms:
///   %x  None  true  false  3  -1  2.5  1e-05  inf  -inf  nan  "str"
///   dtype.f32  layout.strided  memory_format.channels_last  device("cuda:0")
///   [1, 2]  [%a, %b]  [None, %idx]
/// An argument may carry a keyword (`keepdim=true`): it is then matched to
/// the schema argument of that name instead of by position.
class Arg {
 public:
  enum class Kind : uint8_t {
    None, Bool, Int, Float, String, Dtype, Layout, MemoryFormat, Device, Value, List,
  };

  Arg() = default;  // None
  static Arg none() { return Arg(); }
  static Arg boolean(bool b) { Arg a(Kind::Bool); a.int_ = b; return a; }
  static Arg integer(int64_t i) { Arg a(Kind::Int); a.int_ = i; return a; }
  static Arg floating(double f) { Arg a(Kind::Float); a.float_ = f; return a; }
  static Arg string(std::string s) { Arg a(Kind::String); a.str_ = std::move(s); return a; }
  static Arg dtype(ScalarType t) { Arg a(Kind::Dtype); a.int_ = static_cast<int64_t>(t); return a; }
  static Arg layout(Layout l) { Arg a(Kind::Layout); a.int_ = static_cast<int64_t>(l); return a; }
  static Arg memoryFormat(MemoryFormat m) { Arg a(Kind::MemoryFormat); a.int_ = static_cast<int64_t>(m); return a; }
  static Arg device(std::string d) { Arg a(Kind::Device); a.str_ = std::move(d); return a; }
  static Arg value(ValueId v) { Arg a(Kind::Value); a.int_ = v; return a; }
  static Arg list(std::vector<Arg> items) { Arg a(Kind::List); a.list_ = std::move(items); return a; }

  Kind kind() const { return kind_; }
  bool isNone() const { return kind_ == Kind::None; }
  bool isValue() const { return kind_ == Kind::Value; }
  bool isList() const { return kind_ == Kind::List; }

  bool toBool() const { return int_ != 0; }
  int64_t toInt() const { return int_; }
  double toDouble() const { return float_; }
  const std::string& toStringRef() const { return str_; }  // String and Device
  ScalarType toDtype() const { return static_cast<ScalarType>(int_); }
  Layout toLayout() const { return static_cast<Layout>(int_); }
  MemoryFormat toMemoryFormat() const { return static_cast<MemoryFormat>(int_); }
  ValueId toValue() const { return static_cast<ValueId>(int_); }
  const std::vector<Arg>& items() const { return list_; }
  std::vector<Arg>& items() { return list_; }

  /// Keyword of a keyword argument; empty for a positional one.
  const std::string& keyword() const { return keyword_; }
  Arg& withKeyword(std::string k) { keyword_ = std::move(k); return *this; }

  /// Calls f(ValueId) for every value referenced here, lists included.
  template <typename F>
  void forEachValue(F&& f) const {
    if (kind_ == Kind::Value) f(toValue());
    for (const Arg& a : list_) a.forEachValue(f);
  }
  /// Rewrites every referenced value id through f (used when cloning graphs).
  template <typename F>
  void remapValues(F&& f) {
    if (kind_ == Kind::Value) int_ = f(toValue());
    for (Arg& a : list_) a.remapValues(f);
  }

  /// Exact equality. Floats compare bitwise so that NaN == NaN (round trips).
  bool operator==(const Arg& o) const;

 private:
  explicit Arg(Kind k) : kind_(k) {}
  Kind kind_ = Kind::None;
  int64_t int_ = 0;
  double float_ = 0.0;
  std::string str_;
  std::vector<Arg> list_;
  std::string keyword_;
};

}  // namespace modelpar::ir
