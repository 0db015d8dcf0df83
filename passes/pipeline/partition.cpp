// Pass `partition` (partition.h): schedules' memory, 1F1B* groups, plan
// evaluation, torchgpipe's balance, PipeDream's DP and the facade. MadPipe's
// DP lives in partition_madpipe.cpp.
#include "passes/pipeline/partition.h"

#include <algorithm>
#include <cmath>
#include <limits>

#include "ir/check.h"
#include "passes/cost/device_model.h"
#include "passes/option_names.h"

namespace modelpar::passes {

namespace {

// Index of a vector from an int.
constexpr size_t idx(int64_t i) { return static_cast<size_t>(i); }

constexpr double kInf = std::numeric_limits<double>::infinity();

// Exact min-max split of costs[0..L) into exactly `blocks` non-empty
// contiguous blocks, plus an extra per-boundary cost `edge(c)` (cut after c)
// that enters the max: best[p][j] over the first j items in p blocks.
template <typename Edge>
std::vector<int> minMaxSplit(std::span<const double> costs, int max_blocks, bool exact_count,
                             Edge edge) {
  const int L = static_cast<int>(costs.size());
  const int P = std::min(max_blocks, L);
  std::vector<double> prefix(idx(L) + 1, 0.0);
  for (int i = 0; i < L; ++i) prefix[idx(i) + 1] = prefix[idx(i)] + costs[idx(i)];
  auto at = [&](int p, int j) { return idx(p) * (idx(L) + 1) + idx(j); };
  std::vector<double> best(idx(P + 1) * (idx(L) + 1), kInf);
  std::vector<int> arg(best.size(), -1);
  best[at(0, 0)] = 0;
  for (int p = 1; p <= P; ++p) {
    for (int j = p; j <= L; ++j) {
      for (int k = j - 1; k >= p - 1; --k) {
        double prev = best[at(p - 1, k)];
        if (prev == kInf) continue;
        double v = std::max(prev, prefix[idx(j)] - prefix[idx(k)]);
        if (k > 0) v = std::max(v, edge(k - 1));
        if (v < best[at(p, j)]) {
          best[at(p, j)] = v;
          arg[at(p, j)] = k;
        }
      }
    }
  }
  int bp = P;
  if (!exact_count) {  // the fewest stages among equal optima
    bp = 1;
    for (int p = 2; p <= P; ++p) {
      if (best[at(p, L)] < best[at(bp, L)]) bp = p;
    }
  }
  std::vector<int> begin(idx(bp));
  for (int p = bp, j = L; p > 0; --p) {
    j = arg[at(p, j)];
    begin[idx(p) - 1] = j;
  }
  return begin;
}

void checkOptions(const LayerChain& chain, const PartitionOptions& o) {
  chain.validate();
  checkDevices(kPartitionPassId, o.devices);
  checkOneOf(kPartitionPassId, "partition", o.method, kPartitionMethodNames);
  MP_CHECK(o.microbatches >= 1, ConfigError,
           "modelpar partition: microbatches is {}; use at least 1", o.microbatches);
  MP_CHECK(o.memory_bytes > 0, ConfigError, "modelpar partition: memory_bytes is {}; give the "
           "capacity of one device in bytes", o.memory_bytes);
  MP_CHECK(o.device_memory_bytes.empty() || o.device_memory_bytes.size() == idx(o.devices),
           ConfigError, "modelpar partition: device_memory_bytes has {} entries for {} devices; "
           "give one capacity per device, or none", o.device_memory_bytes.size(), o.devices);
  for (int64_t b : o.device_memory_bytes) {
    MP_CHECK(b > 0, ConfigError, "modelpar partition: a device's memory_bytes is {}; give the "
             "capacity of each device in bytes", b);
  }
  MP_CHECK(std::isfinite(o.bandwidth_bytes_per_s) && o.bandwidth_bytes_per_s > 0, ConfigError,
           "modelpar partition: bandwidth_bytes_per_s is {}; use a finite value > 0",
           o.bandwidth_bytes_per_s);
  MP_CHECK(std::isfinite(o.latency_us) && o.latency_us >= 0, ConfigError,
           "modelpar partition: latency_us is {}; use a finite value >= 0", o.latency_us);
  MP_CHECK(o.madpipe_iterations >= 1 && o.madpipe_delay_buckets >= 1 &&
               o.madpipe_memory_buckets >= 1,
           ConfigError, "modelpar partition: madpipe_iterations / _delay_buckets / _memory_buckets "
           "are {} / {} / {}; each must be >= 1", o.madpipe_iterations, o.madpipe_delay_buckets,
           o.madpipe_memory_buckets);
  MP_CHECK(o.madpipe_pattern_node_limit >= 0 && o.madpipe_pattern_time_limit_s >= 0, ConfigError,
           "modelpar partition: madpipe_pattern_node_limit ({}) and madpipe_pattern_time_limit_s "
           "({}) must be >= 0", o.madpipe_pattern_node_limit, o.madpipe_pattern_time_limit_s);
}

}  // namespace

std::string_view name(PipelineSchedule s) {
  switch (s) {
    case PipelineSchedule::GPipe: return "gpipe";
    case PipelineSchedule::OneFOneB: return "1f1b";
    case PipelineSchedule::OneFOneBStar: return "1f1b*";
    case PipelineSchedule::Interleaved: return "interleaved";
    case PipelineSchedule::ZeroBubbleH1: return "zb-h1";
    case PipelineSchedule::ZeroBubbleV: return "zb-v";
  }
  return "?";
}

std::optional<PipelineSchedule> parsePipelineSchedule(std::string_view s) {
  for (auto k :
       {PipelineSchedule::GPipe, PipelineSchedule::OneFOneB, PipelineSchedule::OneFOneBStar,
        PipelineSchedule::Interleaved, PipelineSchedule::ZeroBubbleH1,
        PipelineSchedule::ZeroBubbleV}) {
    if (name(k) == s) return k;
  }
  return std::nullopt;
}

int StagePartition::stageEnd(int s, int num_layers) const {
  return s + 1 < numStages() ? stage_begin[idx(s) + 1] : num_layers;
}

double cutTime(const LayerChain& chain, int c, const PartitionOptions& o) {
  double bytes = static_cast<double>(chain.layers.at(idx(c)).out_bytes);
  return 2.0 * (o.latency_us + bytes * 1e6 / o.bandwidth_bytes_per_s);
}

namespace detail {

// ceil(v / T), tolerant to rounding in sums that land on a group boundary.
static int64_t groupIndex(double v, double period) {
  return static_cast<int64_t>(std::ceil(v / period - 1e-9));
}

double groupAdd(double x, double y, double period) {
  int64_t q = groupIndex(x, period);
  if (groupIndex(x + y, period) == q) return x + y;
  return period * static_cast<double>(q) + y;
}

int groupOf(double delay, double period) {
  return static_cast<int>(std::max<int64_t>(1, groupIndex(delay, period)));
}

}  // namespace detail

std::vector<int> oneFOneBStarGroups(std::span<const double> stage_us,
                                    std::span<const double> cut_us, double period_us) {
  const size_t S = stage_us.size();
  MP_CHECK(std::isfinite(period_us) && period_us > 0, ConfigError,
           "modelpar 1f1b*: period {} us; use a finite period > 0", period_us);
  MP_CHECK(cut_us.empty() || cut_us.size() + 1 == S, ConfigError,
           "modelpar 1f1b*: {} stages need {} cut times, got {}", S, S == 0 ? 0 : S - 1,
           cut_us.size());
  std::vector<int> groups(S, 1);
  double v = 0;
  for (size_t i = S; i-- > 0;) {
    double u = stage_us[i];
    MP_CHECK(u <= period_us * (1 + 1e-9), ConfigError,
             "modelpar 1f1b*: stage {} takes {} us, more than the period {} us", i, u, period_us);
    v = detail::groupAdd(v, u, period_us);
    groups[i] = detail::groupOf(v, period_us);
    if (i > 0 && !cut_us.empty()) {
      double c = cut_us[i - 1];
      MP_CHECK(c <= period_us * (1 + 1e-9), ConfigError,
               "modelpar 1f1b*: the cut after stage {} takes {} us, more than the period {} us",
               i - 1, c, period_us);
      v = detail::groupAdd(v, c, period_us);
    }
  }
  return groups;
}

std::vector<int> activationsInFlight(PipelineSchedule s, int num_stages, int microbatches,
                                     std::span<const int> groups) {
  MP_CHECK(num_stages >= 0 && microbatches >= 1, ConfigError,
           "modelpar partition: {} stages, {} micro-batches", num_stages, microbatches);
  std::vector<int> a(idx(num_stages));
  for (int i = 0; i < num_stages; ++i) {
    int k = microbatches;
    // Interleaved 1F1B counted as 1F1B over its virtual stages, an
    // approximation: device d keeps its warm-up plus one, (v-1)·r + 2(p-1-d)
    // + 1 chunks of activations (Note [Interleaved 1F1B]), where this counts
    // min(m, (v-c)·p - d) for each chunk c; the two differ by a few chunks,
    // in either direction (p = 4, v = 2: with m = 8 device 0 keeps 11 and
    // is counted 12; with m = 7, one round of 7, device 3 keeps 8 and is
    // counted 6). The simulation of the lowered Program gives the real peak.
    // ZB-H1 counted as 1F1B: stage s also keeps the inputs of up to s
    // deferred W's (Note [ZB-H1] in schedule_zero_bubble.cpp), a part of a
    // micro-batch's activations this count leaves out; the simulation of
    // the lowered Program gives the real peak, which planPipeline checks.
    // ZB-V counted as 1F1B over its 2p stages: device d's order runs
    // exactly 2p - d forwards of stage d and d + 1 of stage 2p-1-d before
    // their first backward, and each W right after its B until the
    // cool-down, which holds up to d more W inputs (Note [ZB-V]).
    if (s == PipelineSchedule::OneFOneB || s == PipelineSchedule::Interleaved ||
        s == PipelineSchedule::ZeroBubbleH1 || s == PipelineSchedule::ZeroBubbleV) {
      k = std::min(microbatches, num_stages - i);
    }
    if (s == PipelineSchedule::OneFOneBStar) {
      MP_CHECK(groups.size() == idx(num_stages), ConfigError,
               "modelpar partition: 1f1b* needs the group of each of {} stages, got {}",
               num_stages, groups.size());
      k = std::min(microbatches, groups[idx(i)]);
    }
    a[idx(i)] = k;
  }
  return a;
}

std::vector<int64_t> stageMemory(const LayerChain& chain, std::span<const int> stage_begin,
                                 std::span<const int> activations, bool recompute) {
  const int L = chain.size(), S = static_cast<int>(stage_begin.size());
  MP_CHECK(activations.size() == stage_begin.size(), ConfigError,
           "modelpar partition: {} stages but {} activation counts", S, activations.size());
  std::vector<int64_t> mem(idx(S), 0);
  for (int s = 0; s < S; ++s) {
    int k = stage_begin[idx(s)];
    int l = s + 1 < S ? stage_begin[idx(s) + 1] : L;
    double w = 0;
    int64_t a = 0;
    for (int i = k; i < l; ++i) {
      w += static_cast<double>(chain.layers[idx(i)].weight_bytes);
      a += chain.layers[idx(i)].stored_bytes;
    }
    // Recomputed (Note [Partition memory with recomputation]): every
    // micro-batch in flight but one keeps only the stage's input.
    const int g = activations[idx(s)];
    const int64_t input = k > 0 ? chain.layers[idx(k) - 1].out_bytes : 0;
    const int64_t held = recompute && g > 1 ? (g - 1) * std::min(input, a) + a : g * a;
    int64_t m = static_cast<int64_t>(std::ceil(w * chain.weight_copies)) + held;
    if (k > 0) m += 2 * chain.layers[idx(k) - 1].out_bytes;
    if (l < L) m += 2 * chain.layers[idx(l) - 1].out_bytes;
    mem[idx(s)] = m;
  }
  return mem;
}

StagePartition evaluatePartition(const LayerChain& chain, std::vector<int> stage_begin,
                                 std::vector<int> stage_device, const PartitionOptions& o,
                                 std::string method) {
  const int L = chain.size(), S = static_cast<int>(stage_begin.size());
  MP_CHECK(S >= 1 && stage_begin[0] == 0 && stage_device.size() == stage_begin.size(), ConfigError,
           "modelpar partition: a plan needs stage_begin starting at 0 and one device per stage "
           "({} stages, {} devices)", S, stage_device.size());
  for (int s = 0; s < S; ++s) {
    MP_CHECK((s == 0 || stage_begin[idx(s)] > stage_begin[idx(s) - 1]) &&
                 stage_begin[idx(s)] < L,
             ConfigError, "modelpar partition: stage {} begins at layer {}; stage starts must rise "
             "strictly within 0..{}", s, stage_begin[idx(s)], L - 1);
    int d = stage_device[idx(s)];
    MP_CHECK(d >= 0 && d < o.devices, ConfigError,
             "modelpar partition: stage {} is on device {} of {}", s, d, o.devices);
  }
  StagePartition p;
  p.method = std::move(method);
  p.schedule = o.schedule;
  p.num_devices = o.devices;
  p.stage_begin = std::move(stage_begin);
  p.stage_device = std::move(stage_device);

  // Loads: stage times, cut times, device sums.
  std::vector<double> stage_us(idx(S), 0.0), cut_us;
  std::vector<double> device_us(idx(o.devices), 0.0);
  for (int s = 0; s < S; ++s) {
    for (int i = p.stage_begin[idx(s)]; i < p.stageEnd(s, L); ++i) {
      stage_us[idx(s)] += chain.time(i);
    }
    device_us[idx(p.stage_device[idx(s)])] += stage_us[idx(s)];
    if (s > 0) cut_us.push_back(cutTime(chain, p.stage_begin[idx(s)] - 1, o));
  }
  p.load_period_us = *std::max_element(device_us.begin(), device_us.end());
  for (double c : cut_us) p.load_period_us = std::max(p.load_period_us, c);

  auto deviceMemory = [&](const std::vector<int>& acts) {
    std::vector<int64_t> per_stage = stageMemory(chain, p.stage_begin, acts, o.recompute);
    std::vector<int64_t> dev(idx(o.devices), 0);
    for (int s = 0; s < S; ++s) dev[idx(p.stage_device[idx(s)])] += per_stage[idx(s)];
    return dev;
  };
  auto fitsAll = [&](const std::vector<int64_t>& dev) {
    for (int d = 0; d < o.devices; ++d) {
      if (dev[idx(d)] > o.capacityOf(d)) return false;
    }
    return true;
  };

  if (o.schedule != PipelineSchedule::OneFOneBStar) {
    p.stage_activations = activationsInFlight(o.schedule, S, o.microbatches);
    p.memory_bytes = deviceMemory(p.stage_activations);
    p.fits = fitsAll(p.memory_bytes);
    p.period_us = p.fits ? p.load_period_us : kInf;
    return p;
  }
  // 1F1B*: groups only change at periods equal to the total of a run of
  // consecutive elements (stages and cuts), so the smallest fitting period is
  // the load period or one of those totals.
  std::vector<double> elems;
  for (int s = 0; s < S; ++s) {
    elems.push_back(stage_us[idx(s)]);
    if (s + 1 < S) elems.push_back(cut_us[idx(s)]);
  }
  std::vector<double> candidates{p.load_period_us};
  for (size_t i = 0; i < elems.size(); ++i) {
    double sum = 0;
    for (size_t j = i; j < elems.size(); ++j) {
      sum += elems[j];
      if (sum > p.load_period_us) candidates.push_back(sum);
    }
  }
  std::sort(candidates.begin(), candidates.end());
  candidates.erase(std::unique(candidates.begin(), candidates.end()), candidates.end());
  for (double t : candidates) {
    if (t <= 0) t = 1e-9;  // an all-zero chain: any period works
    std::vector<int> groups = oneFOneBStarGroups(stage_us, cut_us, t);
    p.stage_activations = activationsInFlight(o.schedule, S, o.microbatches, groups);
    p.memory_bytes = deviceMemory(p.stage_activations);
    if (fitsAll(p.memory_bytes)) {
      p.fits = true;
      p.period_us = t;
      return p;
    }
  }
  p.fits = false;  // memory at the largest candidate: one group, the least memory
  p.period_us = kInf;
  return p;
}

int mostOverCapacity(const std::vector<int64_t>& need, const PartitionOptions& o) {
  int worst = 0;
  for (int d = 1; d < static_cast<int>(need.size()); ++d) {
    if (need[idx(d)] - o.capacityOf(d) > need[idx(worst)] - o.capacityOf(worst)) worst = d;
  }
  return worst;
}

std::vector<int> balanceBlocks(std::span<const double> costs, int blocks) {
  MP_CHECK(!costs.empty() && blocks >= 1, ConfigError,
           "modelpar partition: balance needs >= 1 item and >= 1 block (got {} and {})",
           costs.size(), blocks);
  return minMaxSplit(costs, blocks, /*exact_count=*/true, [](int) { return 0.0; });
}

std::vector<int> balanceTimeCommSplit(const LayerChain& chain, const PartitionOptions& o) {
  checkOptions(chain, o);
  std::vector<double> t(idx(chain.size()));
  for (int i = 0; i < chain.size(); ++i) t[idx(i)] = chain.time(i);
  std::vector<double> cut(t.size(), 0.0);
  for (int c = 0; c + 1 < chain.size(); ++c) cut[idx(c)] = cutTime(chain, c, o);
  return minMaxSplit(t, o.devices, /*exact_count=*/false,
                     [&](int c) { return cut[idx(c)]; });
}

StagePartition partitionChain(const LayerChain& chain, const PartitionOptions& o) {
  checkOptions(chain, o);
  const std::string& m = o.method;
  std::vector<int> begin;
  if (m == "balance-time" || m == "balance-size") {
    std::vector<double> cost;
    for (const ChainLayer& x : chain.layers) {
      double size = static_cast<double>(x.weight_bytes) * chain.weight_copies +
                    static_cast<double>(x.stored_bytes);
      cost.push_back(m == "balance-time" ? x.fwd_us + x.bwd_us : size);
    }
    begin = balanceBlocks(cost, o.devices);
  } else if (m == "balance-time-comm") {
    begin = balanceTimeCommSplit(chain, o);
  } else if (m == "madpipe") {
    std::optional<StagePartition> p = madpipePartition(chain, o);
    if (p) return *p;
    // Nothing fits: say how far the lightest plan is (every stage keeps one
    // micro-batch, the model split evenly by memory).
    double need = 0;
    for (const ChainLayer& x : chain.layers) {
      need += static_cast<double>(x.weight_bytes) * chain.weight_copies +
              static_cast<double>(x.stored_bytes);
    }
    MP_THROW(PlanDoesNotFitError,
             "modelpar partition: madpipe found no allocation of the {} layers on {} devices of {} "
             "(the weights x {} plus one micro-batch of activations alone take {}, before "
             "transfer buffers and in-flight micro-batches); use more devices, more memory, or "
             "checkpointing", chain.size(), o.devices, formatBytes(o.memory_bytes),
             chain.weight_copies, formatBytes(static_cast<int64_t>(need)));
  } else {
    MP_INTERNAL_ASSERT(false, "partition method '{}' passed checkOptions but is not handled", m);
  }
  std::vector<int> device(begin.size());
  for (size_t s = 0; s < begin.size(); ++s) device[s] = static_cast<int>(s);
  StagePartition p = evaluatePartition(chain, std::move(begin), std::move(device), o, m);
  if (!p.fits) {
    const int worst = mostOverCapacity(p.memory_bytes, o);
    MP_THROW(PlanDoesNotFitError,
             "modelpar partition: the {} plan needs {} on device {} of {} under {} (least over "
             "its periods); use method madpipe, more devices or more memory", m,
             formatBytes(p.memory_bytes[idx(worst)]), worst,
             formatBytes(o.capacityOf(worst)), name(o.schedule));
  }
  return p;
}

}  // namespace modelpar::passes
