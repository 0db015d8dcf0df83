// spinUntil: a short busy wait before a thread blocks on a condition
// variable (Note [Spinning before sleeping]).
#pragma once

#include <chrono>
#include <thread>

#if defined(__x86_64__) || defined(_M_X64)
#include <immintrin.h>
#endif

namespace modelpar::runtime {

// Note [Spinning before sleeping]
// ~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~
// A worker that waits for a peer's send, or for its own copy stream, sleeps
// on a condition variable; the peer's notify then has to wake it. On a VM a
// thread that slept long enough for its vCPU to halt took 30-80 us to run
// again (traced: mlp's 1F1B pipeline of 8 micro-batches on 2 CPU workers,
// each hand-off from a send's end to the receiver's next op 60-76 us, the
// ops between them 1-15 us). Waits in a pipeline are mostly that short, so
// the waiter first polls `ready` for up to kSpinBudget, yielding its core
// to any other runnable thread between polls, and only then sleeps: a
// hand-off inside the budget costs the poll, not a wake-up, and a long
// wait costs at most the budget of CPU time.
inline constexpr std::chrono::microseconds kSpinBudget{100};

/// Polls `ready()` until it returns true (then true) or kSpinBudget has
/// passed (then false; the caller sleeps as before).
template <class Ready>
bool spinUntil(Ready&& ready) {
  if (ready()) return true;
  const auto deadline = std::chrono::steady_clock::now() + kSpinBudget;
  for (int i = 1;; ++i) {
    if (i < 64) {
#if defined(__x86_64__) || defined(_M_X64)
      _mm_pause();
#endif
    } else {
      std::this_thread::yield();
    }
    if (ready()) return true;
    if ((i & 7) == 0 && std::chrono::steady_clock::now() > deadline) return false;
  }
}

}  // namespace modelpar::runtime
