// Pass `place-msct` (place_msct.h): the favourite-child LP on CLP, its
// rounding, and the favourite-aware list scheduling policy.
#include "passes/place_msct.h"

#include <ClpSimplex.hpp>
#include <ClpSolve.hpp>

#include <algorithm>
#include <chrono>

#include "ir/check.h"
#include "passes/list_scheduler.h"

namespace modelpar::passes {
namespace {

// Average link over ordered device pairs: the LP does not know placements.
struct AverageLink {
  double latency_us = 0, us_per_byte = 0;
  explicit AverageLink(const DeviceModel& m) {
    int n = m.numDevices(), pairs = 0;
    for (int s = 0; s < n; ++s) {
      for (int d = 0; d < n; ++d) {
        if (s == d) continue;
        latency_us += m.link(s, d).latency_us;
        us_per_byte += 1e6 / m.link(s, d).bandwidth;
        ++pairs;
      }
    }
    if (pairs) {
      latency_us /= pairs;
      us_per_byte /= pairs;
    }
  }
};

// c_e for every edge of the CSR succ list: one latency per tensor + bytes.
std::vector<double> edgeCosts(const TaskGraph& tg, const DeviceModel& m) {
  std::vector<double> cost(tg.succs.size(), 0.0);
  if (m.numDevices() < 2) return cost;
  AverageLink link(m);
  // Count tensors per edge (the CSR stores bytes only).
  for (int32_t j = 0; j < tg.numTasks(); ++j) {
    for (int32_t xi : tg.inputsOf(j)) {
      const TaskGraph::Tensor& x = tg.tensors[static_cast<size_t>(xi)];
      if (x.producer < 0) continue;
      auto succ = tg.succsOf(x.producer);
      auto it = std::lower_bound(succ.begin(), succ.end(), j);
      size_t e = static_cast<size_t>(tg.succ_begin[static_cast<size_t>(x.producer)]) +
                 static_cast<size_t>(it - succ.begin());
      cost[e] += link.latency_us + static_cast<double>(x.bytes) * link.us_per_byte;
    }
  }
  return cost;
}

}  // namespace

std::vector<int32_t> favouriteChildren(const TaskGraph& tg, const DeviceModel& machine,
                                       const MSctOptions& options) {
  MP_CHECK(options.threshold >= 0 && options.threshold <= 1, ConfigError,
           "modelpar {}: threshold must lie in [0, 1], got {}", kMSctPassId, options.threshold);
  auto n = static_cast<size_t>(tg.numTasks());
  size_t num_edges = tg.succs.size();
  std::vector<int32_t> favourite(n, -1);
  if (num_edges == 0) return favourite;
  std::vector<double> c = edgeCosts(tg, machine);
  std::vector<int32_t> edge_src(num_edges);
  for (int32_t i = 0; i < tg.numTasks(); ++i) {
    for (auto e = tg.succ_begin[static_cast<size_t>(i)]; e < tg.succ_begin[static_cast<size_t>(i) + 1]; ++e) {
      edge_src[static_cast<size_t>(e)] = i;
    }
  }
  // 1. Rows: precedence per edge, then rule 4 (out), rule 5 (in), rule 6 (sinks).
  std::vector<double> row_lb, row_ub;
  const double inf = COIN_DBL_MAX;
  for (size_t e = 0; e < num_edges; ++e) {
    row_lb.push_back(-inf);
    row_ub.push_back(-tg.time_us[static_cast<size_t>(edge_src[e])]);
  }
  std::vector<int32_t> out_row(n, -1), in_row(n, -1), sink_row(n, -1);
  for (size_t i = 0; i < n; ++i) {
    auto outdeg = tg.succsOf(static_cast<int32_t>(i)).size();
    if (outdeg >= 2) {
      out_row[i] = static_cast<int32_t>(row_lb.size());
      row_lb.push_back(static_cast<double>(outdeg - 1));
      row_ub.push_back(inf);
    }
  }
  for (size_t j = 0; j < n; ++j) {
    auto indeg = tg.predsOf(static_cast<int32_t>(j)).size();
    if (indeg >= 2) {
      in_row[j] = static_cast<int32_t>(row_lb.size());
      row_lb.push_back(static_cast<double>(indeg - 1));
      row_ub.push_back(inf);
    }
  }
  for (size_t i = 0; i < n; ++i) {
    if (!tg.succsOf(static_cast<int32_t>(i)).empty()) continue;
    sink_row[i] = static_cast<int32_t>(row_lb.size());
    row_lb.push_back(-inf);
    row_ub.push_back(-tg.time_us[i]);
  }
  // 2. Columns, column-major: x_e, then s_i, then w.
  size_t num_cols = num_edges + n + 1;
  std::vector<CoinBigIndex> start;
  std::vector<int> index;
  std::vector<double> value, col_lb(num_cols, 0.0), col_ub(num_cols, inf), obj(num_cols, 0.0);
  start.reserve(num_cols + 1);
  for (size_t e = 0; e < num_edges; ++e) {
    start.push_back(static_cast<CoinBigIndex>(index.size()));
    col_ub[e] = 1.0;
    if (c[e] > 0) {
      index.push_back(static_cast<int>(e));
      value.push_back(c[e]);
    }
    auto i = static_cast<size_t>(edge_src[e]);
    auto j = static_cast<size_t>(tg.succs[e]);
    if (out_row[i] >= 0) { index.push_back(out_row[i]); value.push_back(1.0); }
    if (in_row[j] >= 0) { index.push_back(in_row[j]); value.push_back(1.0); }
  }
  // Incoming edges per task, to fill s_j's -1 entries.
  std::vector<std::vector<int32_t>> in_edges(n);
  for (size_t e = 0; e < num_edges; ++e) in_edges[static_cast<size_t>(tg.succs[e])].push_back(static_cast<int32_t>(e));
  for (size_t i = 0; i < n; ++i) {
    start.push_back(static_cast<CoinBigIndex>(index.size()));
    std::vector<std::pair<int, double>> entries;
    for (auto e = tg.succ_begin[i]; e < tg.succ_begin[i + 1]; ++e) entries.emplace_back(e, 1.0);
    for (int32_t e : in_edges[i]) entries.emplace_back(e, -1.0);
    if (sink_row[i] >= 0) entries.emplace_back(sink_row[i], 1.0);
    std::sort(entries.begin(), entries.end());
    for (auto [r, v] : entries) { index.push_back(r); value.push_back(v); }
  }
  start.push_back(static_cast<CoinBigIndex>(index.size()));
  for (size_t i = 0; i < n; ++i) {
    if (sink_row[i] >= 0) { index.push_back(sink_row[i]); value.push_back(-1.0); }
  }
  obj[num_cols - 1] = 1.0;
  start.push_back(static_cast<CoinBigIndex>(index.size()));

  auto t0 = std::chrono::steady_clock::now();
  ClpSimplex lp;
  lp.setLogLevel(0);
  lp.loadProblem(static_cast<int>(num_cols), static_cast<int>(row_lb.size()), start.data(),
                 index.data(), value.data(), col_lb.data(), col_ub.data(), obj.data(),
                 row_lb.data(), row_ub.data());
  lp.setMaximumSeconds(options.lp_time_limit_s);
  // Dual simplex from a crash basis, after presolve: the fastest of CLP's
  // methods on these degenerate scheduling LPs (measured: bench/RESULTS.md).
  ClpSolve solve;
  solve.setSolveType(ClpSolve::useDual);
  solve.setSpecialOption(0, 1);  // crash
  lp.initialSolve(solve);
  const double* x = lp.getColSolution();
  if (options.stats) {
    options.stats->lp_optimal = lp.isProvenOptimal();
    options.stats->lp_makespan_us = lp.objectiveValue();
    options.stats->lp_seconds =
        std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    options.stats->lp_rows = static_cast<int64_t>(row_lb.size());
    options.stats->lp_columns = static_cast<int64_t>(num_cols);
  }

  // 3. Rounding that keeps one favourite child per parent, one favoured parent per child.
  std::vector<int32_t> candidates;
  for (size_t e = 0; e < num_edges; ++e) {
    if (c[e] > 0 && x[e] < options.threshold) candidates.push_back(static_cast<int32_t>(e));
  }
  std::sort(candidates.begin(), candidates.end(), [&](int32_t a, int32_t b) {
    auto ua = static_cast<size_t>(a), ub = static_cast<size_t>(b);
    if (x[ua] != x[ub]) return x[ua] < x[ub];
    if (c[ua] != c[ub]) return c[ua] > c[ub];
    return a < b;
  });
  std::vector<char> has_parent(n, 0);
  int64_t kept = 0;
  for (int32_t e : candidates) {
    auto i = static_cast<size_t>(edge_src[static_cast<size_t>(e)]);
    int32_t j = tg.succs[static_cast<size_t>(e)];
    if (favourite[i] >= 0 || has_parent[static_cast<size_t>(j)]) continue;
    favourite[i] = j;
    has_parent[static_cast<size_t>(j)] = 1;
    ++kept;
  }
  if (options.stats) options.stats->favourite_edges = kept;
  return favourite;
}

namespace {

// Stage 2 (algorithms.md §1.7): ETF with a device reserved for the favourite
// child of the task it just ran.
class SmallCommunicationTimes final : public SchedulingPolicy {
 public:
  explicit SmallCommunicationTimes(std::vector<int32_t> favourite) : favourite_(std::move(favourite)) {}

