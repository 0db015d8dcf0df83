// MadPipe's second phase (seed 004 §4.3): a periodic pattern for a plan by an
// ILP on COIN-OR CBC. Declared in partition.h (periodicPatternIlp).
//
// Variables, with times in units of the period T (so every start is in
// [0, 1] and every duration d / T <= 1):
//   tau_o in [0, 1]   start of operation o within the period
//   h_o   integer     index shift: in period k, o processes micro-batch k - h_o
//   y_ij  binary      for two operations on one resource: i starts first
// Operations: F_s, B_s per stage on its device; act_c, grad_c per cut on the
// cut's own link (each C(c) / 2 long).
// Rows:
//   dependency o1 -> o2 (same micro-batch): h2 + tau2 >= h1 + tau1 + d1
//   cyclic exclusion of i, j on a resource (both orders, switched by y_ij):
//     y = 1: tau_j >= tau_i + d_i  and  tau_i + 1 >= tau_j + d_j
//     y = 0: the same with i and j swapped (big-M 2)
//   memory of device d: sum over its stages of a_s (h_B - h_F + 1) + fixed
//     (weights, buffers) <= capacity, in units of the largest a_s
// Objective: that activation memory, summed over devices.
// For a contiguous plan the optimum is 1F1B* (its Proposition 1: 1F1B*
// keeps the fewest micro-batches per stage), which the tests check.
#include <CbcModel.hpp>
#include <CoinPackedMatrix.hpp>
#include <OsiClpSolverInterface.hpp>

#include <algorithm>
#include <cmath>
#include <optional>
#include <utility>
#include <vector>

#include "ir/check.h"
#include "passes/pipeline/partition.h"

namespace modelpar::passes {
namespace {

constexpr size_t idx(int64_t i) { return static_cast<size_t>(i); }

struct Ilp {
  std::vector<int> row, col;
  std::vector<double> val, row_lb, row_ub;
  int rows = 0;
  // Adds sum coef[k] * x[cols[k]] >= lb.
  void atLeast(std::initializer_list<std::pair<int, double>> terms, double lb) {
    for (auto [c, v] : terms) {
      row.push_back(rows);
      col.push_back(c);
      val.push_back(v);
    }
    row_lb.push_back(lb);
    row_ub.push_back(COIN_DBL_MAX);
    ++rows;
  }
};

// The model being built: operations, columns, rows. Operation ids: F_s = s,
// B_s = S + s, act_c = 2S + c, grad_c = 3S - 1 + c.
struct PatternModel {
  const LayerChain& chain;
  const StagePartition& plan;
  const PartitionOptions& o;
  const double period_us;
  const int S, L, ops;
  std::vector<double> dur;
  std::vector<int> resource;
  std::vector<std::pair<int, int>> pairs;  // operations sharing a resource
  int tau0 = 0, h0 = 0, y0 = 0, cols = 0;
  std::vector<double> lb, ub, obj;
  Ilp ilp;

  PatternModel(const LayerChain& c, const StagePartition& p, const PartitionOptions& opt, double t)
      : chain(c), plan(p), o(opt), period_us(t), S(p.numStages()), L(c.size()), ops(4 * S - 2) {}

  // An operation's duration in periods, just under 1 at most.
  double d(int op) const { return std::min(1.0, dur[idx(op)] / period_us) * (1 - 1e-9); }

  // 1. Operations: their durations and resources (a device, or a cut's
  // link). False when one is longer than the period.
  bool addOperations() {
    dur.assign(idx(ops), 0.0);
    resource.assign(idx(ops), 0);
    for (int s = 0; s < S; ++s) {
      for (int i = plan.stage_begin[idx(s)]; i < plan.stageEnd(s, L); ++i) {
        dur[idx(s)] += chain.layers[idx(i)].fwd_us;
        dur[idx(S + s)] += chain.layers[idx(i)].bwd_us;
      }
      resource[idx(s)] = resource[idx(S + s)] = plan.stage_device[idx(s)];
      if (s + 1 < S) {
        double c = cutTime(chain, plan.stage_begin[idx(s) + 1] - 1, o) / 2;
        dur[idx(2 * S + s)] = dur[idx(3 * S - 1 + s)] = c;
        resource[idx(2 * S + s)] = resource[idx(3 * S - 1 + s)] = o.devices + s;
      }
    }
    for (double x : dur) {
      if (x > period_us * (1 + 1e-9)) return false;  // an operation longer than T
    }
    return true;
  }

