// Tokenizer of the IR text format with line/column tracking, and the token
// cursor whose errors carry those positions.
#include "ir/lexer.h"

#include <fmt/format.h>

#include <charconv>

#include "ir/error.h"

namespace modelpar::ir {
namespace {

bool isNameStart(char c) {
  return (c >= 'A' && c <= 'Z') || (c >= 'a' && c <= 'z') || c == '_';
}
bool isDigit(char c) { return c >= '0' && c <= '9'; }
bool isNameChar(char c) { return isNameStart(c) || isDigit(c); }
// Characters of a value or label name after the sigil: [A-Za-z0-9_.]
bool isRefChar(char c) { return isNameChar(c) || c == '.'; }
int hexDigit(char c) {
  if (isDigit(c)) return c - '0';
  if (c >= 'a' && c <= 'f') return c - 'a' + 10;
  if (c >= 'A' && c <= 'F') return c - 'A' + 10;
  return -1;
}

class Lexer {
 public:
  explicit Lexer(std::string_view text) : text_(text) {}

  std::vector<Token> run() {
    std::vector<Token> out;
    for (;;) {
      skipSpaceAndComments();
      Token t;
      t.line = line_;
      t.column = column_;
      size_t start = pos_;
      if (pos_ >= text_.size()) {
        out.push_back(std::move(t));
        return out;
      }
      lexOne(t);
      t.source = text_.substr(start, pos_ - start);
      out.push_back(std::move(t));
    }
  }

 private:
  char at(size_t i) const { return pos_ + i < text_.size() ? text_[pos_ + i] : '\0'; }
  void advance(size_t n = 1) {
    for (size_t i = 0; i < n && pos_ < text_.size(); ++i, ++pos_) {
      if (text_[pos_] == '\n') {
        ++line_;
        column_ = 1;
      } else {
        ++column_;
      }
    }
  }
  [[noreturn]] void failHere(const std::string& message) const {
    Token t;
    t.line = line_;
    t.column = column_;
    TokenCursor::fail(t, message);
  }

  void skipSpaceAndComments() {
    for (;;) {
      char c = at(0);
      if (c == ' ' || c == '\t' || c == '\n' || c == '\r') {
        advance();
      } else if (c == '/' && at(1) == '/') {
        while (pos_ < text_.size() && text_[pos_] != '\n') advance();
      } else {
        return;
      }
    }
  }

  void lexOne(Token& t) {
    char c = at(0);
    if (isNameStart(c)) {
      t.kind = Token::Kind::Name;
      size_t n = 0;
      while (isNameChar(at(n))) ++n;
      t.text = std::string(text_.substr(pos_, n));
      advance(n);
    } else if (c == '%' || c == '^') {
      t.kind = c == '%' ? Token::Kind::Value : Token::Kind::Label;
      size_t n = 1;
      while (isRefChar(at(n))) ++n;
      if (n == 1) failHere(fmt::format("expected a name after '{}'", c));
      t.text = std::string(text_.substr(pos_ + 1, n - 1));
      advance(n);
    } else if (isDigit(c) || (c == '-' && isDigit(at(1)))) {
      lexNumber(t);
    } else if (c == '-' && at(1) == 'i' && at(2) == 'n' && at(3) == 'f' && !isNameChar(at(4))) {
      t.kind = Token::Kind::Float;
      t.text = "-inf";
      advance(4);
    } else if (c == '"') {
      lexString(t);
    } else if ((c == ':' && at(1) == ':') || (c == '-' && at(1) == '>') ||
               (c == '<' && at(1) == '-')) {
      t.kind = Token::Kind::Punct;
      t.text = std::string(text_.substr(pos_, 2));
      advance(2);
    } else if (std::string_view("()[]{},:=@.").find(c) != std::string_view::npos) {
      t.kind = Token::Kind::Punct;
      t.text = std::string(1, c);
      advance();
    } else {
      bool printable = static_cast<unsigned char>(c) >= 0x20 && static_cast<unsigned char>(c) < 0x7f;
      failHere(printable ? fmt::format("unexpected character '{}'", c)
                         : fmt::format("unexpected byte 0x{:02x}", static_cast<unsigned char>(c)));
    }
  }

