// ir/check.h: MP_CHECK throws the named type with file and line; the one
// internal assert, MP_INTERNAL_ASSERT, throws InternalError whose message
// says it is a modelpar bug to report, the same whoever builds the message.
#include "ir/check.h"

#include <gtest/gtest.h>

#include <string>

namespace modelpar {
namespace {

TEST(InternalAssert, ThrowsInternalErrorNamingABugToReport) {
  try {
    MP_INTERNAL_ASSERT(1 + 1 == 3, "{} tasks left but none ready", 4);
    FAIL() << "no throw";
  } catch (const InternalError& e) {
    EXPECT_EQ(std::string(e.what()),
              "modelpar internal error (please report): 4 tasks left but none ready");
    EXPECT_NE(std::string(e.file()).find("check_test.cpp"), std::string::npos);
    EXPECT_GT(e.line(), 0);
  }
  MP_INTERNAL_ASSERT(true, "never formatted {}", 1);
}

TEST(InternalAssert, InternalErrorAddsThePrefixOnce) {
  // What MP_RT_INTERNAL_ASSERT (runtime/check.h) and any other raiser builds.
  EXPECT_EQ(std::string(InternalError("x").what()), std::string(kInternalErrorPrefix) + "x");
  EXPECT_EQ(std::string(InternalError(std::string(kInternalErrorPrefix) + "x").what()),
            std::string(kInternalErrorPrefix) + "x");
}

TEST(Check, ThrowsTheNamedTypeWithFileAndLine) {
  try {
    MP_CHECK(false, ConfigError, "devices={} is not valid", 0);
    FAIL() << "no throw";
  } catch (const ConfigError& e) {
    EXPECT_EQ(std::string(e.what()), "devices=0 is not valid");
    EXPECT_GT(e.line(), 0);
  }
}

}  // namespace
}  // namespace modelpar
