// Why candidates of a strategy search failed, said once per reason: a
// model that refuses every pipeline (batch norm, a permutation drawn per
// micro-batch) fails tens of candidates for one reason, and the table and
// the error list that reason once with the candidates that gave it.
#pragma once

#include <string>
#include <vector>

#include "passes/search/strategy_search.h"

namespace modelpar::passes {

/// One distinct failure reason and the candidates (indices, ascending) whose
/// status is DoesNotFit or Failed with exactly that reason.
struct ReasonGroup {
  std::string reason;
  std::vector<int> candidates;
};

/// The distinct reasons of the failed and does-not-fit candidates, in order
/// of their first candidate. Ok and pruned candidates are not grouped
/// (a pruned candidate's reason names its own bound).
std::vector<ReasonGroup> groupFailureReasons(const std::vector<StrategyCandidate>& candidates);

/// "48 candidates (pipeline gpipe x4 balance-time ..., ... and 45 more)": the
/// count and the first few labels of a group.
std::string describeGroup(const ReasonGroup& group,
                          const std::vector<StrategyCandidate>& candidates, int shown = 3);

}  // namespace modelpar::passes
