// MP_RT_CHECK / MP_RT_THROW / MP_RT_INTERNAL_ASSERT: the runtime's typed checks. Like ir/check.h but
// the message is built with c10::str (runtime/ links PyTorch, whose bundled
// fmt differs from ours), and the thrown type is a modelpar::Error subclass so
// that python/ maps it to the matching Python exception.
#pragma once

#include <c10/util/StringUtil.h>

#include "ir/error.h"

/// Throws `modelpar::ErrorType(c10::str(...))` when `cond` is false.
/// Example: MP_RT_CHECK(n == want, ExecutionError, "expected ", want, " inputs, got ", n);
#define MP_RT_CHECK(cond, ErrorType, ...)                                           \
  do {                                                                              \
    if (!(cond)) {                                                                  \
      throw ::modelpar::ErrorType(::c10::str(__VA_ARGS__), __FILE__, __LINE__);     \
    }                                                                               \
  } while (false)

/// Throws unconditionally.
#define MP_RT_THROW(ErrorType, ...) \
  throw ::modelpar::ErrorType(::c10::str(__VA_ARGS__), __FILE__, __LINE__)

/// MP_INTERNAL_ASSERT (ir/check.h) for the PyTorch-side folders, the message
/// built with c10::str: throws InternalError ("modelpar internal error
/// (please report): ..."). Marks an invariant of modelpar's own code.
#define MP_RT_INTERNAL_ASSERT(cond, ...)                                            \
  do {                                                                              \
    if (!(cond)) {                                                                  \
      throw ::modelpar::InternalError(::c10::str(__VA_ARGS__), __FILE__, __LINE__); \
    }                                                                               \
  } while (false)
