// Pass `place-msct`: Baechi's memory-constrained Small Communication Times
// placement (algorithms.md §1.7; the favourite-child LP relaxation of Hanen
// & Munier).
//
// Stage 1, favourite children. Solve with COIN-OR CLP
//   minimise w  subject to, for every task i and edge e = (i, j):
//     s_i + p_i + c_e x_e <= s_j          (x_e = 0: i and j share a device)
//     sum_j x_ij >= outdeg(i) - 1         (at most one favourite child)
//     sum_i x_ij >= indeg(j) - 1          (at most one favoured parent)
//     s_i + p_i <= w,  0 <= x_e <= 1,  s_i >= 0
// where p_i is the task's time and c_e the time to move the edge's tensors
// over an average link. Large graphs (more than lp_whole_max_tasks tasks)
// solve it window by window: the tasks of topological ranks [k W, (k+1) W)
// with the start times of earlier tasks fixed to what earlier windows found,
// a parent's "one favourite" row reduced by what earlier windows committed
// and by the edges beyond the window, and w + eps * sum s_i as objective
// (eps small: it pins each start to its earliest LP time for the next
// window). Each window converges fast; the stitched solution is feasible
// for the whole LP but not optimal for it. Rounding: edges with x_e < threshold (and c_e > 0)
// are candidates; taken in increasing x_e (larger c_e first on ties), an
// edge becomes i's favourite child only while i has none and j has no
// favoured parent, so both "one" rules hold after rounding.
// Stage 2, scheduling: m-ETF (place_metf.h), except that a device that just
// ran task i and is where i's favourite child f can start earliest waits for
// f, and only runs another task first if that task is urgent (it could not
// start later than now on any device where it fits).
//
// Preconditions: a cost on every node. Guarantees: those of m-ETF. With zero
// communication the schedule is a greedy list schedule (Graham's bound);
// when every transfer costs more than the whole computation, a graph with a
// single source stays on one device. Does not: use the LP's start times
// beyond the favourites.
#pragma once

#include <string_view>

#include "ir/graph.h"
#include "passes/cost/device_model.h"
#include "passes/place/coarsen.h"
#include "passes/place/placement.h"
#include "passes/place/task_graph.h"

namespace modelpar::passes {

inline constexpr std::string_view kMSctPassId = "place-msct";

/// What stage 1 found, for reports and benchmarks.
struct MSctStats {
  bool lp_optimal = false;     ///< CLP proved optimality
  double lp_makespan_us = 0;   ///< w: the LP bound (with windows: the last window's w)
  double lp_seconds = 0;       ///< wall time of the solve
  int64_t lp_rows = 0, lp_columns = 0;  ///< summed over windows
  int64_t lp_windows = 0;      ///< LPs solved (1 without windows)
  int64_t favourite_edges = 0; ///< edges kept after rounding
};

struct MSctOptions {
  /// Placement units and groups; null: one unit per node, groups by layer.
  const Coarsening* units = nullptr;
  /// x_e below this rounds to "same device" (Baechi's class default 0.5).
  double threshold = 0.5;
  /// CLP's limit on simplex iterations per LP solve (per window with
  /// windows; 0: none). It, not the clock, decides where an unfinished solve
  /// stops, so two processes placing the same graph get the same placement
  /// under any load (Note [An LP that does not depend on the clock] in
  /// place_msct.cpp); on reaching it the favourites of the basis reached are
  /// used and MSctStats::lp_optimal is false. The default is meant to lie
  /// above what one LP of at most lp_whole_max_tasks tasks (or one window)
  /// takes to converge, so that it only stops runaway solves.
  int64_t lp_iteration_limit = 100000;
  /// A backstop for the whole LP (all windows), set well above what the
  /// iterations take: on expiry the favourites of the best basis are used.
  double lp_time_limit_s = 20.0;
  /// Graphs of more tasks than lp_whole_max_tasks solve the LP over windows
  /// of lp_window_tasks tasks in topological order, each with the start
  /// times earlier windows fixed (place_msct.cpp, solveWindow): at 10k tasks
  /// 40 windows converge in 0.4 s where the whole LP does not in 20 s
  /// (bench/RESULTS.md). lp_window_tasks = 0: always the whole LP.
  int32_t lp_window_tasks = 250;
  int32_t lp_whole_max_tasks = 1000;
  /// Tasks past a window's end the window's LP also sees (their values are
  /// re-solved by the next window), so its last tasks see their successors.
  int32_t lp_window_overlap = 0;
  /// Weight of sum s_i next to the makespan in the whole-graph objective
  /// (windows always use a small one, to pin start times).
  double lp_start_weight = 0.0;
  /// Filled when non-null.
  MSctStats* stats = nullptr;
};

Placement placeMSct(const ir::Graph& g, const DeviceModel& machine,
                    const MSctOptions& options = {});
Placement placeMSct(const ir::Graph& g, const TaskGraph& tg, const DeviceModel& machine,
                    const MSctOptions& options = {});

/// Stage 1 alone: favourite child of every task (-1 for none), from the LP.
std::vector<int32_t> favouriteChildren(const TaskGraph& tg, const DeviceModel& machine,
                                       const MSctOptions& options = {});

}  // namespace modelpar::passes
