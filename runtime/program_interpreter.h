// ProgramInterpreter: the reference executor of an ir::Program. Every logical
// device maps to the one real device the inputs live on (CPU in CI), and the
// per-device instruction lists run interleaved on the caller's thread, so a
// Program's schedule, transfers and frees can be checked for numerics and for
// run-time deadlock without threads, streams or a process group.
#pragma once

#include <vector>

#include <ATen/core/ivalue.h>

#include "ir/program.h"
#include "runtime/op_call.h"

namespace modelpar::runtime {

struct ProgramInterpreterOptions {
  /// Run ir::verify(Program) at construction. Off only to exercise the
  /// run-time checks (deadlock, missing values) on programs the verifier
  /// would reject.
  bool verify = true;
};

/// Note [Reference program execution]
/// Each device has its own value table. Devices take turns in id order; a
/// device runs its instructions until it finishes or reaches a `recv` whose
/// `send` has not been issued yet, then the next device runs. This order is
/// deterministic, so a failure reproduces exactly.
///
///   run %y       calls the node's operator with this device's values
///   send %y -> d clones %y into the mailbox (%y, this device, d): the
///                receiver gets its own tensor, as it would across GPUs
///   recv %y <- s takes the oldest clone from (%y, s, this device)
///   free %y      drops this device's copy of %y
///
/// When every unfinished device waits on a receive, the program deadlocks:
/// run() throws ExecutionError listing each waiting device and instruction.
///
/// Example:
///   ir::Program p = ir::parseProgram(text);       // devices=2
///   ProgramInterpreter interp(p);
///   std::vector<c10::IValue> out = interp.run({x, w});
class ProgramInterpreter {
 public:
  /// Verifies `p` (unless options.verify is false), copies it and resolves
  /// every node once. Throws InvalidIrError / UnsupportedOpError as
  /// Interpreter does.
  explicit ProgramInterpreter(const ir::Program& p, ProgramInterpreterOptions options = {});

  /// Binds each graph input on its `device` (0 when unset), runs the
  /// program, and returns each graph output from the lowest-numbered device
  /// holding it at the end. Throws ExecutionError for a bad input (as
  /// Interpreter::run), a deadlock, or a failing instruction; the latter's
  /// message starts `device D, instruction I (run %y, aten::mm): `.
  std::vector<c10::IValue> run(std::vector<c10::IValue> inputs) const;

  const ir::Program& program() const { return program_; }

 private:
  ir::Program program_;
  std::vector<ResolvedOp> ops_;  // by NodeId
};

}  // namespace modelpar::runtime
