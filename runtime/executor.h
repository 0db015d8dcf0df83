// Executor: runs an ir::Program over logical devices bound by a DeviceMap
// (N CPU workers, N GPUs, or one GPU hosting N logical devices). Each logical
// device issues its instruction list in order on its own worker thread;
// transfers use the tx/rx stream protocol of Note [Executor stream protocol]
// (executor.cpp). ProgramInterpreter is the single-threaded reference it
// must agree with.
#pragma once

#include <cstddef>
#include <memory>
#include <string>
#include <vector>

#include <ATen/core/ivalue.h>

#include "ir/error.h"
#include "ir/program.h"
#include "runtime/device.h"
#include "runtime/execution_trace.h"

namespace modelpar::runtime {

/// The ExecutionError of a failing instruction; the message reads
/// `device 1, instruction 7 (run %y, aten::mm): <the operator's message>`.
class InstructionError : public ExecutionError {
 public:
  InstructionError(std::string message, int device, size_t instruction)
      : ExecutionError(std::move(message)), device_(device), instruction_(instruction) {}
  int device() const { return device_; }
  size_t instruction() const { return instruction_; }

 private:
  int device_;
  size_t instruction_;
};

struct ExecutorOptions {
  /// Run ir::verify(Program) at construction. Off only to exercise run-time
  /// checks (deadlock) on programs the verifier would reject.
  bool verify = true;
  /// Record per-instruction timestamps (ExecutionTrace); costs two clock
  /// reads per instruction.
  bool record_trace = false;
};

/// Example:
///   ir::Program p = ir::parseProgram(text);                  // devices=2
///   Executor ex(p, DeviceMap::cpuWorkers(2, /*threads_per_device=*/1));
///   std::vector<c10::IValue> out = ex.run({x, y, w1, w2});   // == ProgramInterpreter(p).run(...)
///   ex.run({x, y, w1, w2});                                   // resolved once, reused
///
/// Construction verifies the program, resolves every node once (operator,
/// arguments, the value slots it reads and writes), creates the devices with
/// their streams and one worker thread per logical device, and pre-allocates
/// one mailbox slot and two events per send. A step does no name lookups and
/// no allocation beyond the tensors themselves (and, on CPU, the transfer
/// closures).
///
/// Errors: the first failing instruction on any device stops every device
/// (no further work is issued; devices blocked in a recv wake up) and run()
/// throws InstructionError naming the device and instruction. The executor
/// stays usable for the next step.
class Executor {
 public:
  /// Throws InvalidIrError / UnsupportedOpError as ProgramInterpreter does,
  /// ConfigError when the device map does not fit (a map of the wrong length,
  /// CUDA without CUDA support).
  Executor(const ir::Program& p, const DeviceMap& map, ExecutorOptions options = {});
  ~Executor();
  Executor(const Executor&) = delete;
  Executor& operator=(const Executor&) = delete;

  /// Binds each graph input on its `device` (0 when unset; moved there when
  /// it lives elsewhere), runs one step on all devices, waits for all of
  /// them, and returns each graph output from the lowest-numbered device
  /// holding it at the end. The caller's thread-local state (grad mode,
  /// dispatch TLS) applies on the workers. Steps are serialised: a second
  /// concurrent call waits. Throws ExecutionError for a bad input (as
  /// Interpreter::run) or a run-time deadlock, InstructionError for a failing
  /// instruction.
  std::vector<c10::IValue> run(std::vector<c10::IValue> inputs);

  const ir::Program& program() const;
  const DeviceMap& deviceMap() const;
  /// The measured spans of the last step (empty unless record_trace).
  const ExecutionTrace& lastTrace() const;

 private:
  class Impl;
  std::unique_ptr<Impl> impl_;
};

}  // namespace modelpar::runtime
