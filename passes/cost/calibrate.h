// Calibration: fits device and link parameters to micro-benchmark samples by
// linear least squares, as Baechi's communication benchmark (time = a*bytes +
// b, algorithms.md §1.2) and DistIR's calibrate_simulator (time = a*bytes +
// b*flops + c with non-negative coefficients, §3.3) do. Pure functions: the
// runtime measures the samples; these only fit them.
#pragma once

#include <cstdint>
#include <vector>

#include "passes/cost/device_model.h"

namespace modelpar::passes {

/// One timed transfer of `bytes` between two devices.
struct TransferSample {
  double bytes = 0;
  double time_us = 0;
};

/// One timed kernel with its memory traffic and FLOPs.
struct KernelSample {
  double bytes = 0;
  double flops = 0;
  double time_us = 0;
};

/// y ~ coefficients . x (+ intercept), with every coefficient >= 0.
struct LinearFit {
  std::vector<double> coefficients;  ///< one per feature
  double intercept = 0.0;
  double r2 = 0.0;  ///< coefficient of determination (1 = exact)
};

/// Non-negative least squares of y on the feature rows `x` plus an intercept
/// (also >= 0), solved exactly by trying every active set (features <= 4).
/// With `weights` (one > 0 per sample) it minimises sum w_i (y_i - fit_i)^2.
/// Throws ConfigError when there are fewer samples than unknowns or the
/// features are constant.
LinearFit fitNonNegative(const std::vector<std::vector<double>>& x, const std::vector<double>& y,
                         const std::vector<double>& weights = {});

/// Fits time_us = latency_us + bytes / bandwidth. Throws ConfigError with the
/// sample count when fewer than two distinct sizes are given, or when the
/// time does not grow with size (no bandwidth can be inferred).
LinkSpec calibrateLink(const std::vector<TransferSample>& samples);

/// Fits time_us = bytes / memory_bandwidth + flops / peak_flops + launch and
/// returns `base` with those three fields replaced. The fit minimises
/// relative errors (weights 1 / time^2): kernel times span orders of
/// magnitude, and an absolute fit would let the largest kernels swamp the
/// small ones that determine the launch overhead. A coefficient that fits
/// to zero leaves the base value (the samples say nothing about it). Throws
/// ConfigError with fewer than three samples.
DeviceSpec calibrateDevice(const std::vector<KernelSample>& samples, DeviceSpec base = {});

}  // namespace modelpar::passes