  Choice choose(const ListScheduler& s, double now, std::span<const int32_t> ready,
                std::span<const int> free) override {
    const TaskGraph& tg = s.tasks();
    Choice best;
    bool best_fav = false;
    int32_t best_rank = 0;
    auto consider = [&](int32_t t, int d, double start, bool fav) {
      int32_t rank = tg.rank[static_cast<size_t>(t)];
      bool better = start < best.start ||
                    (start == best.start && (fav > best_fav || (fav == best_fav && rank < best_rank)));
      if (!better) return;
      best = Choice{t, d, start};
      best_fav = fav;
      best_rank = rank;
    };
    for (int d : free) {
      int32_t last = s.lastTask(d);
      int32_t fc = last >= 0 ? favourite_[static_cast<size_t>(last)] : -1;
      double fc_start = 0;
      bool reserved = fc >= 0 && s.isReady(fc) && !s.scheduled(fc) && s.fits(fc, d);
      if (reserved) {
        fc_start = s.earliestStart(fc, d, now);
        for (int d2 = 0; d2 < s.numDevices() && reserved; ++d2) {
          if (d2 != d && s.fits(fc, d2) && s.earliestStart(fc, d2, now) < fc_start) reserved = false;
        }
      }
      if (!reserved) {
        for (int32_t t : ready) {
          if (s.fits(t, d)) consider(t, d, std::max(now, s.dataReady(t, d)), false);
        }
        continue;
      }
      // Reserved for fc: only urgent tasks may go first.
      bool urgent_found = false;
      for (int32_t t : ready) {
        if (t == fc || !s.fits(t, d)) continue;
        double latest = 0;
        for (int d2 = 0; d2 < s.numDevices() && latest <= now; ++d2) {
          if (s.fits(t, d2)) latest = std::max(latest, s.earliestStart(t, d2, now));
        }
        if (latest <= now) {
          consider(t, d, std::max(now, s.dataReady(t, d)), false);
          urgent_found = true;
        }
      }
      if (!urgent_found) consider(fc, d, fc_start, true);
    }
    return best;
  }

 private:
  std::vector<int32_t> favourite_;
};

}  // namespace

Placement placeMSct(const ir::Graph& g, const TaskGraph& tg, const DeviceModel& machine,
                    const MSctOptions& options) {
  SmallCommunicationTimes policy(favouriteChildren(tg, machine, options));
  ListScheduler s(tg, machine, kMSctPassId);
  s.run(policy);
  return s.toPlacement(g, std::string(kMSctPassId));
}

Placement placeMSct(const ir::Graph& g, const DeviceModel& machine, const MSctOptions& options) {
  TaskGraph tg = buildTaskGraph(g, options.units);
  return placeMSct(g, tg, machine, options);
}

}  // namespace modelpar::passes
