// Least-squares fits for calibrate.h. The systems are tiny (<= 5 unknowns),
// so normal equations with partial pivoting are accurate enough once the
// features are scaled to unit magnitude.
#include "passes/cost/calibrate.h"

#include <algorithm>
#include <cmath>
#include <limits>

#include "ir/check.h"

namespace modelpar::passes {
namespace {

constexpr size_t kMaxFeatures = 4;

// Solves A z = b in place (n <= 5) by Gaussian elimination; false if singular.
bool solve(std::vector<std::vector<double>> a, std::vector<double> b, std::vector<double>& z) {
  size_t n = b.size();
  for (size_t c = 0; c < n; ++c) {
    size_t p = c;
    for (size_t r = c + 1; r < n; ++r) {
      if (std::fabs(a[r][c]) > std::fabs(a[p][c])) p = r;
    }
    if (std::fabs(a[p][c]) < 1e-12) return false;
    std::swap(a[p], a[c]);
    std::swap(b[p], b[c]);
    for (size_t r = c + 1; r < n; ++r) {
      double f = a[r][c] / a[c][c];
      for (size_t k = c; k < n; ++k) a[r][k] -= f * a[c][k];
      b[r] -= f * b[c];
    }
  }
  z.assign(n, 0.0);
  for (size_t i = n; i-- > 0;) {
    double s = b[i];
    for (size_t k = i + 1; k < n; ++k) s -= a[i][k] * z[k];
    z[i] = s / a[i][i];
  }
  return true;
}

}  // namespace

LinearFit fitNonNegative(const std::vector<std::vector<double>>& x, const std::vector<double>& y,
                         const std::vector<double>& weights) {
  size_t m = y.size();
  MP_CHECK(m == x.size(), ConfigError,
           "modelpar calibrate: {} feature rows for {} measurements", x.size(), m);
  MP_CHECK(weights.empty() || weights.size() == m, ConfigError,
           "modelpar calibrate: {} weights for {} measurements", weights.size(), m);
  for (double w : weights) {
    MP_CHECK(w > 0 && std::isfinite(w), ConfigError,
             "modelpar calibrate: weights must be finite and > 0, got {}", w);
  }
  auto weight = [&](size_t i) { return weights.empty() ? 1.0 : weights[i]; };
  size_t f = m ? x[0].size() : 0;
  MP_CHECK(f >= 1 && f <= kMaxFeatures, ConfigError,
           "modelpar calibrate: needs 1 to {} features, got {}", kMaxFeatures, f);
  MP_CHECK(m >= f + 1, ConfigError,
           "modelpar calibrate: {} samples cannot fit {} coefficients and an intercept; measure "
           "at least {} sizes", m, f, f + 1);
  for (const auto& row : x) {
    MP_CHECK(row.size() == f, ConfigError, "modelpar calibrate: feature rows differ in length");
  }
  // Scale every column (intercept = column f) to unit max magnitude.
  size_t k = f + 1;
  std::vector<double> scale(k, 1.0);
  for (size_t j = 0; j < f; ++j) {
    double mx = 0;
    for (const auto& row : x) mx = std::max(mx, std::fabs(row[j]));
    scale[j] = mx > 0 ? mx : 1.0;
  }
  auto feature = [&](size_t i, size_t j) { return j == f ? 1.0 : x[i][j] / scale[j]; };

  // Try every subset of active (free) unknowns; keep the best feasible one.
  double best_sse = std::numeric_limits<double>::infinity();
  std::vector<double> best(k, 0.0);
  for (uint32_t mask = 1; mask < (1u << k); ++mask) {
    std::vector<size_t> cols;
    for (size_t j = 0; j < k; ++j) {
      if (mask & (1u << j)) cols.push_back(j);
    }
    size_t n = cols.size();
    std::vector<std::vector<double>> a(n, std::vector<double>(n, 0.0));
    std::vector<double> b(n, 0.0);
    for (size_t i = 0; i < m; ++i) {
      double w = weight(i);
      for (size_t r = 0; r < n; ++r) {
        double fr = feature(i, cols[r]);
        b[r] += w * fr * y[i];
        for (size_t c = 0; c < n; ++c) a[r][c] += w * fr * feature(i, cols[c]);
      }
    }
    std::vector<double> z;
    if (!solve(a, b, z)) continue;
    if (std::any_of(z.begin(), z.end(), [](double v) { return v < 0; })) continue;
    std::vector<double> coef(k, 0.0);
    for (size_t r = 0; r < n; ++r) coef[cols[r]] = z[r];
    double sse = 0;
    for (size_t i = 0; i < m; ++i) {
      double pred = 0;
      for (size_t j = 0; j < k; ++j) pred += coef[j] * feature(i, j);
      sse += weight(i) * (y[i] - pred) * (y[i] - pred);
    }
    if (sse < best_sse * (1 - 1e-12)) {
      best_sse = sse;
      best = coef;
    }
  }
  MP_CHECK(std::isfinite(best_sse), ConfigError,
           "modelpar calibrate: the samples do not determine a fit (constant features?)");
  LinearFit fit;
  for (size_t j = 0; j < f; ++j) fit.coefficients.push_back(best[j] / scale[j]);
  fit.intercept = best[f];
  double mean = 0, wsum = 0;
  for (size_t i = 0; i < m; ++i) {
    mean += weight(i) * y[i];
    wsum += weight(i);
  }
  mean /= wsum;
  double sst = 0;
  for (size_t i = 0; i < m; ++i) sst += weight(i) * (y[i] - mean) * (y[i] - mean);
  fit.r2 = sst > 0 ? 1.0 - best_sse / sst : 1.0;
  return fit;
}

LinkSpec calibrateLink(const std::vector<TransferSample>& samples) {
  std::vector<std::vector<double>> x;
  std::vector<double> y;
  double lo = std::numeric_limits<double>::infinity(), hi = -lo;
  for (const TransferSample& s : samples) {
    x.push_back({s.bytes});
    y.push_back(s.time_us);
    lo = std::min(lo, s.bytes);
    hi = std::max(hi, s.bytes);
  }
  MP_CHECK(samples.size() >= 2 && hi > lo, ConfigError,
           "modelpar calibrate: a link fit needs transfers of at least two sizes, got {} "
           "sample(s)", samples.size());
  LinearFit fit = fitNonNegative(x, y);
  MP_CHECK(fit.coefficients[0] > 0, ConfigError,
           "modelpar calibrate: transfer time does not grow with size over {} samples; measure "
           "larger transfers", samples.size());
  LinkSpec link;
  link.latency_us = fit.intercept;
  link.bandwidth = 1e6 / fit.coefficients[0];  // slope is us per byte
  return link;
}

DeviceSpec calibrateDevice(const std::vector<KernelSample>& samples, DeviceSpec base) {
  MP_CHECK(samples.size() >= 3, ConfigError,
           "modelpar calibrate: a device fit needs at least 3 kernel samples, got {}",
           samples.size());
  std::vector<std::vector<double>> x;
  std::vector<double> y, w;
  for (const KernelSample& s : samples) {
    MP_CHECK(s.time_us > 0, ConfigError,
             "modelpar calibrate: kernel sample with {} bytes and {} flops has time {} us; times "
             "must be > 0", s.bytes, s.flops, s.time_us);
    x.push_back({s.bytes, s.flops});
    y.push_back(s.time_us);
    w.push_back(1.0 / (s.time_us * s.time_us));
  }
  LinearFit fit = fitNonNegative(x, y, w);
  if (fit.coefficients[0] > 0) base.memory_bandwidth = 1e6 / fit.coefficients[0];
  if (fit.coefficients[1] > 0) base.peak_flops = 1e6 / fit.coefficients[1];
  base.launch_overhead_us = fit.intercept;
  return base;
}

}  // namespace modelpar::passes