  // 2. Columns: tau, h, then one y per pair of operations on a resource.
  void addColumns() {
    tau0 = 0;
    h0 = ops;
    for (int i = 0; i < ops; ++i) {
      for (int j = i + 1; j < ops; ++j) {
        if (resource[idx(i)] == resource[idx(j)]) pairs.push_back({i, j});
      }
    }
    y0 = 2 * ops;
    cols = y0 + static_cast<int>(pairs.size());
    const double h_max = 2.0 * ops + 2;
    lb.assign(idx(cols), 0.0);
    ub.assign(idx(cols), 1.0);
    obj.assign(idx(cols), 0.0);
    for (int i = 0; i < ops; ++i) ub[idx(h0 + i)] = h_max;
    ub[idx(h0)] = 0;  // F_0 has shift 0 by convention
  }

  // 3. Dependencies of one micro-batch.
  void addDependencies() {
    auto dep = [&](int a, int b) { ilp.atLeast({{h0 + b, 1}, {tau0 + b, 1}, {h0 + a, -1}, {tau0 + a, -1}}, d(a)); };
    for (int s = 0; s + 1 < S; ++s) {
      dep(s, 2 * S + s);
      dep(2 * S + s, s + 1);
      dep(S + s + 1, 3 * S - 1 + s);
      dep(3 * S - 1 + s, S + s);
    }
    dep(S - 1, 2 * S - 1);
  }

  // 4. Cyclic exclusion on each device and link.
  void addExclusions() {
    for (size_t k = 0; k < pairs.size(); ++k) {
      auto [i, j] = pairs[k];
      int y = y0 + static_cast<int>(k);
      ilp.atLeast({{tau0 + j, 1}, {tau0 + i, -1}, {y, -2}}, d(i) - 2);
      ilp.atLeast({{tau0 + i, 1}, {tau0 + j, -1}, {y, -2}}, d(j) - 3);
      ilp.atLeast({{tau0 + i, 1}, {tau0 + j, -1}, {y, 2}}, d(j));
      ilp.atLeast({{tau0 + j, 1}, {tau0 + i, -1}, {y, 2}}, d(i) - 1);
    }
  }

  // 5. Memory per device (scaled by the capacity) and the objective. False
  // when a device cannot hold even one micro-batch per stage.
  bool addMemory() {
    std::vector<int> zeros(idx(S), 0);
    std::vector<int64_t> fixed = stageMemory(chain, plan.stage_begin, zeros);
    std::vector<int64_t> act(idx(S), 0);
    for (int s = 0; s < S; ++s) {
      for (int i = plan.stage_begin[idx(s)]; i < plan.stageEnd(s, L); ++i) act[idx(s)] += chain.layers[idx(i)].stored_bytes;
    }
    // Rows and objective in units of the largest stage's activations, so that
    // coefficients are <= 1 whatever the capacity.
    const double unit = std::max<double>(1.0, static_cast<double>(*std::max_element(act.begin(), act.end())));
    const double cap = static_cast<double>(o.memory_bytes);
    for (int dev = 0; dev < o.devices; ++dev) {
      double room = cap;
      int first = ilp.rows;
      for (int s = 0; s < S; ++s) {
        if (plan.stage_device[idx(s)] != dev) continue;
        room -= static_cast<double>(fixed[idx(s)] + act[idx(s)]);
        double a = static_cast<double>(act[idx(s)]) / unit;
        ilp.row.insert(ilp.row.end(), {first, first});
        ilp.col.insert(ilp.col.end(), {h0 + S + s, h0 + s});
        ilp.val.insert(ilp.val.end(), {-a, a});  // -(h_B - h_F) a >= -room
        obj[idx(h0 + S + s)] += a;
        obj[idx(h0 + s)] -= a;
      }
      if (room < 0) return false;
      ilp.row_lb.push_back(-room / unit);
      ilp.row_ub.push_back(COIN_DBL_MAX);
      ++ilp.rows;
    }
    return true;
  }

