// Typed errors thrown by ir/ and passes/. The Python shim maps each class to a
// Python exception of the same name. This header stays free of fmt so that
// PyTorch-side code (which carries its own fmt) can include it.
#pragma once

#include <stdexcept>
#include <string>

namespace modelpar {

/// Base of every error modelpar raises on purpose. `what()` is the message a
/// user reads; `file()`/`line()` say where in modelpar it was raised.
class Error : public std::runtime_error {
 public:
  Error(std::string message, const char* file = "", int line = 0)
      : std::runtime_error(std::move(message)), file_(file), line_(line) {}
  const char* file() const { return file_; }
  int line() const { return line_; }

 private:
  const char* file_;
  int line_;
};

/// IR that breaks an invariant: undefined value, bad device, unmatched send...
class InvalidIrError : public Error {
  using Error::Error;
};

/// Malformed IR text. The message reads `modelpar ir parse: LINE:COL: ...`.
class ParseError : public InvalidIrError {
 public:
  ParseError(std::string message, int text_line, int text_column,
             const char* file = "", int line = 0)
      : InvalidIrError(std::move(message), file, line),
        text_line_(text_line),
        text_column_(text_column) {}
  int textLine() const { return text_line_; }
  int textColumn() const { return text_column_; }

 private:
  int text_line_;
  int text_column_;
};

/// An operator modelpar cannot call or does not model.
class UnsupportedOpError : public Error {
  using Error::Error;
};

/// A plan needs more memory than the devices have.
class PlanDoesNotFitError : public Error {
  using Error::Error;
};

/// A bad option or option combination.
class ConfigError : public Error {
  using Error::Error;
};

/// A failure while executing a Program (carries device and instruction).
class ExecutionError : public Error {
  using Error::Error;
};

/// What every InternalError's message starts with.
inline constexpr const char* kInternalErrorPrefix = "modelpar internal error (please report): ";

/// A broken invariant inside modelpar itself: a bug to report. Raised by the
/// one internal assert, MP_INTERNAL_ASSERT (ir/check.h; the PyTorch-side
/// folders wrap it as MP_RT_INTERNAL_ASSERT, runtime/check.h). The message
/// always starts with kInternalErrorPrefix, added here when missing.
class InternalError : public Error {
 public:
  InternalError(std::string message, const char* file = "", int line = 0)
      : Error(prefixed(std::move(message)), file, line) {}

 private:
  static std::string prefixed(std::string message) {
    const std::string prefix(kInternalErrorPrefix);
    if (message.compare(0, prefix.size(), prefix) != 0) message.insert(0, prefix);
    return message;
  }
};

}  // namespace modelpar
