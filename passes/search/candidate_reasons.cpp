// Grouping the strategy search's failed candidates by reason
// (candidate_reasons.h).
#include "passes/search/candidate_reasons.h"

#include <fmt/format.h>

#include <map>

namespace modelpar::passes {

std::vector<ReasonGroup> groupFailureReasons(const std::vector<StrategyCandidate>& candidates) {
  std::vector<ReasonGroup> groups;
  std::map<std::string, size_t> index;  // reason -> its group
  for (size_t i = 0; i < candidates.size(); ++i) {
    const StrategyCandidate& c = candidates[i];
    if (c.status != CandidateStatus::DoesNotFit && c.status != CandidateStatus::Failed) continue;
    auto [it, fresh] = index.emplace(c.reason, groups.size());
    if (fresh) groups.push_back({c.reason, {}});
    groups[it->second].candidates.push_back(static_cast<int>(i));
  }
  return groups;
}

std::string describeGroup(const ReasonGroup& group,
                          const std::vector<StrategyCandidate>& candidates, int shown) {
  const int n = static_cast<int>(group.candidates.size());
  std::string labels;
  for (int k = 0; k < n && k < shown; ++k) {
    labels += (k ? ", " : "") + candidates[static_cast<size_t>(group.candidates[k])].label();
  }
  if (n > shown) labels += fmt::format(" and {} more", n - shown);
  return fmt::format("{} candidate{} ({})", n, n == 1 ? "" : "s", labels);
}

}  // namespace modelpar::passes
