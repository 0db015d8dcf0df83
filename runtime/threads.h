// startThread: how the runtime starts its threads (executor workers, CPU copy
// streams). A refusal by the system (std::thread throws std::system_error when
// the process is out of threads or memory) becomes a typed ExecutionError
// naming the thread, and tests can make the k-th start fail on purpose to
// check that a half-built executor stops and joins what it had started.
#pragma once

#include <functional>
#include <string>
#include <thread>

namespace modelpar::runtime {

/// Starts a thread running `body`. Throws ExecutionError
/// `modelpar: cannot start the thread of <role>: <reason>; ...` when the
/// system refuses (or the test hook says to); nothing is started then.
std::thread startThread(const std::string& role, std::function<void()> body);

/// Threads started by startThread whose body has not returned yet.
int liveThreads();

/// Test hook: the k-th startThread call from now on (k >= 1) fails as if
/// std::thread had thrown std::system_error(EAGAIN); k = 0 disarms it.
/// Process-wide; for tests only.
void failThreadStartForTesting(int k);

}  // namespace modelpar::runtime
