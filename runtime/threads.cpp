// startThread and its test hook (threads.h).
#include "runtime/threads.h"

#include <atomic>
#include <system_error>
#include <utility>

#include "runtime/check.h"

namespace modelpar::runtime {
namespace {

std::atomic<int> g_live{0};
std::atomic<int> g_fail_countdown{0};  // > 0: that many starts to go, the last one fails

// True when the test hook says this start must fail (counts the start down).
bool hookFires() {
  int k = g_fail_countdown.load();
  while (k > 0) {
    if (g_fail_countdown.compare_exchange_weak(k, k - 1)) return k == 1;
  }
  return false;
}

}  // namespace

std::thread startThread(const std::string& role, std::function<void()> body) {
  try {
    if (hookFires()) {
      throw std::system_error(std::make_error_code(std::errc::resource_unavailable_try_again),
                              "thread start refused by failThreadStartForTesting");
    }
    g_live.fetch_add(1);
    try {
      return std::thread([body = std::move(body)] {
        struct Live {
          ~Live() { g_live.fetch_sub(1); }
        } live;
        body();
      });
    } catch (...) {
      g_live.fetch_sub(1);
      throw;
    }
  } catch (const std::system_error& e) {
    MP_RT_THROW(ExecutionError, "modelpar: cannot start the thread of ", role, ": ", e.what(),
                "; the process is out of threads or memory (see ulimit -u): use fewer devices "
                "or executors");
  }
}

int liveThreads() { return g_live.load(); }

void failThreadStartForTesting(int k) { g_fail_countdown.store(k < 0 ? 0 : k); }

}  // namespace modelpar::runtime
