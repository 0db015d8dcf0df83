// Calibration fits: exact recovery on clean samples, robustness to noise,
// non-negativity, and the errors for samples that determine nothing.
#include "passes/cost/calibrate.h"

#include <gtest/gtest.h>

#include <random>

#include "ir/error.h"

namespace modelpar::passes {
namespace {

TEST(CalibrateLink, RecoversLatencyAndBandwidthExactly) {
  // Baechi's GPU0 -> GPU1 fit: time = 0.0001754 us/byte * bytes + 134 us.
  std::vector<TransferSample> s;
  for (int p = 0; p <= 29; p += 3) {
    double b = double(int64_t{1} << p);
    s.push_back({b, 0.0001754 * b + 134});
  }
  LinkSpec l = calibrateLink(s);
  EXPECT_NEAR(l.latency_us, 134.0, 1e-6);
  EXPECT_NEAR(l.bandwidth, 1e6 / 0.0001754, 1.0);
}

TEST(CalibrateLink, AveragesNoise) {
  std::mt19937 rng(7);
  std::normal_distribution<double> noise(0.0, 0.5);
  std::vector<TransferSample> s;
  for (int i = 1; i <= 50; ++i) {
    double b = 1e6 * i;
    s.push_back({b, 10.0 + b / 1e4 + noise(rng)});  // 10 us + 10 GB/s
  }
  LinkSpec l = calibrateLink(s);
  EXPECT_NEAR(l.latency_us, 10.0, 0.5);
  EXPECT_NEAR(l.bandwidth / 1e10, 1.0, 1e-3);
}

TEST(CalibrateLink, ClampsANegativeInterceptToZero) {
  // Points on time = bytes / 1e3 - 5: the non-negative fit drops the intercept.
  std::vector<TransferSample> s = {{1e4, 5}, {2e4, 15}, {3e4, 25}};
  LinkSpec l = calibrateLink(s);
  EXPECT_GE(l.latency_us, 0.0);
  EXPECT_GT(l.bandwidth, 0.0);
}

TEST(CalibrateLink, RejectsSamplesOfOneSizeAndFlatTimes) {
  try {
    calibrateLink({{1024, 3.0}, {1024, 3.1}});
    FAIL();
  } catch (const ConfigError& e) {
    EXPECT_NE(std::string(e.what()).find("at least two sizes"), std::string::npos) << e.what();
  }
  try {
    calibrateLink({{1024, 5.0}, {4096, 5.0}, {8192, 4.0}});
    FAIL();
  } catch (const ConfigError& e) {
    EXPECT_NE(std::string(e.what()).find("does not grow"), std::string::npos) << e.what();
  }
}

TEST(CalibrateDevice, RecoversRooflineParameters) {
  // time = bytes / 2e12 * 1e6 + flops / 1e14 * 1e6 + 7 us.
  std::vector<KernelSample> s;
  for (double m : {1024.0, 2048.0, 4096.0, 8192.0}) {
    for (double k : {512.0, 4096.0}) {
      double flops = 2 * m * m * k, bytes = 4 * (2 * m * k + m * m);
      s.push_back({bytes, flops, bytes / 2e6 + flops / 1e8 + 7.0});
    }
  }
  DeviceSpec d = calibrateDevice(s);
  EXPECT_NEAR(d.memory_bandwidth / 2e12, 1.0, 1e-6);
  EXPECT_NEAR(d.peak_flops / 1e14, 1.0, 1e-6);
  EXPECT_NEAR(d.launch_overhead_us, 7.0, 1e-4);
  EXPECT_THROW(calibrateDevice({s[0], s[1]}), ConfigError);
}

TEST(CalibrateDevice, FitsSmallKernelsRelativelySoTheLaunchOverheadSurvives) {
  // 1 us launch; big matmuls at 1e11 FLOP/s take milliseconds and carry 1%
  // noise, which an absolute fit would trade against the 1 us kernels.
  std::vector<KernelSample> s;
  for (double n : {256.0, 512.0, 1024.0}) {
    double flops = 2 * n * n * n, bytes = 12 * n * n;
    s.push_back({bytes, flops, (flops / 1e5 + bytes / 2e4 + 1.0) * (n == 512.0 ? 1.01 : 0.99)});
  }
  for (double numel : {1e3, 1e5, 1e6}) s.push_back({12 * numel, numel, 12 * numel / 2e4 + numel / 1e5 + 1.0});
  s.push_back({8, 1, 1.0});
  s.push_back({8, 1, 1.05});
  DeviceSpec d = calibrateDevice(s);
  EXPECT_NEAR(d.launch_overhead_us, 1.0, 0.1);
  EXPECT_NEAR(d.peak_flops / 1e11, 1.0, 0.05);
  EXPECT_NEAR(d.memory_bandwidth / 2e10, 1.0, 0.05);
}

TEST(FitNonNegative, WeightsSamples) {
  // Two points pull the line apart; the heavy one wins.
  LinearFit f = fitNonNegative({{1}, {2}, {3}, {3}}, {1, 2, 3, 5}, {1, 1, 1, 1e-9});
  EXPECT_NEAR(f.coefficients[0], 1.0, 1e-6);
  EXPECT_NEAR(f.intercept, 0.0, 1e-6);
  EXPECT_THROW(fitNonNegative({{1}, {2}}, {1, 2}, {1, 0}), ConfigError);
  EXPECT_THROW(fitNonNegative({{1}, {2}}, {1, 2}, {1}), ConfigError);
}

TEST(FitNonNegative, ReportsGoodnessOfFit) {
  LinearFit f = fitNonNegative({{1}, {2}, {3}, {4}}, {3, 5, 7, 9});
  EXPECT_NEAR(f.coefficients[0], 2.0, 1e-9);
  EXPECT_NEAR(f.intercept, 1.0, 1e-9);
  EXPECT_NEAR(f.r2, 1.0, 1e-12);
  EXPECT_THROW(fitNonNegative({{1}}, {1}), ConfigError);
}

}  // namespace
}  // namespace modelpar::passes
