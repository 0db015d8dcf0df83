// Test helpers for error paths: the message of an exception of an expected
// type, and a substring check that prints the whole message on failure.
#pragma once

#include <gtest/gtest.h>

#include <exception>
#include <string>

namespace modelpar::testing {

/// Runs `body` and returns the message of the `E` it must throw; records a
/// test failure (and returns "") if it throws something else or nothing.
template <typename E, typename F>
std::string messageOf(F&& body) {
  try {
    body();
  } catch (const E& e) {
    return e.what();
  } catch (const std::exception& e) {
    ADD_FAILURE() << "threw a different exception: " << e.what();
    return "";
  }
  ADD_FAILURE() << "did not throw";
  return "";
}

}  // namespace modelpar::testing

#define EXPECT_HAS(haystack, needle) \
  EXPECT_NE((haystack).find(needle), std::string::npos) << (haystack)