  void lexNumber(Token& t) {
    size_t n = c0IsMinus() ? 1 : 0;
    while (isDigit(at(n))) ++n;
    bool is_float = false;
    if (at(n) == '.' && isDigit(at(n + 1))) {
      is_float = true;
      ++n;
      while (isDigit(at(n))) ++n;
    }
    if (at(n) == 'e' || at(n) == 'E') {
      size_t m = n + 1;
      if (at(m) == '+' || at(m) == '-') ++m;
      if (isDigit(at(m))) {
        is_float = true;
        while (isDigit(at(m))) ++m;
        n = m;
      }
    }
    t.kind = is_float ? Token::Kind::Float : Token::Kind::Int;
    t.text = std::string(text_.substr(pos_, n));
    advance(n);
  }
  bool c0IsMinus() const { return at(0) == '-'; }

  void lexString(Token& t) {
    int line = line_;
    int column = column_;
    auto unterminated = [&] {
      Token s;
      s.line = line;
      s.column = column;
      TokenCursor::fail(s, "unterminated string (strings end with '\"' on the line they start)");
    };
    t.kind = Token::Kind::String;
    advance();  // opening quote
    for (;;) {
      char c = at(0);
      if (pos_ >= text_.size() || c == '\n') unterminated();
      if (c == '"') {
        advance();
        return;
      }
      if (c != '\\') {
        t.text += c;
        advance();
        continue;
      }
      char e = at(1);
      if (e == '"' || e == '\\') {
        t.text += e;
      } else if (e == 'n') {
        t.text += '\n';
      } else if (e == 't') {
        t.text += '\t';
      } else if (e == 'x' && hexDigit(at(2)) >= 0 && hexDigit(at(3)) >= 0) {
        t.text += static_cast<char>(hexDigit(at(2)) * 16 + hexDigit(at(3)));
        advance(2);
      } else if (pos_ + 1 >= text_.size() || e == '\n') {
        unterminated();
      } else {
        failHere(fmt::format("bad escape in string (known: \\\" \\\\ \\n \\t \\xHH)"));
      }
      advance(2);
    }
  }

  std::string_view text_;
  size_t pos_ = 0;
  int line_ = 1;
  int column_ = 1;
};

}  // namespace

std::vector<Token> tokenize(std::string_view text) { return Lexer(text).run(); }

const Token& TokenCursor::peek(size_t ahead) const {
  size_t i = pos_ + ahead;
  return i < tokens_.size() ? tokens_[i] : tokens_.back();
}

const Token& TokenCursor::next() {
  const Token& t = peek();
  if (pos_ + 1 < tokens_.size()) ++pos_;
  return t;
}

bool TokenCursor::acceptPunct(std::string_view p) {
  if (!peek().isPunct(p)) return false;
  next();
  return true;
}

const Token& TokenCursor::expectPunct(std::string_view p) {
  if (!peek().isPunct(p)) failExpected(fmt::format("'{}'", p));
  return next();
}

const Token& TokenCursor::expectName(std::string_view n) {
  if (!peek().isName(n)) failExpected(fmt::format("'{}'", n));
  return next();
}

const Token& TokenCursor::expect(Token::Kind k, std::string_view what) {
  if (peek().kind != k) failExpected(what);
  return next();
}

int64_t TokenCursor::expectInt(std::string_view what, int64_t lo, int64_t hi) {
  const Token& t = expect(Token::Kind::Int, what);
  int64_t v = 0;
  auto [end, ec] = std::from_chars(t.text.data(), t.text.data() + t.text.size(), v);
  if (ec != std::errc() || v < lo || v > hi) {
    fail(t, fmt::format("{} {} is out of range ({}..{})", what, t.text, lo, hi));
  }
  return v;
}

void TokenCursor::fail(const Token& at, const std::string& message) {
  throw ParseError(fmt::format("modelpar ir parse: {}:{}: {}", at.line, at.column, message),
                   at.line, at.column, __FILE__, __LINE__);
}

void TokenCursor::failExpected(std::string_view what) const {
  fail(peek(), fmt::format("expected {}, found {}", what, describe(peek())));
}

std::string TokenCursor::describe(const Token& t) {
  if (t.kind == Token::Kind::End) return "end of input";
  std::string_view s = t.source;
  if (s.size() > 32) return fmt::format("'{}...'", s.substr(0, 32));
  return fmt::format("'{}'", s);
}

}  // namespace modelpar::ir
