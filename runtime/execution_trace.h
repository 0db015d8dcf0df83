// ExecutionTrace: measured start/end times of every instruction of one
// executed step, per device, and its Chrome / Perfetto trace (the same layout
// as passes/lower/chrome_trace.h's simulated one, so the two open side by side).
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "ir/program.h"

namespace modelpar::runtime {

/// A measured interval in nanoseconds since the step began (steady clock).
struct Span {
  int64_t start_ns = 0;
  int64_t end_ns = 0;
  bool empty() const { return start_ns == 0 && end_ns == 0; }
};

/// What Executor records when ExecutorOptions::record_trace is on.
/// `host[d][i]` is instruction i of device d as its worker thread saw it: a
/// run's operator call (on CUDA: its launch), a send's issue, a recv's wait
/// for delivery, a free. `transfer[d][i]`, for a send, is the copy on the
/// transmit stream (CPU workers: measured on that stream's thread; CUDA: when
/// the copy was issued). Spans of instructions that did not run are empty.
struct ExecutionTrace {
  std::vector<std::vector<Span>> host;
  std::vector<std::vector<Span>> transfer;
  /// Wall time of the whole step, caller's view.
  int64_t step_ns = 0;

  bool empty() const { return host.empty(); }
};

/// The trace JSON ({"traceEvents": [...]}, microseconds): one process per
/// device with a compute track (runs), a send track (transfers) and a recv
/// track (waits for delivery). Throws ConfigError for an empty trace or one
/// that does not match `p`.
std::string toChromeTrace(const ir::Program& p, const ExecutionTrace& trace);

/// Writes toChromeTrace to `path`. Throws ConfigError when it cannot.
void writeChromeTrace(const std::string& path, const ir::Program& p, const ExecutionTrace& trace);

}  // namespace modelpar::runtime
