// The one pass runner every entry point (plan_placement.h, plan_pipeline.h,
// plan_joint.h) drives its passes through, in the manner of MLIR's pass
// manager and XLA's HloPassPipeline: the cross-cutting work hangs off the
// runner, never off a pass (STYLE.md).
//
//   - each pass is timed into a row of the statistics table (PassStats);
//   - a progress callback hears each pass start and end;
//   - after each pass that leaves IR, an optional hook sees it, then the
//     verifier runs (unless turned off) and a broken invariant is re-thrown
//     as InvalidIrError naming the entry point and the pass;
//   - with a dump folder ($MODELPAR_DUMP_DIR or the dump_dir option) the IR
//     after each pass is written as `<graph>.<entry>-<NN>-<pass>.txt`.
//
// Example:
//   PassRunner runner("plan", g.name(), /*num_passes=*/5, options);
//   CostStats c = runner.run("cost", [&] { return estimateCosts(g, machine); });
//   runner.last().detail = "...";
//   runner.verifyGraph(g);          // hook, verifier, dump
//   std::vector<PassStats> table = runner.take();
#pragma once

#include <cstdint>
#include <functional>
#include <optional>
#include <string>
#include <string_view>
#include <type_traits>
#include <utility>
#include <vector>

#include "ir/graph.h"
#include "ir/program.h"

namespace modelpar::passes {

/// One pass starting (finished = false) or ending (finished = true, with its
/// time). index counts from 0 over `count` passes of this run.
struct PassEvent {
  std::string_view pass;
  int index = 0;
  int count = 0;
  bool finished = false;
  double seconds = 0;
};

/// One row of the statistics table.
struct PassStats {
  std::string pass;           ///< the pass id
  double seconds = 0;         ///< the pass itself
  double verify_seconds = 0;  ///< the verifier after it
  int64_t in = 0, out = 0;    ///< what it read and produced, in in_what / out_what
  std::string in_what, out_what;  ///< "nodes", "units", "instructions", "devices"
  std::string detail;         ///< the pass's own counters
};

/// What every entry point's options carry for its runner.
struct PassRunnerOptions {
  /// Verify the IR after every pass (the input graph is always verified).
  bool verify = true;
  /// Folder for the IR after each pass, `<graph>.<entry>-<NN>-<pass>.txt`.
  /// Unset: $MODELPAR_DUMP_DIR when set; empty: no dumps.
  std::optional<std::string> dump_dir;
  /// Called as each pass starts and ends (no pass prints).
  std::function<void(const PassEvent&)> progress;
  /// Instrumentation: called after each pass with the IR it left (the graph;
  /// the program once there is one, else null), before the verifier runs. A
  /// hook that changes the IR is verified as part of that pass.
  std::function<void(std::string_view pass, ir::Graph& graph, ir::Program* program)> after_pass;
};

class PassRunner {
 public:
  /// `entry` names the entry point in messages and dump names ("plan",
  /// "pipeline"); `num_passes` is the count progress events report.
  PassRunner(std::string_view entry, std::string_view graph_name, int num_passes,
             const PassRunnerOptions& options);

  /// Runs `body` as pass `pass` and returns what it returns; its row of the
  /// table is last() until the next pass.
  template <typename Body>
  std::invoke_result_t<Body&> run(std::string_view pass, Body&& body) {
    begin(pass);
    if constexpr (std::is_void_v<std::invoke_result_t<Body&>>) {
      body();
      end();
    } else {
      auto result = body();
      end();
      return result;
    }
  }

  /// The last pass's row of the statistics table.
  PassStats& last() { return stats_.back(); }

  /// After a pass that left a graph: the hook, ir::verify, and a dump of
  /// `dump_text` (the graph's text when empty).
  void verifyGraph(ir::Graph& graph, const std::string& dump_text = {});
  /// After a pass that left a program: the hook, ir::verify, and a dump.
  void verifyProgram(ir::Program& program, const std::string& dump_text = {});
  /// After a pass whose result the IR verifier cannot see (a grouping, a
  /// placement): the hook on `graph`, then `check` as the verifier.
  void verifyWith(ir::Graph& graph, ir::Program* program, const std::function<void()>& check,
                  const std::string& dump_text);

  bool dumping() const { return !dump_dir_.empty(); }
  /// Writes `text` as the IR after the last pass, when dumps are on.
  void dump(const std::string& text);

  std::vector<PassStats> take() { return std::move(stats_); }

 private:
  void begin(std::string_view pass);
  void end();

  std::string entry_;
  const PassRunnerOptions& options_;
  int count_;
  int index_ = 0;
  std::string graph_name_;
  std::string dump_dir_;
  std::vector<PassStats> stats_;
  double started_ = 0;  // seconds since the epoch of the steady clock
};

}  // namespace modelpar::passes
