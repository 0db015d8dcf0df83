// Periods of MadPipe vs PipeDream's DP vs torchgpipe's block partition on
// synthetic ResNet-like chains in the MadPipe paper's ranges (seed 004 §5:
// 2-8 devices, 3-16 GB per device, 12 and 24 GB/s), and the run time of each
// partitioner on a 200-layer chain at 8 devices (issue 6's benchmark; results
// in bench/RESULTS.md). No PyTorch.
//
//   cmake --build BUILD --target modelpar_bench_partition
//   BUILD/bench/modelpar_bench_partition [--rows] [--reps N] [--buckets V,M]
// (--buckets: MadPipe's delay / memory buckets, default 8,16)
//   BUILD/bench/modelpar_bench_partition --phase2 [SECONDS]
// reports instead, for every MadPipe plan whose special device holds several
// stages, the DP's period and the period of the §4.3 ILP's pattern (CBC
// limit SECONDS per solve, default 10).
//
// Chains: bottleneck ResNets (blocks per stage 3-4-6-3 = 50 layers, 3-4-23-3
// = 101, 3-24-36-3 = 200 with stem and fc) on 1000x1000 images, batch 8,
// fp32, as in the paper's set-up. Per conv layer: time = 2 B H W Cin Cout k^2
// / 8 TFLOP/s forward, twice that backward, + 20 us each; weights Cin Cout
// k^2 x 4 B (x3 copies); stored = its input (MadPipe's a_{l-1}); the cuts inside a block
// also carry the block input (the skip edge). Plans are scheduled with 1F1B*
// as in the paper (PipeDream's and the block partition at the least period
// at which their memory fits); MadPipe's plans that share a device get the
// period of their §4.3 ILP pattern; micro-batches are a stream (m = 10^6).
#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <map>
#include <string>
#include <string_view>
#include <vector>

#include <fmt/format.h>

#include "ir/error.h"
#include "passes/pipeline/partition.h"

namespace mp = modelpar::passes;

namespace {

using Clock = std::chrono::steady_clock;
constexpr double kFlops = 8e12;
constexpr int64_t kBatch = 8, kImage = 1000, kFloat = 4;

int64_t tensorBytes(int64_t ch, int64_t hw) { return kBatch * ch * hw * hw * kFloat; }

mp::ChainLayer conv(const std::string& name, int64_t cin, int64_t cout, int64_t k, int64_t hw_in,
                    int64_t hw_out, int64_t skip_bytes) {
  mp::ChainLayer x;
  x.name = name;
  double flops = 2.0 * static_cast<double>(kBatch * hw_out * hw_out * cin * cout * k * k);
  x.fwd_us = flops / kFlops * 1e6 + 20;
  x.bwd_us = 2 * flops / kFlops * 1e6 + 20;
  x.weight_bytes = cin * cout * k * k * kFloat;
  x.stored_bytes = tensorBytes(cin, hw_in);
  x.out_bytes = tensorBytes(cout, hw_out) + skip_bytes;
  return x;
}

mp::LayerChain resnet(const std::vector<int>& blocks) {
  mp::LayerChain c;
  int64_t hw = kImage / 4;  // stem: 7x7 stride 2, then max-pool
  mp::ChainLayer stem = conv("stem", 3, 64, 7, kImage, kImage / 2, 0);
  stem.out_bytes = tensorBytes(64, hw);
  c.layers.push_back(stem);
  int64_t cin = 64;
  for (size_t s = 0; s < blocks.size(); ++s) {
    int64_t mid = int64_t{64} << s;
    for (int b = 0; b < blocks[s]; ++b) {
      int64_t hw_out = (b == 0 && s > 0) ? (hw + 1) / 2 : hw;
      int64_t skip = tensorBytes(cin, hw);
      std::string n = fmt::format("s{}.b{}", s, b);
      c.layers.push_back(conv(n + ".c1", cin, mid, 1, hw, hw, skip));
      c.layers.push_back(conv(n + ".c2", mid, mid, 3, hw, hw_out, skip));
      c.layers.push_back(conv(n + ".c3", mid, 4 * mid, 1, hw_out, hw_out, 0));
      cin = 4 * mid;
      hw = hw_out;
    }
  }
  mp::ChainLayer fc = conv("fc", cin, 1000, 1, 1, 1, 0);
  fc.stored_bytes = kBatch * cin * kFloat;
  fc.out_bytes = 0;
  c.layers.push_back(fc);
  c.layers.back().out_bytes = 0;
  return c;
}

struct Result {
  double period_ms = INFINITY;
  double seconds = 0;
};

Result run(const mp::LayerChain& c, mp::PartitionOptions o, const std::string& method) {
  o.method = method;
  auto t0 = Clock::now();
  Result r;
  try {
    r.period_ms = mp::partitionChain(c, o).period_us / 1e3;
  } catch (const modelpar::PlanDoesNotFitError&) {
  }
  r.seconds = std::chrono::duration<double>(Clock::now() - t0).count();
  return r;
}

std::string ms(double v) { return std::isfinite(v) ? fmt::format("{:.0f}", v) : "—"; }

}  // namespace

