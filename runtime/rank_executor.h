// RankExecutor: runs one logical device's instruction list of an ir::Program
// in this process, as rank r of a c10d ProcessGroup whose size is the
// program's device count (one process per device, launched by torchrun).
// A Program's send/recv become the group's point-to-point send/recv (Gloo on
// CPU, NCCL on GPUs); see Note [Rank transfers] in rank_executor.cpp.
#pragma once

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include <ATen/core/ivalue.h>
#include <c10/core/Device.h>
#include <c10/util/intrusive_ptr.h>

#include "ir/error.h"
#include "ir/program.h"
#include "runtime/execution_trace.h"
#include "runtime/memory_meter.h"

namespace c10d {
class ProcessGroup;
}  // namespace c10d

namespace modelpar::runtime {

/// The ExecutionError of a transfer with another rank that did not complete:
/// the peer raised, was killed, or is itself stuck behind a failed rank.
/// The message reads `modelpar rank 0, instruction 7 (recv %h <- 1): rank 1
/// sent nothing within 30 s ...`.
class PeerError : public ExecutionError {
 public:
  PeerError(std::string message, int peer) : ExecutionError(std::move(message)), peer_(peer) {}
  /// The rank the transfer was with.
  int peer() const { return peer_; }

 private:
  int peer_;
};

struct RankExecutorOptions {
  /// Run ir::verify(Program) at construction.
  bool verify = true;
  /// How long one transfer may wait for its peer before PeerError.
  std::chrono::milliseconds timeout{30000};
  /// Where received values are allocated (the rank's device: CPU for Gloo,
  /// the rank's GPU for NCCL).
  c10::Device device = c10::Device(c10::kCPU);
  /// Graph output indices that every rank returns: the rank holding the
  /// output at the end broadcasts it (a forward's loss and user outputs).
  std::vector<size_t> replicated_outputs;
  /// (graph output, device): run() returns the output on that device only;
  /// when
  /// the plan leaves it elsewhere, its holder sends it there after the
  /// step. A gradient goes home to the rank whose input binding reads its
  /// parameter, which is the rank whose optimizer updates it (a pipeline's
  /// tied weight: used by two stages, its gradient summed on one).
  std::vector<std::pair<size_t, int>> output_homes;
  /// Record the measured start and end of each of this rank's instructions
  /// (lastTrace).
  bool record_trace = false;
  /// When set (a group of the same ranks, in the same order): the transfers
  /// from a higher rank to a lower one go over it, the others over `group`,
  /// so each direction between two ranks has communicators and, over NCCL,
  /// a stream of its own (Note [One stream per direction], rank_executor.cpp).
  c10::intrusive_ptr<c10d::ProcessGroup> reverse_group;
  /// The most bytes one received value may take (its elements, and the
  /// span of its strides): a peer's header asking for more is an
  /// ExecutionError (Note [Peer data is checked], rank_messages.cpp).
  /// Default 64 GiB (kDefaultMaxMessageBytes).
  int64_t max_message_bytes = int64_t{1} << 36;
  /// Measure this rank's held memory after every instruction, as the
  /// multi-device executor's workers do (Note [Measured memory],
  /// memory_meter.h; memoryReport()). Off: a branch per instruction.
  bool measure_memory = false;
};

/// Example (rank r of a group of 2, running a 2-device program):
///   auto pg = c10d::resolve_process_group("0");     // torch.distributed's default group
///   RankExecutor ex(program, pg, {.device = c10::kCPU});
///   std::vector<c10::IValue> out = ex.run(inputs);  // every graph input; only
///                                                   // those on device r are read
///
/// Contract: every rank of `group` constructs a RankExecutor of the same
/// program (the caller checks it: modelpar's Python layer all-gathers a hash
/// of the program) and calls run() the same number of times.
///
/// run() returns one value per graph output: the rank's own copy when it
/// holds the output at the end, the holder's broadcast copy for a replicated
/// output, and None otherwise (a gradient or a saved activation that lives on
/// another rank).
class RankExecutor {
 public:
  /// Throws ConfigError when the group's size is not the program's device
  /// count; InvalidIrError / UnsupportedOpError as ProgramInterpreter does.
  RankExecutor(const ir::Program& p, c10::intrusive_ptr<c10d::ProcessGroup> group,
               RankExecutorOptions options = {});
  ~RankExecutor();
  RankExecutor(const RankExecutor&) = delete;
  RankExecutor& operator=(const RankExecutor&) = delete;

  /// Binds the graph inputs placed on this rank's device (others are not
  /// read and may be anything, e.g. empty placeholders), runs this rank's
  /// instruction list, waits for its sends, broadcasts the replicated
  /// outputs. Throws ExecutionError for a bad input or a failing
  /// instruction (`modelpar rank R, instruction I (run %y, aten::mm): ...`),
  /// PeerError for a transfer that did not complete within the timeout.
  /// After a failed step the executor refuses to run again (ExecutionError):
  /// messages of that step may still be in flight and would match the next
  /// step's; every rank of the group is expected to stop. A header a peer
  /// sends that does not fit the value's IR type is an ExecutionError naming
  /// the peer (Note [Peer data is checked]). Thread-safe: calls from several
  /// threads run one step after another (Note [One step at a time]). When
  /// the program has random ops, each step agrees a seed with rank 0 and
  /// reseeds every random op from it (Note [Random ops over ranks]).
  std::vector<c10::IValue> run(std::vector<c10::IValue> inputs);

  int rank() const;
  int worldSize() const;
  const ir::Program& program() const;
  /// For each graph output, the lowest device holding it when the program
  /// ends, before output_homes moves any (-1: none).
  const std::vector<int>& outputHolders() const;
  /// Nanoseconds the last step spent blocked waiting for other ranks
  /// (receives, sends finished at the end or at a fence, broadcasts).
  int64_t lastStepWaitNs() const;
  /// The last step's measured spans (needs record_trace): this rank's row
  /// filled, the other ranks' rows sized to their instruction lists and
  /// empty, so toChromeTrace(program(), lastTrace()) shows this rank alone.
  /// A run's span is its operator call, a send's its issue (on the send
  /// track too), a recv's its wait for the data.
  const ExecutionTrace& lastTrace() const;
  /// The last measured step's memory: one entry per device, this rank's
  /// filled (distinct tensor storages its Env held: start, peak and where,
  /// end), the others zero. Throws ConfigError without measure_memory.
  MemoryReport memoryReport() const;

 private:
  class Impl;
  std::unique_ptr<Impl> impl_;
};

}  // namespace modelpar::runtime
