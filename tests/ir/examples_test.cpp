// The hand-written IR examples in examples/ir/ parse, verify, round-trip, and
// their deliberately broken copies are rejected with messages naming the fault.
#include <gtest/gtest.h>

#include <fstream>
#include <sstream>
#include <string>

#include "ir/ir.h"
#include "tests/support/read_file.h"

namespace modelpar::ir {
namespace {

using modelpar::testing::readExample;

std::string verifyError(const Program& p) {
  try {
    verify(p);
  } catch (const InvalidIrError& e) {
    return e.what();
  }
  return "";
}

TEST(Examples, SingleDeviceStepParsesVerifiesAndRoundTrips) {
  Graph g = parseGraph(readExample("mlp_step.txt"));
  verify(g);
  EXPECT_EQ(g.numNodes(), 15u);
  EXPECT_EQ(g.outputs().size(), 3u);
  EXPECT_EQ(parseGraph(print(g)), g);
}

TEST(Examples, PipelineProgramParsesVerifiesAndRoundTrips) {
  Program p = parseProgram(readExample("mlp_pipeline_2dev.txt"));
  verify(p);
  EXPECT_EQ(p.numDevices(), 2);
  EXPECT_EQ(p.graph().numNodes(), 33u);
  EXPECT_EQ(parseProgram(print(p)), p);
  // Every node is run once: 33 runs in all.
  size_t runs = 0;
  for (int d = 0; d < p.numDevices(); ++d) {
    for (const Instruction& i : p.schedule(d)) runs += i.kind == Instruction::Kind::Run;
  }
  EXPECT_EQ(runs, 33u);
}

TEST(Examples, GPipeScheduledProgramParsesVerifiesAndRoundTrips) {
  Program p = parseProgram(readExample("mlp_pipeline_gpipe.txt"));
  verify(p);
  EXPECT_EQ(p.numDevices(), 2);
  EXPECT_EQ(parseProgram(print(p)), p);
  // Micro-batch 1's backward runs before micro-batch 0's on both devices.
  auto position = [&](int d, const std::string& name) {
    const auto& s = p.schedule(d);
    for (size_t i = 0; i < s.size(); ++i) {
      if (s[i].kind == Instruction::Kind::Run && p.graph().nodeRef(s[i].node) == name) return static_cast<int>(i);
    }
    return -1;
  };
  EXPECT_LT(position(0, "%dh_1"), position(0, "%dh_0"));
  EXPECT_LT(position(1, "%da_1"), position(1, "%da_0"));
}

TEST(Examples, ProgramWithRemovedSendIsRejectedNamingTheReceive) {
  Program p = parseProgram(readExample("mlp_pipeline_2dev_missing_send.txt"));
  std::string msg = verifyError(p);
  ASSERT_FALSE(msg.empty()) << "the verifier accepted a program with a missing send";
  EXPECT_NE(msg.find("%a_1"), std::string::npos) << msg;
  EXPECT_NE(msg.find("send"), std::string::npos) << msg;
}

TEST(Examples, ProgramWithCrossedSendsIsRejectedAsDeadlock) {
  Program p = parseProgram(readExample("mlp_pipeline_2dev_deadlock.txt"));
  std::string msg = verifyError(p);
  ASSERT_FALSE(msg.empty()) << "the verifier accepted a deadlocking program";
  EXPECT_NE(msg.find("deadlock"), std::string::npos) << msg;
  EXPECT_NE(msg.find("%a_1"), std::string::npos) << msg;
  EXPECT_NE(msg.find("%da_0"), std::string::npos) << msg;
}

}  // namespace
}  // namespace modelpar::ir