// MadPipe's phase 2 on every case: for plans that put several stages on one
// device, how far the ILP's pattern raised the DP's period, and its cost.
int checkPatterns(double limit_s, const std::vector<int>& devices, const std::vector<double>& memory_gb,
                  const std::vector<double>& bandwidth_gbs) {
  int plans = 0, shared = 0, with_pattern = 0, raised = 0;
  double worst_ratio = 1, worst_s = 0;
  for (const std::vector<int>& blocks : {std::vector<int>{3, 4, 6, 3}, std::vector<int>{3, 4, 23, 3}}) {
    mp::LayerChain c = resnet(blocks);
    for (double bw : bandwidth_gbs) {
      for (double gb : memory_gb) {
        for (int n : devices) {
          mp::PartitionOptions o;
          o.method = "madpipe";
          o.devices = n;
          o.microbatches = 1000000;
          o.memory_bytes = static_cast<int64_t>(gb * 1e9);
          o.bandwidth_bytes_per_s = bw * 1e9;
          o.madpipe_pattern_time_limit_s = limit_s;
          auto t0 = Clock::now();
          mp::StagePartition p;
          try {
            p = mp::partitionChain(c, o);
          } catch (const modelpar::PlanDoesNotFitError&) {
            continue;
          }
          double sec = std::chrono::duration<double>(Clock::now() - t0).count();
          ++plans;
          if (p.dp_period_us == 0) continue;  // no shared device: 1F1B* is the pattern
          ++shared;
          worst_s = std::max(worst_s, sec);
          if (p.pattern) ++with_pattern;
          double ratio = p.period_us / p.dp_period_us;
          if (ratio > 1 + 1e-9) ++raised;
          worst_ratio = std::max(worst_ratio, ratio);
          std::printf("%s, %.0f GB/s, %.0f GB, %d devices: %d stages, DP %.0f ms, with pattern %.0f ms "
                      "(%.2f s in all)\n", blocks[2] == 6 ? "resnet50-like" : "resnet101-like", bw, gb,
                      n, p.numStages(), p.dp_period_us / 1e3, p.period_us / 1e3, sec);
        }
      }
    }
  }
  std::printf("\n%d MadPipe plans; %d share a device between stages, %d of them got a pattern; the "
              "pattern raised the DP's period in %d (at most x%.2f); slowest plan %.2f s\n",
              plans, shared, with_pattern, raised, worst_ratio, worst_s);
  return 0;
}

