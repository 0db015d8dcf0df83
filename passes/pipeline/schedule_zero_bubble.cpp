// Pass `schedule` (schedule.h): ZB-H1's per-stage task orders (Note [ZB-H1]),
// over the B and W tasks of Note [Backward split].
#include <algorithm>

#include "passes/pipeline/schedule_impl.h"

namespace modelpar::passes::schedule_detail {

// Note [ZB-H1]
// ~~~~~~~~~~~~
// Qi et al., Zero Bubble Pipeline Parallelism (ICLR 2024), §3.1, schedule
// ZB-H1; the rule of torch.distributed.pipelining's zero-bubble schedules
// (`_get_1f1b_rank_ops` with backward-weight ops: rank r leaves out the
// weight op of its first r steady 1F1B steps, then one per step, the rest at
// the end), written here for one stage per device. Each backward task is cut
// into B and W (Note [Backward split]). Stage s of n, m micro-batches,
// w = min(n - s, m) warm-up forwards as 1F1B, W's deferred by d = s steps:
//
//   warm-up   F0 .. F(w-1)
//   steady    for j = 0 .. m-w-1:  B(j), then W(j-d) if j >= d, then F(j+w)
//   cool-down for j = m-w .. m-1:  B(j), then W(j-d) if j >= d
//   the rest  the W's not run yet, in micro-batch order
//
// B's run where 1F1B runs its backwards, so the gradient reaches the
// previous stage as soon as 1F1B's would without its W; the W's fill what
// would be 1F1B's bubble: in its first d = s steady steps stage s runs no W,
// so each B and F follows as soon as it can while the gradient of the
// stages after it catches up (with W right after B there, the steady phase
// keeps its bubble, see Memory). W's run in micro-batch order, each after its
// B: W(s,k) reads B(s,k)'s values and W(s,k-1)'s gradient sum (the
// accumulation acc_k = acc_(k-1) + g_k), so the order is one the clock can
// run; it checks every graph (Note [Global clock]).
//
// Example, n = 3, m = 4 (unit F = B = W, free transfers; step 14 slots):
//   stage 0: F0 F1 F2 B0 W0 F3 B1 W1 B2 W2 B3 W3
//   stage 1: F0 F1 B0 F2 B1 W0 F3 B2 W1 B3 W2 W3
//   stage 2: F0 B0 F1 B1 F2 B2 W0 F3 B3 W1 W2 W3
//
// Memory. A micro-batch's values that W reads (the layer inputs and output
// gradients of the weight gradients) are held until its W; what only B
// reads is freed at B. Stage s keeps at most w + d = n micro-batches whose W
// has not run (F's: +1 each, the first d steps add one each, a step with a
// W adds none, W comes before F), the 1F1B count of stage 0: the largest
// count over the stages is 1F1B's, as in the paper (ZB-H1 keeps 1F1B's peak
// taken over the workers, a deferred W holding M_W < M_B), but stage s > 0
// holds what W reads for up to s micro-batches more than under 1F1B, so its
// peak bytes exceed 1F1B's (measured on the IR skip step: up to 1.24 times
// on a device, 1.04 times 1F1B's largest; tests/passes/plan_pipeline_test.cpp).
// Keeping every stage at its own 1F1B count w instead (each W before the
// next F) was tried on the uniform chains of the tests: it leaves the steady
// phase's bubble as it is, the step then 3m + 2(p-1) slots; W deferred by s
// gives 3m + (p-1).
//
// Bubble. With T_F = T_B = T_W = 1 and free transfers the simulated step is
// exactly 3m + (p-1) for m >= p (tests: p = 2..8, m = p..32), the paper's
// (p-1)(T_F + T_B - T_W) = p-1 idle slots per device, against 1F1B's
// (p-1)(T_F + T_B + T_W) = 3(p-1): the bubble fraction (p-1)/(3m + p-1), a
// third of 1F1B's 3(p-1)/(3m + 3(p-1)) as m grows. For m < p: 2(m + p-1) + 1
// (the first forward and the last backward cross every stage, one W after).
std::vector<int32_t> zeroBubbleSequence(const Pipeline& P, int s) {
  const int m = P.m, w = std::clamp(P.n - s, 1, m), d = s;
  std::vector<int32_t> seq;
  seq.reserve(static_cast<size_t>(m) * kKinds);
  int next_w = 0;  // the next micro-batch whose W has not been placed
  for (int k = 0; k < w; ++k) seq.push_back(P.taskId(s, k, kF));
  for (int j = 0; j < m; ++j) {
    seq.push_back(P.taskId(s, j, kB));
    if (j >= d) seq.push_back(P.taskId(s, next_w++, kW));
    if (j + w < m) seq.push_back(P.taskId(s, j + w, kF));
  }
  for (; next_w < m; ++next_w) seq.push_back(P.taskId(s, next_w, kW));
  return seq;
}

}  // namespace modelpar::passes::schedule_detail
