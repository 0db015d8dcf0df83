// Json: recursive-descent reader (RFC 8259, no extensions) and writer.
#include "passes/json.h"

#include <charconv>
#include <cmath>

#include "ir/check.h"

namespace modelpar::passes {
namespace {

constexpr int kMaxDepth = 256;

class Reader {
 public:
  explicit Reader(std::string_view text) : s_(text) {}

  Json document() {
    Json j = value(0);
    skipSpace();
    if (pos_ != s_.size()) fail("unexpected text after the document");
    return j;
  }

 private:
  [[noreturn]] void fail(std::string_view what) const {
    int line = 1, col = 1;
    for (size_t i = 0; i < pos_ && i < s_.size(); ++i) {
      if (s_[i] == '\n') { ++line; col = 1; } else { ++col; }
    }
    MP_THROW(ConfigError, "modelpar json: {}:{}: {}", line, col, what);
  }

  void skipSpace() {
    while (pos_ < s_.size() &&
           (s_[pos_] == ' ' || s_[pos_] == '\t' || s_[pos_] == '\n' || s_[pos_] == '\r')) {
      ++pos_;
    }
  }

  bool consume(std::string_view word) {
    if (s_.substr(pos_, word.size()) != word) return false;
    pos_ += word.size();
    return true;
  }

  Json value(int depth) {
    if (depth > kMaxDepth) fail("nesting is too deep");
    skipSpace();
    if (pos_ >= s_.size()) fail("expected a value, found end of input");
    char c = s_[pos_];
    if (c == '{') return object(depth);
    if (c == '[') return array(depth);
    if (c == '"') return Json(string());
    if (consume("true")) return Json(true);
    if (consume("false")) return Json(false);
    if (consume("null")) return Json();
    if (c == '-' || (c >= '0' && c <= '9')) return number();
    fail(std::string("expected a value, found '") + c + "'");
  }

  Json object(int depth) {
    ++pos_;  // '{'
    Json j = Json::object();
    skipSpace();
    if (pos_ < s_.size() && s_[pos_] == '}') { ++pos_; return j; }
    while (true) {
      skipSpace();
      if (pos_ >= s_.size() || s_[pos_] != '"') fail("expected a member name in quotes");
      std::string key = string();
      if (j.find(key)) fail("member \"" + key + "\" appears twice");
      skipSpace();
      if (!consume(":")) fail("expected ':' after a member name");
      j.set(std::move(key), value(depth + 1));
      skipSpace();
      if (consume(",")) continue;
      if (consume("}")) return j;
      fail("expected ',' or '}' in an object");
    }
  }

  Json array(int depth) {
    ++pos_;  // '['
    Json j = Json::array();
    skipSpace();
    if (pos_ < s_.size() && s_[pos_] == ']') { ++pos_; return j; }
    while (true) {
      j.push(value(depth + 1));
      skipSpace();
      if (consume(",")) continue;
      if (consume("]")) return j;
      fail("expected ',' or ']' in an array");
    }
  }

  Json number() {
    size_t start = pos_;
    if (s_[pos_] == '-') ++pos_;
    auto digits = [&] {
      size_t d = pos_;
      while (pos_ < s_.size() && s_[pos_] >= '0' && s_[pos_] <= '9') ++pos_;
      return pos_ - d;
    };
    if (digits() == 0) fail("expected digits in a number");
    if (pos_ < s_.size() && s_[pos_] == '.') {
      ++pos_;
      if (digits() == 0) fail("expected digits after '.'");
    }
    if (pos_ < s_.size() && (s_[pos_] == 'e' || s_[pos_] == 'E')) {
      ++pos_;
      if (pos_ < s_.size() && (s_[pos_] == '+' || s_[pos_] == '-')) ++pos_;
      if (digits() == 0) fail("expected digits in an exponent");
    }
    double d = 0.0;
    auto [end, ec] = std::from_chars(s_.data() + start, s_.data() + pos_, d);
    if (ec != std::errc() || end != s_.data() + pos_) fail("number out of range");
    return Json(d);
  }