int main(int argc, char** argv) {
  bool rows = false;
  int reps = 3, delay_buckets = mp::PartitionOptions{}.madpipe_delay_buckets,
      memory_buckets = mp::PartitionOptions{}.madpipe_memory_buckets;
  double ilp_limit = 0;
  for (int i = 1; i < argc; ++i) {
    std::string_view a = argv[i];
    if (a == "--rows") rows = true;
    else if (a == "--phase2") ilp_limit = (i + 1 < argc && argv[i + 1][0] != '-') ? std::atof(argv[++i]) : 10;
    else if (a == "--reps" && i + 1 < argc) reps = std::atoi(argv[++i]);
    else if (a == "--buckets" && i + 1 < argc) {
      std::string v = argv[++i];
      delay_buckets = std::atoi(v.c_str());
      memory_buckets = std::atoi(v.substr(v.find(',') + 1).c_str());
    }
  }
  const std::vector<int> devices{2, 3, 4, 6, 8};
  const std::vector<double> memory_gb{3, 4, 6, 8, 10, 12, 16};
  const std::vector<double> bandwidth_gbs{12, 24};
  if (ilp_limit > 0) return checkPatterns(ilp_limit, devices, memory_gb, bandwidth_gbs);
  struct Net { std::string name; std::vector<int> blocks; };
  const std::vector<Net> nets{{"resnet50-like", {3, 4, 6, 3}}, {"resnet101-like", {3, 4, 23, 3}}};

  std::printf("## Periods (ms; 1F1B*): MadPipe vs PipeDream DP vs block partition (balance-time)\n");
  if (rows) std::printf("net,devices,memory_gb,bandwidth_gbs,block_ms,pipedream_ms,madpipe_ms,madpipe_load_ms\n");
  int worse = 0, cases = 0, pd_fail = 0, mp_fail = 0;
  for (const Net& net : nets) {
    mp::LayerChain c = resnet(net.blocks);
    std::printf("\n### %s: %d layers, %.0f ms per micro-batch on one device\n", net.name.c_str(),
                c.size(), c.totalTime() / 1e3);
    // geometric mean of PipeDream / MadPipe per memory size, over devices and bandwidths
    std::map<double, std::pair<double, int>> geo;
    for (double bw : bandwidth_gbs) {
      std::printf("\n%s, %.0f GB/s — MadPipe ms (PipeDream / MadPipe, block / MadPipe)\n\n| memory |",
                  net.name.c_str(), bw);
      for (int n : devices) std::printf(" %d devices |", n);
      std::printf("\n|---|");
      for (size_t i = 0; i < devices.size(); ++i) std::printf("---|");
      std::printf("\n");
      for (double gb : memory_gb) {
        std::printf("| %.0f GB |", gb);
        for (int n : devices) {
          mp::PartitionOptions o;
          o.madpipe_delay_buckets = delay_buckets;
          o.madpipe_memory_buckets = memory_buckets;
          o.devices = n;
          o.microbatches = 1000000;
          o.memory_bytes = static_cast<int64_t>(gb * 1e9);
          o.bandwidth_bytes_per_s = bw * 1e9;
          Result blk = run(c, o, "balance-time"), pd = run(c, o, "balance-time-comm"), md = run(c, o, "madpipe");
          double load = NAN;
          if (std::isfinite(md.period_ms)) {
            o.method = "madpipe";
            load = mp::partitionChain(c, o).load_period_us / 1e3;
          }
          if (rows) {
            std::printf("%s,%d,%.0f,%.0f,%.1f,%.1f,%.1f,%.1f\n", net.name.c_str(), n, gb, bw,
                        blk.period_ms, pd.period_ms, md.period_ms, load);
          }
          ++cases;
          if (!std::isfinite(md.period_ms)) ++mp_fail;
          if (std::isfinite(md.period_ms) && !std::isfinite(pd.period_ms)) ++pd_fail;
          if (md.period_ms > pd.period_ms * (1 + 1e-9)) ++worse;
          if (std::isfinite(md.period_ms) && std::isfinite(pd.period_ms)) {
            geo[gb].first += std::log(pd.period_ms / md.period_ms);
            geo[gb].second += 1;
          }
          auto ratio = [&](double x) {
            return std::isfinite(x) && std::isfinite(md.period_ms) ? fmt::format("{:.2f}", x / md.period_ms) : "—";
          };
          std::printf(" %s (%s, %s) |", ms(md.period_ms).c_str(), ratio(pd.period_ms).c_str(),
                      ratio(blk.period_ms).c_str());
        }
        std::printf("\n");
      }
    }
    std::printf("\n%s: geometric mean of PipeDream / MadPipe over devices and bandwidths (both fit)\n\n"
                "| memory | ratio | cases |\n|---|---|---|\n", net.name.c_str());
    for (auto& [gb, s] : geo) {
      std::printf("| %.0f GB | %s | %d |\n", gb, s.second ? fmt::format("{:.2f}", std::exp(s.first / s.second)).c_str() : "—",
                  s.second);
    }
  }
  std::printf("\n%d cases: MadPipe worse than PipeDream in %d; PipeDream fits nowhere while MadPipe "
              "fits in %d; MadPipe fits nowhere in %d\n", cases, worse, pd_fail, mp_fail);

  // Run times at 200 layers, 8 devices.
  mp::LayerChain big = resnet({3, 24, 36, 3});
  std::printf("\n## Run time, %d layers, 8 devices, 12 GB/s (best of %d)\n\n"
              "| memory | balance-time s | pipedream s | madpipe DP s | period ms | madpipe DP + pattern s | period ms |\n"
              "|---|---|---|---|---|---|---|\n",
              big.size(), reps);
  for (double gb : {4.0, 8.0, 16.0}) {
    mp::PartitionOptions o;
    o.madpipe_delay_buckets = delay_buckets;
    o.madpipe_memory_buckets = memory_buckets;
    o.devices = 8;
    o.microbatches = 1000000;
    o.memory_bytes = static_cast<int64_t>(gb * 1e9);
    o.bandwidth_bytes_per_s = 12e9;
    Result best[4];
    const char* methods[4] = {"balance-time", "balance-time-comm", "madpipe", "madpipe"};
    for (int k = 0; k < 4; ++k) {
      best[k].seconds = INFINITY;
      o.madpipe_pattern_time_limit_s = k == 2 ? 0 : 10;
      for (int r = 0; r < reps; ++r) {
        Result x = run(big, o, methods[k]);
        if (x.seconds < best[k].seconds) best[k] = x;
      }
    }
    std::printf("| %.0f GB | %.4f | %.4f | %.3f | %s | %.3f | %s |\n", gb, best[0].seconds,
                best[1].seconds, best[2].seconds, ms(best[2].period_ms).c_str(), best[3].seconds,
                ms(best[3].period_ms).c_str());
  }
  return 0;
}
