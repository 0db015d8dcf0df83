// A small JSON value with a strict reader and a deterministic writer, for the
// machine profiles and reports passes/ saves (no third-party dependency).
#pragma once

#include <cstdint>
#include <map>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

namespace modelpar::passes {

/// A JSON document node. Objects keep their keys sorted, so writing is
/// deterministic; numbers are doubles (integers up to 2^53 round-trip).
///
/// Example:
///   Json j = Json::object();
///   j.set("latency_us", Json(12.5));
///   std::string text = j.dump();          // {"latency_us":12.5}
///   Json back = Json::parse(text);        // back.at("latency_us").number() == 12.5
class Json {
 public:
  enum class Kind : uint8_t { Null, Bool, Number, String, Array, Object };

  Json() = default;  // null
  explicit Json(bool b) : kind_(Kind::Bool), bool_(b) {}
  explicit Json(double d) : kind_(Kind::Number), number_(d) {}
  explicit Json(int64_t i) : kind_(Kind::Number), number_(static_cast<double>(i)) {}
  explicit Json(int i) : kind_(Kind::Number), number_(i) {}
  explicit Json(std::string s) : kind_(Kind::String), string_(std::move(s)) {}
  explicit Json(const char* s) : kind_(Kind::String), string_(s) {}
  static Json array() { Json j; j.kind_ = Kind::Array; return j; }
  static Json object() { Json j; j.kind_ = Kind::Object; return j; }

  /// Parses a whole document. Throws ConfigError `json: line:col: ...`.
  static Json parse(std::string_view text);
  /// Compact text when indent < 0, else pretty-printed with `indent` spaces.
  std::string dump(int indent = -1) const;

  Kind kind() const { return kind_; }
  bool isNull() const { return kind_ == Kind::Null; }
  bool isNumber() const { return kind_ == Kind::Number; }
  bool isString() const { return kind_ == Kind::String; }
  bool isArray() const { return kind_ == Kind::Array; }
  bool isObject() const { return kind_ == Kind::Object; }

  /// Typed accessors; each throws ConfigError naming `what` on a kind mismatch.
  bool boolean(std::string_view what = "value") const;
  double number(std::string_view what = "value") const;
  /// The number as an integer; throws unless it is integral.
  int64_t integer(std::string_view what = "value") const;
  const std::string& string(std::string_view what = "value") const;
  const std::vector<Json>& items(std::string_view what = "value") const;
  const std::map<std::string, Json, std::less<>>& members(std::string_view what = "value") const;

  /// Object member; throws ConfigError if absent.
  const Json& at(std::string_view key) const;
  /// Object member or nullptr.
  const Json* find(std::string_view key) const;
  void set(std::string key, Json value);
  void push(Json value);

  bool operator==(const Json&) const = default;

 private:
  void dumpTo(std::string& out, int indent, int depth) const;

  Kind kind_ = Kind::Null;
  bool bool_ = false;
  double number_ = 0.0;
  std::string string_;
  std::vector<Json> items_;
  std::map<std::string, Json, std::less<>> members_;
};

/// Appends `s` as a JSON string literal (quoted, escaped) to `out`.
void appendJsonString(std::string& out, std::string_view s);

}  // namespace modelpar::passes