  // 6. Solve: CBC stops at node_limit nodes when > 0 (Note [A pattern that
  // does not depend on the clock] in partition_madpipe.cpp), the time limit
  // a backstop. The best solution found, and whether it is proven optimal.
  std::optional<std::pair<std::vector<double>, bool>> solve(double time_limit_s, bool minimise_memory,
                                                           int64_t node_limit) {
    CoinPackedMatrix m(false, ilp.row.data(), ilp.col.data(), ilp.val.data(),
                       static_cast<CoinBigIndex>(ilp.val.size()));
    m.setDimensions(ilp.rows, cols);
    OsiClpSolverInterface si;
    si.messageHandler()->setLogLevel(0);
    if (!minimise_memory) std::fill(obj.begin(), obj.end(), 0.0);
    si.loadProblem(m, lb.data(), ub.data(), obj.data(), ilp.row_lb.data(), ilp.row_ub.data());
    for (int c = h0; c < cols; ++c) si.setInteger(c);
    CbcModel model(si);
    model.setLogLevel(0);
    model.messageHandler()->setLogLevel(0);
    model.setMaximumSeconds(time_limit_s);
    if (node_limit > 0) model.setMaximumNodes(static_cast<int>(std::min<int64_t>(node_limit, 1 << 30)));
    model.branchAndBound();
    const double* x = model.bestSolution();
    if (x == nullptr) return std::nullopt;
    return std::make_pair(std::vector<double>(x, x + cols), model.isProvenOptimal());
  }

  // 7. Read the pattern back and count its memory.
  std::optional<PeriodicPattern> readPattern(const std::vector<double>& x, bool optimal) const {
    PeriodicPattern p;
    p.period_us = period_us;
    p.optimal = optimal;
    auto shift = [&](int op) { return static_cast<int>(std::lround(x[idx(h0 + op)])); };
    auto start = [&](int op) { return std::clamp(x[idx(tau0 + op)], 0.0, 1.0) * period_us; };
    for (int s = 0; s < S; ++s) {
      p.fwd_start_us.push_back(start(s));
      p.bwd_start_us.push_back(start(S + s));
      p.fwd_shift.push_back(shift(s));
      p.bwd_shift.push_back(shift(S + s));
      p.stage_activations.push_back(shift(S + s) - shift(s) + 1);
      if (s + 1 < S) {
        p.act_start_us.push_back(start(2 * S + s));
        p.grad_start_us.push_back(start(3 * S - 1 + s));
        p.act_shift.push_back(shift(2 * S + s));
        p.grad_shift.push_back(shift(3 * S - 1 + s));
      }
    }
    std::vector<int64_t> per_stage = stageMemory(chain, plan.stage_begin, p.stage_activations);
    p.memory_bytes.assign(idx(o.devices), 0);
    for (int s = 0; s < S; ++s) p.memory_bytes[idx(plan.stage_device[idx(s)])] += per_stage[idx(s)];
    for (int64_t b : p.memory_bytes) {
      if (b > o.memory_bytes) return std::nullopt;  // CBC's tolerances let a row slip
    }
    return p;
  }
};

}  // namespace

std::optional<PeriodicPattern> periodicPatternIlp(const LayerChain& chain, const StagePartition& plan,
                                                  const PartitionOptions& o, double period_us,
                                                  double time_limit_s, bool minimise_memory,
                                                  int64_t node_limit) {
  const int S = plan.numStages();
  MP_CHECK(S >= 1 && std::isfinite(period_us) && period_us > 0, ConfigError,
           "modelpar partition-ilp: needs a plan with stages and a finite period > 0 (got {} "
           "stages, {} us)", S, period_us);
  PatternModel pm(chain, plan, o, period_us);
  if (!pm.addOperations()) return std::nullopt;
  pm.addColumns();
  pm.addDependencies();
  pm.addExclusions();
  if (!pm.addMemory()) return std::nullopt;
  auto solution = pm.solve(time_limit_s, minimise_memory, node_limit);
  if (!solution) return std::nullopt;
  return pm.readPattern(solution->first, solution->second);
}

}  // namespace modelpar::passes
