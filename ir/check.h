// MP_CHECK / MP_INTERNAL_ASSERT: throw a typed modelpar::Error with a fmt
// message and the raising file and line. For ir/ and passes/ only (the
// PyTorch-side folders use TORCH_CHECK, and PyTorch ships its own fmt).
#pragma once

#include <fmt/format.h>

#include "ir/error.h"

/// Throws `ErrorType(fmt::format(...))` when `cond` is false.
/// Example: MP_CHECK(dev < n, InvalidIrError, "device {} out of range", dev);
#define MP_CHECK(cond, ErrorType, ...)                                       \
  do {                                                                       \
    if (!(cond)) {                                                           \
      throw ::modelpar::ErrorType(::fmt::format(__VA_ARGS__), __FILE__,      \
                                  __LINE__);                                 \
    }                                                                        \
  } while (false)

/// Throws unconditionally.
#define MP_THROW(ErrorType, ...) \
  throw ::modelpar::ErrorType(::fmt::format(__VA_ARGS__), __FILE__, __LINE__)

/// Marks an invariant of modelpar's own code; failing it is a modelpar bug.
/// The one internal assert: throws InternalError, whose message starts with
/// "modelpar internal error (please report): " (ir/error.h).
#define MP_INTERNAL_ASSERT(cond, ...)                                        \
  do {                                                                       \
    if (!(cond)) {                                                           \
      throw ::modelpar::InternalError(::fmt::format(__VA_ARGS__), __FILE__,  \
                                      __LINE__);                             \
    }                                                                        \
  } while (false)