  static void appendUtf8(std::string& out, uint32_t cp) {
    if (cp < 0x80) {
      out += static_cast<char>(cp);
    } else if (cp < 0x800) {
      out += static_cast<char>(0xC0 | (cp >> 6));
      out += static_cast<char>(0x80 | (cp & 0x3F));
    } else if (cp < 0x10000) {
      out += static_cast<char>(0xE0 | (cp >> 12));
      out += static_cast<char>(0x80 | ((cp >> 6) & 0x3F));
      out += static_cast<char>(0x80 | (cp & 0x3F));
    } else {
      out += static_cast<char>(0xF0 | (cp >> 18));
      out += static_cast<char>(0x80 | ((cp >> 12) & 0x3F));
      out += static_cast<char>(0x80 | ((cp >> 6) & 0x3F));
      out += static_cast<char>(0x80 | (cp & 0x3F));
    }
  }

  uint32_t hex4() {
    if (pos_ + 4 > s_.size()) fail("expected four hex digits after \\u");
    uint32_t v = 0;
    for (int i = 0; i < 4; ++i) {
      char c = s_[pos_++];
      v <<= 4;
      if (c >= '0' && c <= '9') v |= static_cast<uint32_t>(c - '0');
      else if (c >= 'a' && c <= 'f') v |= static_cast<uint32_t>(c - 'a' + 10);
      else if (c >= 'A' && c <= 'F') v |= static_cast<uint32_t>(c - 'A' + 10);
      else fail("expected a hex digit after \\u");
    }
    return v;
  }

  std::string string() {
    ++pos_;  // '"'
    std::string out;
    while (true) {
      if (pos_ >= s_.size()) fail("unterminated string");
      char c = s_[pos_++];
      if (c == '"') return out;
      if (static_cast<unsigned char>(c) < 0x20) fail("control character in a string");
      if (c != '\\') { out += c; continue; }
      if (pos_ >= s_.size()) fail("unterminated escape");
      char e = s_[pos_++];
      switch (e) {
        case '"': out += '"'; break;
        case '\\': out += '\\'; break;
        case '/': out += '/'; break;
        case 'b': out += '\b'; break;
        case 'f': out += '\f'; break;
        case 'n': out += '\n'; break;
        case 'r': out += '\r'; break;
        case 't': out += '\t'; break;
        case 'u': {
          uint32_t cp = hex4();
          if (cp >= 0xD800 && cp < 0xDC00) {  // a surrogate pair
            if (!consume("\\u")) fail("expected the low half of a surrogate pair");
            uint32_t lo = hex4();
            if (lo < 0xDC00 || lo >= 0xE000) fail("bad low half of a surrogate pair");
            cp = 0x10000 + ((cp - 0xD800) << 10) + (lo - 0xDC00);
          }
          appendUtf8(out, cp);
          break;
        }
        default: fail(std::string("unknown escape \\") + e);
      }
    }
  }

