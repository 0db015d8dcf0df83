// Pass `place-msct` (place_msct.h): the favourite-child LP on CLP, its
// rounding, and the favourite-aware list scheduling policy.
#include "passes/place/place_msct.h"

#include <ClpSimplex.hpp>
#include <ClpSolve.hpp>
#include <CoinPackedMatrix.hpp>

#include <algorithm>
#include <chrono>
#include <unordered_map>

#include "ir/check.h"
#include "passes/place/list_scheduler.h"

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

namespace {

// The LP's edge data: source, cost and the in-edges of every task.
struct Edges {
  std::vector<int32_t> src;
  std::vector<double> cost;
  std::vector<std::vector<int32_t>> in;  // per task, edge ids
};

// Where the LP stands: x per edge (committed by an earlier window, or the
// whole LP), s per task; NaN where nothing is committed yet.
struct LpState {
  std::vector<double> x, s;
  bool optimal = true;
  double w = 0;
};

// The LP's columns over the tasks of rank [lo, hi): x of the window's
// in-edges, then s of its tasks, then w.
struct Window {
  const TaskGraph& tg;
  int32_t lo = 0, hi = 0;
  std::vector<int32_t> edges;
  std::unordered_map<int32_t, int> xcol;

  int32_t rankOf(int32_t t) const { return tg.rank[static_cast<size_t>(t)]; }
  double p(int32_t t) const { return tg.time_us[static_cast<size_t>(t)]; }
  int numTasks() const { return hi - lo; }
  int scol(int32_t t) const { return static_cast<int>(edges.size()) + (rankOf(t) - lo); }
  int wcol() const { return static_cast<int>(edges.size()) + numTasks(); }
  int numCols() const { return wcol() + 1; }
};

// The columns of the window [lo, hi).
Window windowColumns(const TaskGraph& tg, const Edges& ed, int32_t lo, int32_t hi) {
  Window win{tg, lo, hi, {}, {}};
  for (int32_t r = lo; r < hi; ++r) {
    for (int32_t e : ed.in[static_cast<size_t>(tg.topo[static_cast<size_t>(r)])]) win.edges.push_back(e);
  }
  for (size_t k = 0; k < win.edges.size(); ++k) win.xcol.emplace(win.edges[k], static_cast<int>(k));
  return win;
}

// The LP's rows as (row, column, value) entries, built one row at a time.
struct Rows {
  std::vector<int> rows, cols;
  std::vector<double> vals, row_lb, row_ub;

