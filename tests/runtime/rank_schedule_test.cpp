// What the rank executor reads off a Program before any step
// (runtime/rank_schedule.h): where each output ends, and whether every pair
// of devices transfers in one order (what NCCL needs).
#include "runtime/rank_schedule.h"

#include <gtest/gtest.h>

#include "ir/error.h"
#include "ir/parser.h"
#include "ir/printer.h"
#include "ir/verifier.h"
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
TEST(RankSchedule, ReceivingInSendOrderReordersOnlyWhatWasOutOfOrder) {
  EXPECT_EQ(receiveInSendOrder(twoTransfers(true)), twoTransfers(false));
  EXPECT_EQ(receiveInSendOrder(twoTransfers(false)), twoTransfers(false));
  EXPECT_NO_THROW(checkPairOrder(receiveInSendOrder(twoTransfers(true))));
}

TEST(RankSchedule, ValuesSentEarlierAreReceivedAheadPerPeer) {
  // Device 2 uses %b (from 0) before %a (from 0), with %d from 1 between:
  // %a is received ahead of %b, at %b's receive; %d keeps its place.
  const ir::Program p = ir::parseProgram(R"(program devices=3
graph @g(%x: f32[2] input {device=0}, %y: f32[2] input {device=1}) {
  %a: f32[2] = aten::relu(%x) {device=0}
  %b: f32[2] = aten::neg(%x) {device=0}
  %d: f32[2] = aten::neg(%y) {device=1}
  %e: f32[2] = aten::mul.Tensor(%b, %d) {device=2}
  %f: f32[2] = aten::mul.Tensor(%a, %e) {device=2}
  return %f
}
device 0 {
  run %a
  send %a -> 2
  run %b
  send %b -> 2
}
device 1 {
  run %d
  send %d -> 2
}
device 2 {
  recv %b <- 0
  recv %d <- 1
  run %e
  free %b
  recv %a <- 0
  run %f
}
)");
  const ir::Program q = receiveInSendOrder(p);
  EXPECT_NO_THROW(ir::verify(q));
  EXPECT_NO_THROW(checkPairOrder(q));
  std::vector<std::string> got;
  for (const ir::Instruction& i : q.schedule(2)) got.push_back(ir::printInstruction(q.graph(), i));
  EXPECT_EQ(got, (std::vector<std::string>{"recv %a <- 0", "recv %b <- 0", "recv %d <- 1", "run %e",
                                           "free %b", "run %f"}));
  EXPECT_EQ(q.schedule(0), p.schedule(0));
  EXPECT_EQ(q.schedule(1), p.schedule(1));
}

TEST(RankSchedule, AReceiveNothingSendsIsAnErrorNamingIt) {
  ir::Program p = twoTransfers(false);
  p.schedule(0).pop_back();  // %b is never sent
  EXPECT_THROW(
      {
        try {
          receiveInSendOrder(p);
        } catch (const InvalidIrError& e) {
          EXPECT_NE(std::string(e.what()).find("device 1 receives %b from device 0, which does not "
                                               "send it"), std::string::npos) << e.what();
          throw;
        }
      },
      InvalidIrError);
}

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
