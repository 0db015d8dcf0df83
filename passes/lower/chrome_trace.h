// Chrome / Perfetto trace of a simulated Program: one process per device
// with a compute track, a send track and a receive track, plus the device's
// live memory as a counter. Open in chrome://tracing or ui.perfetto.dev.
#pragma once

#include <string>

#include "ir/program.h"
#include "passes/lower/simulate.h"

namespace modelpar::passes {

/// The trace JSON ({"traceEvents": [...]}). Needs a report simulated with
/// record_timeline (ConfigError otherwise). Times are microseconds.
std::string toChromeTrace(const ir::Program& p, const SimulationReport& report);

/// Writes toChromeTrace to `path`. Throws ConfigError when it cannot.
void writeChromeTrace(const std::string& path, const ir::Program& p,
                      const SimulationReport& report);

}  // namespace modelpar::passes
