// Golden pass tests: every file in tests/passes/golden/ runs its passes on its
// input IR and must print exactly its expected IR (or fail with the expected
// error), the way MLIR's lit + FileCheck tests do. The file format:
//
//   // RUN: cost:devices=2 place-metf:devices=2 lower
//   // What the case shows (comments before the input are free text).
//   <input IR>
//   // -----
//   <expected IR>            or      // ERROR: <a part of the message>
//
// The same files run through `python -m modelpar opt` in
// tests/python/test_opt_driver.py. MODELPAR_UPDATE_GOLDEN=1 rewrites the
// expected part from what the passes print (review the diff before keeping it).
#include <gtest/gtest.h>

#include <algorithm>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <string>
#include <vector>

#include "ir/error.h"
#include "passes/pass_registry.h"
#include "tests/support/read_file.h"

namespace modelpar::passes {
namespace {

namespace fs = std::filesystem;

fs::path goldenDir() { return fs::path(MODELPAR_SOURCE_DIR) / "tests" / "passes" / "golden"; }

std::vector<std::string> goldenFiles() {
  std::vector<std::string> out;
  for (const auto& e : fs::directory_iterator(goldenDir())) {
    if (e.path().extension() == ".txt") out.push_back(e.path().filename().string());
  }
  std::sort(out.begin(), out.end());
  return out;
}

struct GoldenCase {
  std::vector<std::string> passes;
  std::string input, expected;
};

GoldenCase parseCase(const std::string& text, const std::string& file) {
  GoldenCase c;
  constexpr std::string_view kRun = "// RUN:";
  EXPECT_EQ(text.rfind(kRun, 0), 0u) << file << " must start with '// RUN: <passes>'";
  size_t eol = text.find('\n');
  std::istringstream run(text.substr(kRun.size(), eol - kRun.size()));
  for (std::string p; run >> p;) c.passes.push_back(p);
  constexpr std::string_view kSplit = "\n// -----\n";
  size_t split = text.find(kSplit);
  EXPECT_NE(split, std::string::npos) << file << " has no '// -----' line";
  c.input = text.substr(eol + 1, split - eol);
  c.expected = text.substr(split + kSplit.size());
  return c;
}

class Golden : public ::testing::TestWithParam<std::string> {};

TEST_P(Golden, PassesPrintTheExpectedIr) {
  fs::path path = goldenDir() / GetParam();
  std::string text = testing::readFile(path.string());
  GoldenCase c = parseCase(text, GetParam());
  std::vector<PassSpec> specs;
  for (const std::string& p : c.passes) specs.push_back(parsePassSpec(p));
  std::string got;
  try {
    got = printIrUnit(runPasses(parseIrUnit(c.input), specs));
  } catch (const Error& e) {
    got = std::string("// ERROR: ") + e.what() + "\n";
  }
  constexpr std::string_view kError = "// ERROR: ";
  if (c.expected.rfind(kError, 0) == 0) {
    std::string want = c.expected.substr(kError.size());
    want.erase(want.find_last_not_of(" \n") + 1);
    EXPECT_NE(got.find(want), std::string::npos) << GetParam() << ": expected an error with '"
                                                 << want << "', got:\n" << got;
    return;
  }
  if (std::getenv("MODELPAR_UPDATE_GOLDEN") && got != c.expected) {
    std::ofstream(path) << text.substr(0, text.size() - c.expected.size()) << got;
    GTEST_SKIP() << "rewrote " << path;
  }
  EXPECT_EQ(got, c.expected) << GetParam();
}

INSTANTIATE_TEST_SUITE_P(Files, Golden, ::testing::ValuesIn(goldenFiles()),
                         [](const ::testing::TestParamInfo<std::string>& info) {
                           std::string n = info.param.substr(0, info.param.size() - 4);
                           std::replace_if(n.begin(), n.end(), [](char ch) { return !std::isalnum(static_cast<unsigned char>(ch)); }, '_');
                           return n;
                         });

TEST(PassSpec, ParsesNameAndOptionsAndRejectsMalformedOnes) {
  PassSpec s = parsePassSpec("microbatch:microbatches=4,batch_size=8");
  EXPECT_EQ(s.name, "microbatch");
  EXPECT_EQ(s.options.at("microbatches"), "4");
  EXPECT_EQ(s.options.at("batch_size"), "8");
  EXPECT_TRUE(parsePassSpec("lower").options.empty());
  EXPECT_THROW(parsePassSpec(":devices=2"), ConfigError);
  EXPECT_THROW(parsePassSpec("cost:devices"), ConfigError);
  EXPECT_THROW(parsePassSpec("cost:devices=2,devices=3"), ConfigError);
}

}  // namespace
}  // namespace modelpar::passes
