// Tokenizer of the IR text format (grammar in ir/README.md) and the token
// cursor the parser reads through. Internal to ir/: not part of the facade.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

namespace modelpar::ir {

/// One token with the 1-based line and column (in bytes) of its first char.
struct Token {
  enum class Kind : uint8_t {
    Name,    // [A-Za-z_][A-Za-z0-9_]*, including keywords and `inf`/`nan`
    Value,   // %name    (text holds the name without '%')
    Label,   // ^name    (text holds the name without '^')
    Int,     // -?[0-9]+
    Float,   // decimal with '.' or exponent, or `-inf`
    String,  // text holds the unescaped contents
    Punct,   // ( ) [ ] { } , : = @ . :: -> <-
    End,
  };
  Kind kind = Kind::End;
  std::string text;
  std::string_view source;  // the token as written, for messages
  int line = 1;
  int column = 1;

  bool is(Kind k, std::string_view t) const { return kind == k && text == t; }
  bool isPunct(std::string_view p) const { return is(Kind::Punct, p); }
  bool isName(std::string_view n) const { return is(Kind::Name, n); }
};

/// Splits `text` into tokens ending with one End token. Skips whitespace and
/// `//` comments. Throws ParseError on a character no token starts with, an
/// unterminated string or a bad escape.
std::vector<Token> tokenize(std::string_view text);

/// Reads a token vector front to back; every error it raises is a ParseError
/// `modelpar ir parse: LINE:COL: ...` at the token concerned.
class TokenCursor {
 public:
  explicit TokenCursor(std::vector<Token> tokens) : tokens_(std::move(tokens)) {}

  const Token& peek(size_t ahead = 0) const;
  const Token& next();
  bool atEnd() const { return peek().kind == Token::Kind::End; }
  /// Consumes the punctuation `p` if it is next.
  bool acceptPunct(std::string_view p);
  /// Consumes the punctuation `p` or throws "expected 'p', found ...".
  const Token& expectPunct(std::string_view p);
  /// Consumes the keyword `n` or throws "expected 'n', found ...".
  const Token& expectName(std::string_view n);
  /// Consumes a token of kind `k` or throws "expected <what>, found ...".
  const Token& expect(Token::Kind k, std::string_view what);
  /// Consumes an Int token that fits in [lo, hi]; `what` names it in errors.
  int64_t expectInt(std::string_view what, int64_t lo, int64_t hi);

  /// Throws ParseError at `at`: "modelpar ir parse: L:C: <message>".
  [[noreturn]] static void fail(const Token& at, const std::string& message);
  /// Throws "expected <what>, found <next token>" at the next token.
  [[noreturn]] void failExpected(std::string_view what) const;
  /// How a token is named in messages: `'aten'`, `'%x'`, `end of input`.
  static std::string describe(const Token& t);

 private:
  std::vector<Token> tokens_;
  size_t pos_ = 0;
};

}  // namespace modelpar::ir
