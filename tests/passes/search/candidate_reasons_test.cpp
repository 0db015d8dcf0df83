// groupFailureReasons / describeGroup and the search table built on them: a
// reason shared by many failed candidates is said once, with its count.
#include "passes/search/candidate_reasons.h"

#include <gtest/gtest.h>

#include <string>

namespace modelpar::passes {
namespace {

StrategyCandidate pipelineCandidate(int m, CandidateStatus status, std::string reason) {
  StrategyCandidate c;
  c.kind = "pipeline";
  c.schedule = "gpipe";
  c.partition = "balance-time";
  c.checkpoint = "never";
  c.microbatches = m;
  c.status = status;
  c.reason = std::move(reason);
  return c;
}

size_t occurrences(const std::string& text, const std::string& what) {
  size_t n = 0;
  for (size_t at = text.find(what); at != std::string::npos; at = text.find(what, at + 1)) ++n;
  return n;
}

// Candidates:  0 ok  1 failed A  2 does-not-fit B  3 failed A  4 pruned  5 failed A
TEST(CandidateReasons, GroupsFailuresByReasonInFirstSeenOrder) {
  std::vector<StrategyCandidate> cs = {
      pipelineCandidate(2, CandidateStatus::Ok, ""),
      pipelineCandidate(4, CandidateStatus::Failed, "batch norm reduces over the batch"),
      pipelineCandidate(8, CandidateStatus::DoesNotFit, "needs 3 GiB of 1 GiB"),
      pipelineCandidate(16, CandidateStatus::Failed, "batch norm reduces over the batch"),
      pipelineCandidate(32, CandidateStatus::Pruned, "bound 5 ms cannot beat best 4 ms"),
      pipelineCandidate(64, CandidateStatus::Failed, "batch norm reduces over the batch"),
  };
  std::vector<ReasonGroup> groups = groupFailureReasons(cs);
  ASSERT_EQ(groups.size(), 2u);
  EXPECT_EQ(groups[0].reason, "batch norm reduces over the batch");
  EXPECT_EQ(groups[0].candidates, (std::vector<int>{1, 3, 5}));
  EXPECT_EQ(groups[1].reason, "needs 3 GiB of 1 GiB");
  EXPECT_EQ(groups[1].candidates, (std::vector<int>{2}));
  EXPECT_EQ(describeGroup(groups[0], cs, 2),
            "3 candidates (" + cs[1].label() + ", " + cs[3].label() + " and 1 more)");
  EXPECT_EQ(describeGroup(groups[1], cs), "1 candidate (" + cs[2].label() + ")");
}

TEST(CandidateReasons, TablePrintsASharedReasonOnceWithItsCount) {
  StrategySearch s;
  const std::string why = "modelpar microbatch: training-mode batch norm reduces over the batch";
  for (int m : {2, 4, 8, 16, 32}) s.candidates.push_back(pipelineCandidate(m, CandidateStatus::Failed, why));
  s.candidates.push_back(pipelineCandidate(1, CandidateStatus::Failed, "a reason of its own"));
  std::string table = s.table();
  EXPECT_EQ(occurrences(table, why), 1u) << table;
  EXPECT_EQ(occurrences(table, "reason [1]"), 5u) << table;
  EXPECT_NE(table.find("[1] 5 candidates ("), std::string::npos) << table;
  EXPECT_NE(table.find("failed: a reason of its own"), std::string::npos) << table;  // unshared: inline
}

}  // namespace
}  // namespace modelpar::passes