  void entry(int c, double v) {
    rows.push_back(static_cast<int>(row_lb.size()));
    cols.push_back(c);
    vals.push_back(v);
  }
  void endRow(double lb, double ub) {
    row_lb.push_back(lb);
    row_ub.push_back(ub);
  }
};

// Precedence per edge.
void addPrecedenceRows(const Edges& ed, const Window& win, const LpState& st, Rows& lp) {
  const double inf = COIN_DBL_MAX;
  for (int32_t e : win.edges) {
    int32_t i = ed.src[static_cast<size_t>(e)], j = win.tg.succs[static_cast<size_t>(e)];
    double c = ed.cost[static_cast<size_t>(e)];
    if (c > 0) lp.entry(win.xcol.at(e), c);
    lp.entry(win.scol(j), -1.0);
    if (win.rankOf(i) >= win.lo) {
      lp.entry(win.scol(i), 1.0);
      lp.endRow(-inf, -win.p(i));
    } else {
      lp.endRow(-inf, -(st.s[static_cast<size_t>(i)] + win.p(i)));
    }
  }
}

// At most one favourite child per parent: sum over the window's edges of
// each parent >= outdeg - 1 - (committed x) - (edges beyond the window).
void addFavouriteChildRows(const Edges& ed, const Window& win, const LpState& st, Rows& lp) {
  const double inf = COIN_DBL_MAX;
  const TaskGraph& tg = win.tg;
  std::unordered_map<int32_t, std::vector<int32_t>> by_parent;
  for (int32_t e : win.edges) by_parent[ed.src[static_cast<size_t>(e)]].push_back(e);
  std::vector<int32_t> parents;
  for (const auto& kv : by_parent) parents.push_back(kv.first);
  std::sort(parents.begin(), parents.end());
  for (int32_t i : parents) {
    double need = static_cast<double>(tg.succsOf(i).size()) - 1.0;
    for (auto e = tg.succ_begin[static_cast<size_t>(i)]; e < tg.succ_begin[static_cast<size_t>(i) + 1]; ++e) {
      int32_t r = win.rankOf(tg.succs[static_cast<size_t>(e)]);
      if (r < win.lo) need -= st.x[static_cast<size_t>(e)];
      if (r >= win.hi) need -= 1.0;
    }
    if (need <= 1e-9) continue;
    for (int32_t e : by_parent[i]) lp.entry(win.xcol.at(e), 1.0);
    lp.endRow(need, inf);
  }
}

// At most one favoured parent per child; the window's makespan.
void addFavouredParentAndMakespanRows(const Edges& ed, const Window& win, Rows& lp) {
  const double inf = COIN_DBL_MAX;
  const TaskGraph& tg = win.tg;
  for (int32_t r = win.lo; r < win.hi; ++r) {
    int32_t j = tg.topo[static_cast<size_t>(r)];
    const auto& in = ed.in[static_cast<size_t>(j)];
    if (in.size() >= 2) {
      for (int32_t e : in) lp.entry(win.xcol.at(e), 1.0);
      lp.endRow(static_cast<double>(in.size()) - 1.0, inf);
    }
    bool last = true;
    for (int32_t k : tg.succsOf(j)) last = last && win.rankOf(k) >= win.hi;
    if (last) {
      lp.entry(win.scol(j), 1.0);
      lp.entry(win.wcol(), -1.0);
      lp.endRow(-inf, -win.p(j));
    }
  }
}

// Solves the window's LP (objective w + eps * sum s) with CLP and commits x
// and s of the tasks of rank [lo, commit_hi) into st.
void solveAndCommit(const Window& win, const Rows& lp_rows, int32_t commit_hi, double eps,
                    double seconds, int64_t iterations, LpState& st) {
  const double inf = COIN_DBL_MAX;
  const TaskGraph& tg = win.tg;
  const std::vector<int32_t>& edges = win.edges;
  const int num_cols = win.numCols();
  std::vector<double> col_lb(static_cast<size_t>(num_cols), 0.0), col_ub(static_cast<size_t>(num_cols), inf),
      obj(static_cast<size_t>(num_cols), 0.0);
  for (size_t k = 0; k < edges.size(); ++k) col_ub[k] = 1.0;
  for (int k = 0; k < win.numTasks(); ++k) obj[edges.size() + static_cast<size_t>(k)] = eps;
  obj[static_cast<size_t>(win.wcol())] = 1.0;

  CoinPackedMatrix matrix(/*colordered=*/true, lp_rows.rows.data(), lp_rows.cols.data(),
                          lp_rows.vals.data(), static_cast<CoinBigIndex>(lp_rows.vals.size()));
  matrix.setDimensions(static_cast<int>(lp_rows.row_lb.size()), num_cols);
  ClpSimplex lp;
  lp.setLogLevel(0);
  lp.loadProblem(matrix, col_lb.data(), col_ub.data(), obj.data(), lp_rows.row_lb.data(),
                 lp_rows.row_ub.data());
  // Note [An LP that does not depend on the clock] (favouriteChildren).
  if (iterations > 0) lp.setMaximumIterations(static_cast<int>(std::min<int64_t>(iterations, 1 << 30)));
  lp.setMaximumSeconds(std::max(seconds, 1e-3));
  // Dual simplex from a crash basis, after presolve: the fastest of CLP's
  // methods on these degenerate scheduling LPs (measured: bench/RESULTS.md).
  ClpSolve solve;
  solve.setSolveType(ClpSolve::useDual);
  solve.setSpecialOption(0, 1);  // crash
  lp.initialSolve(solve);
  const double* sol = lp.getColSolution();
  st.optimal = st.optimal && lp.isProvenOptimal();
  st.w = sol[win.wcol()];
  for (size_t k = 0; k < edges.size(); ++k) {
    if (win.rankOf(tg.succs[static_cast<size_t>(edges[k])]) < commit_hi) {
      st.x[static_cast<size_t>(edges[k])] = sol[k];
    }
  }
  for (int32_t r = win.lo; r < commit_hi; ++r) {
    int32_t t = tg.topo[static_cast<size_t>(r)];
    st.s[static_cast<size_t>(t)] = sol[win.scol(t)];
  }
}

// 1. Solves the LP over the tasks of topological rank [lo, hi) and commits
// x of the edges into, and s of, the tasks of rank [lo, commit_hi). Tasks
// below lo have committed start times; their edges into the window enter
// as s_i + p_i + c_e x_e <= s_j with s_i fixed, and a parent's "one
// favourite" row counts what earlier windows committed and leaves room for
// its edges beyond the window (each may still be 1). With lo = 0 and hi =
// n this is the whole LP of place_msct.h. The objective is w + eps * sum s:
// the small second term pins every start to its earliest LP-feasible time,
// which the next window reads.
void solveWindow(const TaskGraph& tg, const Edges& ed, int32_t lo, int32_t hi, int32_t commit_hi,
                 double eps, double seconds, int64_t iterations, LpState& st, MSctStats* stats) {
  const Window win = windowColumns(tg, ed, lo, hi);
  Rows rows;
  addPrecedenceRows(ed, win, st, rows);
  addFavouriteChildRows(ed, win, st, rows);
  addFavouredParentAndMakespanRows(ed, win, rows);
  solveAndCommit(win, rows, commit_hi, eps, seconds, iterations, st);
  if (stats) {
    stats->lp_rows += static_cast<int64_t>(rows.row_lb.size());
    stats->lp_columns += win.numCols();
    ++stats->lp_windows;
  }
}

}  // namespace