  std::string_view s_;
  size_t pos_ = 0;
};

std::string_view kindName(Json::Kind k) {
  switch (k) {
    case Json::Kind::Null: return "null";
    case Json::Kind::Bool: return "a boolean";
    case Json::Kind::Number: return "a number";
    case Json::Kind::String: return "a string";
    case Json::Kind::Array: return "an array";
    case Json::Kind::Object: return "an object";
  }
  return "?";
}

void appendNumber(std::string& out, double d) {
  MP_CHECK(std::isfinite(d), ConfigError, "modelpar json: cannot write the number {}", d);
  char buf[32];
  // Shortest representation that reads back to the same double.
  auto [end, ec] = std::to_chars(buf, buf + sizeof buf, d);
  MP_INTERNAL_ASSERT(ec == std::errc(), "to_chars failed");
  out.append(buf, end);
}

}  // namespace

void appendJsonString(std::string& out, std::string_view s) {
  out += '"';
  for (char c : s) {
    switch (c) {
      case '"': out += "\\\""; break;
      case '\\': out += "\\\\"; break;
      case '\n': out += "\\n"; break;
      case '\r': out += "\\r"; break;
      case '\t': out += "\\t"; break;
      default:
        if (static_cast<unsigned char>(c) < 0x20) {
          out += fmt::format("\\u{:04x}", static_cast<unsigned>(c));
        } else {
          out += c;
        }
    }
  }
  out += '"';
}

Json Json::parse(std::string_view text) { return Reader(text).document(); }

std::string Json::dump(int indent) const {
  std::string out;
  dumpTo(out, indent, 0);
  return out;
}

void Json::dumpTo(std::string& out, int indent, int depth) const {
  auto newline = [&](int d) {
    if (indent < 0) return;
    out += '\n';
    out.append(static_cast<size_t>(indent * d), ' ');
  };
  switch (kind_) {
    case Kind::Null: out += "null"; return;
    case Kind::Bool: out += bool_ ? "true" : "false"; return;
    case Kind::Number: appendNumber(out, number_); return;
    case Kind::String: appendJsonString(out, string_); return;
    case Kind::Array: {
      out += '[';
      for (size_t i = 0; i < items_.size(); ++i) {
        if (i) out += ',';
        newline(depth + 1);
        items_[i].dumpTo(out, indent, depth + 1);
      }
      if (!items_.empty()) newline(depth);
      out += ']';
      return;
    }
    case Kind::Object: {
      out += '{';
      bool first = true;
      for (const auto& [k, v] : members_) {
        if (!first) out += ',';
        first = false;
        newline(depth + 1);
        appendJsonString(out, k);
        out += indent < 0 ? ":" : ": ";
        v.dumpTo(out, indent, depth + 1);
      }
      if (!members_.empty()) newline(depth);
      out += '}';
      return;
    }
  }
}

bool Json::boolean(std::string_view what) const {
  MP_CHECK(kind_ == Kind::Bool, ConfigError, "modelpar json: {} must be a boolean, found {}",
           what, kindName(kind_));
  return bool_;
}

double Json::number(std::string_view what) const {
  MP_CHECK(kind_ == Kind::Number, ConfigError, "modelpar json: {} must be a number, found {}",
           what, kindName(kind_));
  return number_;
}

int64_t Json::integer(std::string_view what) const {
  double d = number(what);
  MP_CHECK(std::trunc(d) == d && std::fabs(d) <= 9007199254740992.0, ConfigError,
           "modelpar json: {} must be an integer, found {}", what, d);
  return static_cast<int64_t>(d);
}

const std::string& Json::string(std::string_view what) const {
  MP_CHECK(kind_ == Kind::String, ConfigError, "modelpar json: {} must be a string, found {}",
           what, kindName(kind_));
  return string_;
}

const std::vector<Json>& Json::items(std::string_view what) const {
  MP_CHECK(kind_ == Kind::Array, ConfigError, "modelpar json: {} must be an array, found {}",
           what, kindName(kind_));
  return items_;
}

const std::map<std::string, Json, std::less<>>& Json::members(std::string_view what) const {
  MP_CHECK(kind_ == Kind::Object, ConfigError, "modelpar json: {} must be an object, found {}",
           what, kindName(kind_));
  return members_;
}

const Json& Json::at(std::string_view key) const {
  const Json* j = find(key);
  MP_CHECK(j != nullptr, ConfigError, "modelpar json: missing member \"{}\"", key);
  return *j;
}

const Json* Json::find(std::string_view key) const {
  if (kind_ != Kind::Object) return nullptr;
  auto it = members_.find(key);
  return it == members_.end() ? nullptr : &it->second;
}

void Json::set(std::string key, Json value) {
  MP_INTERNAL_ASSERT(kind_ == Kind::Object, "Json::set on {}", kindName(kind_));
  members_.insert_or_assign(std::move(key), std::move(value));
}

void Json::push(Json value) {
  MP_INTERNAL_ASSERT(kind_ == Kind::Array, "Json::push on {}", kindName(kind_));
  items_.push_back(std::move(value));
}

}  // namespace modelpar::passes
