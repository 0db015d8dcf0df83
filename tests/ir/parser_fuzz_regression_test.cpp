// Inputs found by tests/fuzz/ir_parser_fuzz.cpp (scripts/fuzz_parser.sh), each
// reduced to its smallest form and kept as a regression test.
#include <gtest/gtest.h>

#include <cmath>
#include <string>

#include "ir/error.h"
#include "ir/parser.h"
#include "ir/printer.h"
#include "ir/verifier.h"

namespace modelpar::ir {
namespace {

// Fuzzer, 2026-11-25 (crash-fd16a430...): a golden test with one cost's
// time_us mutated to `nan` parsed, printed and parsed back, but the two graphs
// compared unequal because Cost compared its double with `==` (NaN != NaN).
// Cost now compares time_us bitwise, as Arg does for float constants.
TEST(ParserFuzzRegression, NanCostTimeRoundTripsAndVerifierRefusesIt) {
  const std::string text =
      "graph @g(%x: f32[4] input) {\n"
      "  %y: f32[4] = aten::relu(%x) {cost={time_us=nan, out=16, temp=0, persist=0}}\n"
      "  return %y\n"
      "}\n";
  Graph g = parseGraph(text);
  ASSERT_TRUE(g.node(0).cost.has_value());
  EXPECT_TRUE(std::isnan(g.node(0).cost->time_us));
  EXPECT_EQ(print(g), text);
  EXPECT_EQ(parseGraph(print(g)), g);
  try {
    verify(g);
    ADD_FAILURE() << "expected InvalidIrError";
  } catch (const InvalidIrError& e) {
    EXPECT_NE(std::string(e.what()).find("negative or non-finite cost"), std::string::npos)
        << e.what();
  }
}

TEST(ParserFuzzRegression, CostTimesCompareBitwise) {
  EXPECT_EQ((Cost{std::nan(""), 1, 2, 3}), (Cost{std::nan(""), 1, 2, 3}));
  EXPECT_NE((Cost{0.0, 1, 2, 3}), (Cost{-0.0, 1, 2, 3}));  // printed as 0.0 and -0.0
  EXPECT_NE((Cost{1.0, 1, 2, 3}), (Cost{1.0, 1, 2, 4}));
}

}  // namespace
}  // namespace modelpar::ir