std::vector<int32_t> favouriteChildren(const TaskGraph& tg, const DeviceModel& machine,
                                       const MSctOptions& options) {
  MP_CHECK(options.threshold >= 0 && options.threshold <= 1, ConfigError,
           "modelpar {}: threshold must lie in [0, 1], got {}", kMSctPassId, options.threshold);
  MP_CHECK(options.lp_iteration_limit >= 0, ConfigError,
           "modelpar {}: lp_iteration_limit must be >= 0 (0: none), got {}", kMSctPassId,
           options.lp_iteration_limit);
  MP_CHECK(options.lp_window_tasks >= 0 && options.lp_window_overlap >= 0, ConfigError,
           "modelpar {}: lp_window_tasks ({}) and lp_window_overlap ({}) must be >= 0",
           kMSctPassId, options.lp_window_tasks, options.lp_window_overlap);
  auto n = static_cast<size_t>(tg.numTasks());
  size_t num_edges = tg.succs.size();
  std::vector<int32_t> favourite(n, -1);
  if (options.stats) *options.stats = MSctStats{};
  if (num_edges == 0) return favourite;
  Edges ed;
  ed.cost = edgeCosts(tg, machine);
  ed.src.resize(num_edges);
  ed.in.resize(n);
  for (int32_t i = 0; i < tg.numTasks(); ++i) {
    for (auto e = tg.succ_begin[static_cast<size_t>(i)]; e < tg.succ_begin[static_cast<size_t>(i) + 1]; ++e) {
      ed.src[static_cast<size_t>(e)] = i;
      ed.in[static_cast<size_t>(tg.succs[static_cast<size_t>(e)])].push_back(e);
    }
  }

  // 1. The LP: whole, or window by window in topological order.
  // Note [An LP that does not depend on the clock]
  // ~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~
  // As with MadPipe's pattern ILP (Note [A pattern that does not depend on
  // the clock] in partition_madpipe.cpp): an LP stopped by its time limit
  // ends at the basis the machine's load let CLP reach, so two ranks placing
  // the same step on a loaded machine could round different favourites and
  // disagree on the plan (a plan-hash ConfigError). lp_iteration_limit stops
  // each solve after that many simplex iterations, the same everywhere; the
  // time limit, shared by the windows, stays as a backstop set well above
  // what the iterations take.
  auto t0 = std::chrono::steady_clock::now();
  LpState st;
  st.x.assign(num_edges, 1.0);
  st.s.assign(n, 0.0);
  auto total = static_cast<int32_t>(n);
  int32_t window = options.lp_window_tasks > 0 && total > options.lp_whole_max_tasks &&
                           options.lp_window_tasks < total
                       ? options.lp_window_tasks : total;
  double eps = window < total ? 1e-3 / static_cast<double>(window) : options.lp_start_weight;
  for (int32_t lo = 0; lo < total; lo += window) {
    double left = options.lp_time_limit_s -
                  std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    int32_t commit_hi = std::min(total, lo + window);
    int32_t hi = std::min(total, commit_hi + options.lp_window_overlap);
    solveWindow(tg, ed, lo, hi, commit_hi, eps, left, options.lp_iteration_limit, st, options.stats);
  }
  if (options.stats) {
    options.stats->lp_optimal = st.optimal;
    options.stats->lp_makespan_us = st.w;
    options.stats->lp_seconds =
        std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  }
  const std::vector<double>& x = st.x;
  const std::vector<double>& c = ed.cost;

  // 2. Rounding that keeps one favourite child per parent, one favoured parent per child.
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
    auto i = static_cast<size_t>(ed.src[static_cast<size_t>(e)]);
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
