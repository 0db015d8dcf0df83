// What the rank executor reads off a Program before any step
// (runtime/rank_schedule.h): where each output ends, and whether every pair
// of devices transfers in one order (what NCCL needs).
#include "runtime/rank_schedule.h"

#include <gtest/gtest.h>

#include "ir/error.h"
#include "ir/parser.h"
#include "tests/support/expect_error.h"
#include "tests/support/read_file.h"

namespace modelpar::runtime {
namespace {

using modelpar::testing::messageOf;
using modelpar::testing::readFile;

// Device 0 makes %a and %b and sends both to device 1, which receives them
// in the other order (`swapped`) or in the same order, and multiplies them.
ir::Program twoTransfers(bool swapped) {
  const std::string first = swapped ? "%b" : "%a";
  const std::string second = swapped ? "%a" : "%b";
  return ir::parseProgram(
      "program devices=2\n"
      "graph @swap(%x: f32[2] input {device=0}) {\n"
      "  %a: f32[2] = aten::relu(%x) {device=0}\n"
      "  %b: f32[2] = aten::neg(%x) {device=0}\n"
      "  %c: f32[2] = aten::mul.Tensor(%a, %b) {device=1}\n"
      "  return %c\n"
      "}\n"
      "device 0 {\n  run %a\n  run %b\n  send %a -> 1\n  send %b -> 1\n}\n"
      "device 1 {\n  recv " + first + " <- 0\n  recv " + second + " <- 0\n  run %c\n}\n");
}

TEST(RankSchedule, TransfersInTheSameOrderFitNccl) {
  EXPECT_NO_THROW(checkPairOrder(twoTransfers(false)));
}

TEST(RankSchedule, TransfersReceivedInAnotherOrderAreAConfigErrorNamingThem) {
  EXPECT_HAS(messageOf<ConfigError>([] { checkPairOrder(twoTransfers(true)); }),
             "device 0's transfer 0 to device 1 is %a but device 1 receives %b there");
}

// examples/ir/mlp_pipeline_2dev.txt returns %loss (made on device 1),
// %w1_new (device 0) and %w2_new (device 1); %x is never an output.
TEST(RankSchedule, OutputPlacesFollowTheLists) {
  const ir::Program p = ir::parseProgram(readFile(MODELPAR_SOURCE_DIR "/examples/ir/mlp_pipeline_2dev.txt"));
  const OutputPlaces o = outputPlaces(p);
  EXPECT_EQ(o.holder, (std::vector<int>{1, 0, 1}));
  EXPECT_EQ(o.present[1], (std::vector<bool>{true, false}));
  const OutputPlaces swap = outputPlaces(twoTransfers(false));
  EXPECT_EQ(swap.holder, (std::vector<int>{1}));
}

}  // namespace
}  // namespace modelpar::runtime
