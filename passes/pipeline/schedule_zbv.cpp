// Pass `schedule` (schedule.h): ZB-V's V placement check and per-device task
// orders (Note [ZB-V]), over the B and W tasks of Note [Backward split].
#include <algorithm>

#include "ir/check.h"
#include "passes/pipeline/schedule_impl.h"

namespace modelpar::passes::schedule_detail {

// Note [ZB-V]
// ~~~~~~~~~~~
// Qi et al., Zero Bubble Pipeline Parallelism (ICLR 2024), §6, schedule
// ZB-V; the order of torch.distributed.pipelining's ScheduleZBVZeroBubble.
// p devices each hold two chunks of the model, n = 2p stages placed in a V:
//
//   stage    0   1  ..  p-1 | p  ..  2p-2  2p-1
//   device   0   1  ..  p-1 | p-1 ..   1     0
//
// device d holds chunk 0 = stage d and chunk 1 = stage 2p-1-d. The turn of
// the V (stages p-1 and p) is on one device, so no transfer there; device 0
// holds the first and the last stage, so the loss's gradient starts where
// the step's input came in. Each backward task is cut into B and W (Note
// [Backward split]). Each device runs one order of its own (a lane of the
// global clock per device, as interleaved 1F1B's). Counters of micro-batches
// per (chunk, F|B|W) advance independently, each from 0; with m' =
// max(m, 2p-1), device d runs:
//
//   warm-up    2(p-d)-1 times F0; d times F1 F0; p-d times F1 B1 W1
//   steady     while chunk 1 has run fewer forwards than chunk 0, or chunk
//              0 has forwards left: F0 (if chunk 0 has one left), B0 W0,
//              F1 B1 W1
//   cool-down  d times B0 B1; p-d times B0 W0; then the W1's left, then the
//              W0's left (each chunk's W's in micro-batch order)
//
// ("F1" is the next forward of chunk 1), and then every task of a
// micro-batch >= m is dropped (so m < 2p-1, even m < p, runs the same
// shape with fewer micro-batches, as torch does). Why these counts, in
// chunk times: micro-batch 0 goes from device d's chunk 0 to its chunk 1 in
// 2(p-d)-1 (down the first leg to device p-1 and back up the second), which
// device d fills with as many forwards of chunk 0; its gradient then goes
// from the loss on device 0 back to device d in 2d more, filled by the d
// pairs; from then on every F1 is followed by its B1 and W1 while chunk
// 0's first gradient comes down the first leg, and in the steady phase a
// micro-batch of each chunk goes through F, B and W per round, the W's
// where 1F1B would wait. The cool-down runs the B's first, so the
// gradients the other devices wait for leave early, and the W's last.
//
// Example, p = 2, m = 4 (m' = 4; "B3.1" is stage 3's B of micro-batch 1;
// device 0 holds stages 0 and 3, device 1 stages 1 and 2):
//   device 0: F0.0 F0.1 F0.2 | F3.0 B3.0 W3.0 F3.1 B3.1 W3.1 |
//             F0.3 B0.0 W0.0 F3.2 B3.2 W3.2 B0.1 W0.1 F3.3 B3.3 W3.3 |
//             B0.2 W0.2 B0.3 W0.3
//   device 1: F1.0 | F2.0 F1.1 | F2.1 B2.0 W2.0 |
//             F1.2 B1.0 W1.0 F2.2 B2.1 W2.1 F1.3 B1.1 W1.1 F2.3 B2.2 W2.2 |
//             B1.2 B2.3 B1.3 W1.2 | W2.3 | W1.3
// (asserted in tests/passes/pipeline/schedule_zbv_test.cpp; device 1 has
// d = 1 pair of warm-up forwards and one B0 B1 pair in its cool-down).
//
// Bubble. With F = B = W = 1 per chunk and free transfers (a device busy
// 6m) the simulated step is exactly
//     max(6m + p-1, 4(m + p) - 2),
// i.e. 6m + p-1 for m >= (3p-1)/2 (in particular m >= 2p-1): p-1 idle
// slots per device, the time device p-1 waits for micro-batch 0's first
// forward, the least any order can have. Bubble fraction (p-1)/(6m + p-1).
// The same model (2p layers) on p devices with stages of two layers (F = B
// = W = 2): 1F1B 6(m + p-1) (bubble (p-1)/(m + p-1)), ZB-H1 6m + 2(p-1) for
// m >= p, so ZB-V halves ZB-H1's bubble and has a sixth of 1F1B's. For small
// m the step is 4(m + p) - 2 (m = 1: the forward and the backward across
// the 2p stages and two W's between, 4p + 2; 4 more per micro-batch), which
// is also ZB-H1's for m <= p: ZB-V is faster than ZB-H1 only for m > p. (Tests: p = 1..8, m = 1..32; stage 0's B is empty in the
// tests' chains, its backward all W, with the same steps.)
//
// Memory. Before its first B, device d runs 2p-d forwards of chunk 0 and d+1
// of chunk 1: 1F1B's counts min(m, n - s) over the n = 2p stages, 2p+1
// chunks in flight, and a W runs right after its B until the cool-down, so
// the in-flight counts are those (partition.cpp counts zb-v as 1F1B over
// its stages). In the cool-down the W's wait: device d holds up to d more
// W's inputs there (the incoming gradient). Measured on the tests' chains
// (4-byte values, each stage's W reading its forward's value and the
// incoming gradient), against 1F1B on p stages of two layers (the same
// model): device 0 peaks at most at 1F1B's device 0; device p-1, which
// defers the most W's, peaks highest, 16p + 4 bytes against 1F1B's largest
// 8p + 24 (m >= 2p): 0.9 times at p = 2, 1.21 at p = 4, 1.5 at p = 8, under
// twice for any p; ZB-H1 on the same layers peaks as high or higher
// (tests/passes/pipeline/schedule_zbv_test.cpp). The layers in flight are
// 1F1B's: at most 2p per device, and 2p for m >= 2p-1.
//
// When the order cannot run. The order is fixed; it is not raised or
// reordered. An edge between micro-batches against it (e.g. micro-batch
// 0's B reading micro-batch 1's forward on a device that runs it later)
// leaves every device waiting: the clock's ConfigError names the blocked
// tasks. Edges from a micro-batch to a later one on the same stage
// (gradient sums in micro-batch order, W after W) run.

void checkVPlacement(Pipeline& P) {
  const auto id = kSchedulePassId;
  const int n = P.n, p = n / 2;
  std::string expected;
  for (int s = 0; s < n; ++s) expected += fmt::format("{}{}", s == 0 ? "" : ", ", s < p ? s : n - 1 - s);
  MP_CHECK(n % 2 == 0, ConfigError,
           "modelpar {}: schedule 'zb-v' runs 2 stages per device placed in a V (n = 2p), but "
           "there are {} stages; cut the model into an even number of stages, 2 per device",
           id, n);
  for (int s = 0; s < n; ++s) {
    const int d = P.device_of_stage[static_cast<size_t>(s)], want = s < p ? s : n - 1 - s;
    MP_CHECK(d == want, ConfigError,
             "modelpar {}: schedule 'zb-v' places the {} stages in a V over {} devices (stage s "
             "on device s for s < {}, on device {} - s after), but stage {} is on device {}; "
             "give device_of_stage = [{}] (stage {} on device {})",
             id, n, p, p, n - 1, s, d, expected, s, want);
  }
  P.v_shape = true;
  P.virtual_stages = 2;
}

namespace {

// Device d's order by the rule of the Note, tasks of micro-batches >= m
// dropped (tasks without nodes are the caller's to drop).
std::vector<int32_t> zbvSequence(const Pipeline& P, int d) {
  const int p = P.num_devices, m = P.m, rounds = std::max(m, 2 * p - 1);
  const int stage[2] = {d, 2 * p - 1 - d};
  int next[2][kKinds] = {};  // per chunk and kind: the next micro-batch
  std::vector<int32_t> seq;
  seq.reserve(static_cast<size_t>(m) * 2 * kKinds);
  auto put = [&](int chunk, int kind) {
    const int k = next[chunk][kind]++;
    if (k < m) seq.push_back(P.taskId(stage[chunk], k, kind));
  };
  // Warm-up.
  for (int i = 0; i < 2 * (p - d) - 1; ++i) put(0, kF);
  for (int i = 0; i < d; ++i) put(1, kF), put(0, kF);
  for (int i = 0; i < p - d; ++i) put(1, kF), put(1, kB), put(1, kW);
  // Steady.
  while (next[1][kF] < next[0][kF] || next[0][kF] < rounds) {
    if (next[0][kF] < rounds) put(0, kF);
    put(0, kB), put(0, kW), put(1, kF), put(1, kB), put(1, kW);
  }
  // Cool-down.
  for (int i = 0; i < d; ++i) put(0, kB), put(1, kB);
  for (int i = 0; i < p - d; ++i) put(0, kB), put(0, kW);
  for (int chunk : {1, 0}) {
    while (next[chunk][kW] < next[chunk][kB]) put(chunk, kW);
  }
  return seq;
}

}  // namespace

DeviceOrders zbvOrders(const ir::Graph& g, const Pipeline& P, const TaskEdges& e,
                       const std::vector<char>& used) {
  DeviceOrders o;
  for (int d = 0; d < P.num_devices; ++d) {
    std::vector<int32_t> seq = zbvSequence(P, d);
    std::erase_if(seq, [&](int32_t t) { return !used[static_cast<size_t>(t)]; });
    const auto first_b =
        std::find_if(seq.begin(), seq.end(), [](int32_t t) { return Pipeline::kindOf(t) != kF; });
    o.warmup.push_back(static_cast<int>(first_b - seq.begin()));
    o.lanes.push_back(std::move(seq));
  }
  ClockRun run = runClock(g, P, e, o.lanes);
  MP_CHECK(run.ok(), ConfigError,
           "modelpar {}: the device orders of ZB-V contradict the graph's dependencies{}; "
           "micro-batches must be independent and stages ordered along the edges (ZB-V's order "
           "is fixed: Note [ZB-V])",
           kSchedulePassId, run.blocked);
  o.tick = std::move(run.tick);
  return o;
}

}  // namespace modelpar::passes::schedule_detail
