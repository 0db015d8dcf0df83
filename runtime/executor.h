// Executor: runs an ir::Program over logical devices bound by a DeviceMap
// (N CPU workers, N GPUs, or one GPU hosting N logical devices). Each logical
// device issues its instruction list in order on its own worker thread;
// transfers use the tx/rx stream protocol of Note [Executor stream protocol]
// (executor.cpp). ProgramInterpreter is the single-threaded reference it
// must agree with.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include <ATen/core/ivalue.h>

#include "ir/error.h"
#include "ir/program.h"
#include "runtime/capture_check.h"
#include "runtime/device.h"
#include "runtime/execution_trace.h"
#include "runtime/memory_meter.h"

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

/// How the executor replays steps (Note [Graph replay] in executor_replay.cpp).
///  Streams  every step issues each instruction from the device's worker
///           (the tx/rx stream protocol).
///  Graphs   after `warmup_steps` stream steps, one step captures the program
///           into CUDA graphs (one per graph segment, graph_segments.h) and
///           every later step copies its inputs into static buffers and
///           replays them. When the program cannot be captured
///           (captureIssues(), CPU worker devices included) it falls back to
///           Streams and replayStatus() says why; CPU workers still run the
///           static-buffer protocol, so CI tests it.
enum class Replay : uint8_t { Streams, Graphs };

struct ExecutorOptions {
  /// Run ir::verify(Program) at construction. Off only to exercise run-time
  /// checks (deadlock) on programs the verifier would reject.
  bool verify = true;
  /// Record per-instruction timestamps (ExecutionTrace); costs two clock
  /// reads per instruction. Replayed graph steps record no spans.
  bool record_trace = false;
  Replay replay = Replay::Streams;
  /// Replay::Graphs: steps run on the stream path before the capture step
  /// (at least 1: lazy initialisation such as cuBLAS handles and workspaces
  /// must not happen inside a capture).
  int warmup_steps = 1;
  /// Replay::Graphs: return the static output tensors themselves instead of
  /// fresh clones. Faster, but the next step overwrites them: use the
  /// outputs before calling run() again.
  bool outputs_may_alias = false;
  /// Measure each device's peak bytes of distinct tensor storages held in its
  /// value slots, after every instruction (Note [Measured memory],
  /// memory_meter.h; Executor::memoryReport()). Off: a branch per
  /// instruction and per value slot written.
  bool measure_memory = false;
};

/// What Replay::Graphs is doing; Executor::replayStatus().
struct ReplayStatus {
  Replay requested = Replay::Streams;
  int steps = 0;                 // steps run so far
  bool captured = false;         // CUDA graphs replay the steps
  bool static_buffers = false;   // inputs go through static buffers
  size_t graphs = 0;             // CUDA graphs captured
  /// Parameters and buffers the capture reads at their own addresses (no
  /// static copy; Note [Parameters at their own addresses]).
  size_t own_address_inputs = 0;
  /// Captures dropped because such an input moved, and the last one's reason.
  int recaptures = 0;
  std::string last_recapture;
  /// Why the program is not captured (empty when it is, or for Streams).
  std::vector<CaptureIssue> issues;
  /// One line: `graph replay: 2 CUDA graphs ...`, `graph replay: not captured
  /// (...); stream replay`, `stream replay`.
  std::string summary;
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
/// Graph replay (ExecutorOptions::replay = Replay::Graphs): see Replay and
/// Note [Graph replay]; inputs must keep the capture step's shapes, dtypes and
/// devices (and non-tensor inputs their values), or run() throws
/// ExecutionError naming the input.
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
  /// What graph replay is doing and, when it fell back to streams, why.
  ReplayStatus replayStatus() const;
  /// Per device, the peak bytes of distinct storages the last step held and
  /// the instruction where it peaked (Note [Measured memory]); `steps` 0 and
  /// no devices before a step ran. Throws ConfigError without measure_memory.
  MemoryReport memoryReport() const;

 private:
  class Impl;
  std::unique_ptr<Impl> impl_;
};

}  // namespace modelpar::runtime
