// Pass `schedule` (schedule.h): interleaved 1F1B's per-device task orders
// (Note [Interleaved 1F1B]).
#include <algorithm>

#include "ir/check.h"
#include "passes/pipeline/schedule_impl.h"

namespace modelpar::passes::schedule_detail {

// Note [Interleaved 1F1B]
// ~~~~~~~~~~~~~~~~~~~~~~~
// Megatron-LM's interleaved schedule (Narayanan et al. 2021, §2.2.2; the
// order of torch.distributed.pipelining's ScheduleInterleaved1F1B): p devices
// each hold v chunks of the model, n = p·v stages placed looping, stage s on
// device s % p, so device d holds stages d, p + d, .., (v-1)p + d (its chunks
// 0..v-1). Each device runs one order of its own (a lane of the global clock
// per device, not per stage: a stage's order alone does not say how a device
// interleaves its chunks). Micro-batches go in max(1, floor(m/p)) rounds of
// consecutive micro-batches, r = ceil(m / rounds) in the first (p of them
// when p divides m; with m < p one round of m):
//   forwards   round by round; in a round chunk 0..v-1, each the round's
//              micro-batches in order;
//   backwards  round by round; in a round chunk v-1..0, each the round's
//              micro-batches in order;
//   order      w = min((v-1)·r + 2(p-1-d), m·v) forwards (warm-up), then one
//              forward and one backward at a time, then the backwards left.
// Device p-1 runs its first v-1 chunks of a round, then its last chunk's
// forward of micro-batch 0 and the step's first backward. Device d runs
// 2(p-1-d) forwards more: its first gradient has gone p-1-d devices on and
// as many back. E.g. p = 2, v = 2, m = 4 (r = 2; "F2.1" is stage 2's forward
// of micro-batch 1; device 0 holds stages 0 and 2):
//   device 0: F0.0 F0.1 F2.0 F2.1 | F0.2 B2.0 F0.3 B2.1 F2.2 B0.0 F2.3 B0.1 | B2.2 B2.3 B0.2 B0.3
//   device 1: F1.0 F1.1 | F3.0 B3.0 F3.1 B3.1 F1.2 B1.0 F1.3 B1.1 F3.2 B3.2 F3.3 B3.3 | B1.2 B1.3
// With uniform chunks of forward t_f/v and backward t_b/v and free
// transfers, the step is (m + (p-1)/v)(t_f + t_b) for m >= p (simulated:
// exactly when p | m, and to 1e-4 of the bubble for the other m of the
// tests): the bubble fraction is (p-1)/(v·m + p-1), v times smaller than
// 1F1B's (p-1)/(m+p-1), for v times the transfers. For m < p no micro-batch waits for a device:
// the step is (p·v + m - 1)(t_f + t_b)/v, the bubble 1 - v·m/(p·v + m - 1)
// (m = 1: (p-1)/p, as 1F1B's).
//
// Rounds of any m. Megatron requires p | m and torch that its rounds divide
// m; both give rounds of equal size, and so does this order then. For other
// m the rounds here differ by at most one micro-batch, each of at least p
// (m >= p). Rounds of r = floor(m / rounds) with a partial last one were
// tried first: a round of fewer than p micro-batches leaves devices idle
// while its first micro-batch goes around the loop, and with the warm-up
// counted in r that order could not run without raising it (below); on the
// uniform chains of the tests (p <= 8, v <= 3, m <= 32) it was slower than
// 1F1B in 97 cases, while the rounds here give the closed form above in every
// case with m >= p and never needed a raise.
//
// When the order cannot run. An edge between micro-batches against this
// order (e.g. a backward of micro-batch 0 reading a forward of micro-batch
// 1 that its device runs after it) leaves every device waiting: the clock
// finds no lane that can fire. Then every device's warm-up is raised by one
// (up to m·v) and the clock runs again; the first raise that runs is kept
// (each keeps up to one more chunk of activations in flight per device).
// Running all forwards first runs whenever the edges between micro-batches
// go from a micro-batch to a later one (gradient accumulation in micro-batch
// order): a forward reads forwards of the same or earlier micro-batches on
// its stage or earlier ones, which come earlier in (round, chunk,
// micro-batch) order on their devices; backwards likewise with chunks
// descending. Otherwise the clock's ConfigError names the blocked tasks.

namespace {

// The first micro-batch of each round, then m.
std::vector<int> roundStarts(const Pipeline& P) {
  const int rounds = std::max(1, P.m / P.num_devices);
  std::vector<int> start{0};
  for (int q = 0; q < rounds; ++q) {
    start.push_back(start.back() + P.m / rounds + (q < P.m % rounds ? 1 : 0));
  }
  return start;
}

// Micro-batches in the first (largest) round.
int interleavedRound(const Pipeline& P) { return roundStarts(P)[1]; }

// Device d's warm-up before any raise.
int interleavedWarmup(const Pipeline& P, int d) {
  const int p = P.num_devices, v = P.virtual_stages;
  return std::min((v - 1) * interleavedRound(P) + 2 * (p - 1 - d), P.m * v);
}

// Device d's forwards (fb = kF) or backwards (kB) in the order they run.
std::vector<int32_t> chunkOrder(const Pipeline& P, int d, int fb) {
  const int p = P.num_devices, v = P.virtual_stages;
  const std::vector<int> start = roundStarts(P);
  std::vector<int32_t> out;
  out.reserve(static_cast<size_t>(P.m) * static_cast<size_t>(v));
  for (size_t q = 0; q + 1 < start.size(); ++q) {
    for (int i = 0; i < v; ++i) {
      const int chunk = fb == kF ? i : v - 1 - i;
      for (int k = start[q]; k < start[q + 1]; ++k) out.push_back(P.taskId(chunk * p + d, k, fb));
    }
  }
  return out;
}

// Device d's order with warm-up w; tasks without nodes left out.
std::vector<int32_t> deviceSequence(const Pipeline& P, int d, int w, const std::vector<char>& used) {
  const std::vector<int32_t> fwd = chunkOrder(P, d, kF), bwd = chunkOrder(P, d, kB);
  std::vector<int32_t> seq;
  seq.reserve(fwd.size() + bwd.size());
  size_t f = 0, b = 0;
  for (; f < static_cast<size_t>(w); ++f) seq.push_back(fwd[f]);
  while (f < fwd.size()) {
    seq.push_back(fwd[f++]);
    seq.push_back(bwd[b++]);
  }
  seq.insert(seq.end(), bwd.begin() + static_cast<std::ptrdiff_t>(b), bwd.end());
  std::erase_if(seq, [&](int32_t t) { return !used[static_cast<size_t>(t)]; });
  return seq;
}

}  // namespace

DeviceOrders interleavedOrders(const ir::Graph& g, const Pipeline& P, const TaskEdges& e,
                               const std::vector<char>& used) {
  const int p = P.num_devices, all = P.m * P.virtual_stages;
  DeviceOrders o;
  for (int d = 0; d < p; ++d) o.warmup.push_back(interleavedWarmup(P, d));
  for (;;) {
    o.lanes.clear();
    for (int d = 0; d < p; ++d) o.lanes.push_back(deviceSequence(P, d, o.warmup[static_cast<size_t>(d)], used));
    ClockRun run = runClock(g, P, e, o.lanes);
    if (run.ok()) {
      o.tick = std::move(run.tick);
      return o;
    }
    MP_CHECK(std::any_of(o.warmup.begin(), o.warmup.end(), [&](int w) { return w < all; }),
             ConfigError,
             "modelpar {}: the device orders of interleaved 1F1B contradict the graph's "
             "dependencies even with every forward first{}; micro-batches must be independent "
             "and stages ordered along the edges",
             kSchedulePassId, run.blocked);
    for (int& w : o.warmup) w = std::min(w + 1, all);  // Note [Interleaved 1F1B]
  }
}

}  // namespace modelpar::passes::schedule_detail
