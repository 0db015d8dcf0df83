// Passes by name, for the driver (`python -m modelpar opt --pass NAME ...`)
// and the golden tests (tests/passes/golden/): each registered pass reads the
// IR as text leaves it — a Graph, or a Program once lowered — and leaves IR
// that prints, the way `mlir-opt` runs passes on a file. A plain registry
// (name → function), no code generation (STYLE.md).
//
// What a pass cannot carry in the IR it reads from annotations: the placers
// write each node's `device=` (and each input's), and `lower` reads them back,
// running each device's nodes in graph order.
//
// Example:
//   IrUnit ir = parseIrUnit(text);
//   ir = runPasses(std::move(ir), {parsePassSpec("cost:devices=2"),
//                                  parsePassSpec("place-metf:devices=2"),
//                                  parsePassSpec("lower")});
//   std::string out = printIrUnit(ir);   // "program devices=2 ..."
#pragma once

#include <functional>
#include <map>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "ir/graph.h"
#include "ir/program.h"
#include "passes/pass_runner.h"

namespace modelpar::passes {

/// A pass and its options as the driver is given them: `name` or
/// `name:key=value,key=value`.
struct PassSpec {
  std::string name;
  std::map<std::string, std::string, std::less<>> options;
};

/// Parses `name[:key=value[,key=value]...]`. ConfigError for an empty name,
/// an option without '=', or an option given twice.
PassSpec parsePassSpec(std::string_view text);

/// The IR between passes: a Graph, or a Program (after `lower`).
struct IrUnit {
  std::optional<ir::Graph> graph;
  std::optional<ir::Program> program;
};

/// Text that starts with `program` (after comments) is a Program, else a
/// Graph. The parsers' InvalidIrError for malformed text.
IrUnit parseIrUnit(std::string_view text);
std::string printIrUnit(const IrUnit& ir);

/// A pass the driver can run by name.
struct RegisteredPass {
  std::string_view name;
  std::string_view reads;   ///< "graph" or "program"
  std::string_view leaves;  ///< "graph" or "program"
  std::string_view help;   ///< one line, with its options
  std::vector<std::string_view> options;
  std::function<void(IrUnit&, const PassSpec&)> run;
};

/// Every pass the driver knows, in a stable order.
const std::vector<RegisteredPass>& registeredPasses();

/// Runs `specs` in order through a PassRunner("opt", ...): the IR is
/// verified after each pass (a broken invariant names the pass) and dumped
/// with dumps on. Every spec is checked before the first pass runs:
/// ConfigError for an unknown pass (listing the known ones), an unknown
/// option of a pass (listing its options), or a bad option value; a pass
/// given the wrong kind of IR (a graph pass after `lower`) is a ConfigError
/// naming both.
IrUnit runPasses(IrUnit ir, const std::vector<PassSpec>& specs,
                 const PassRunnerOptions& options = {});

}  // namespace modelpar::passes
