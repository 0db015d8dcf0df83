// Pass `simulate`: the step time and memory of a Program without running it
// (DistIR's simulator, seed 003 §3.3, algorithms.md §3.3, over our explicit
// Program; Baechi-PyTorch's tx/rx stream protocol, seed 000 §1.3.3).
//
// Model. Each device has one compute stream and two transfer channels:
//   * compute runs the device's `run`s in program order; a run starts when
//     the previous run ended and every value it reads is there (produced
//     here, received here, or an input living here); it lasts the node's
//     cost.time_us;
//   * a transfer (a send and its matching recv) occupies the source's send
//     channel and the destination's receive channel: sends leave a device in
//     program order, each once the value is there and the runs before it in
//     program order have ended (the CUDA event a send waits on); the receive
//     channel serves transfers first come, first served; the value arrives
//     link(src, dst).timeUs(dense bytes of the value) after the start, and
//     the two channels are held for the bytes / bandwidth part only (Note
//     [A link's latency does not hold it] in simulate.cpp);
//   * compute overlaps transfers; transfers at one device are serialised per
//     direction; `free` takes no time; issuing a send costs the sender's
//     compute the machine's send overhead, charged to the run before it.
// Memory follows Note [Memory model] (task_graph.h) in program order
// (liveness.h): persistent bytes and inputs from the start, outputs and
// received copies from their instruction to their release, temporaries
// during their run.
//
// Reports the step time (last end), per-device compute busy and idle time,
// send / receive channel busy time (the bytes / bandwidth parts), peak
// memory, and a critical path (runs and receives, each the one that
// determined the next one's start). Runs in
// O(instructions + values) plus O(transfers log devices).
//
// Preconditions: the program verifies (ir::verify) and every node has a cost
// (ConfigError naming the node otherwise); the machine has at least as many
// devices as the program. Throws InvalidIrError naming a blocked instruction
// if the program deadlocks.
#pragma once

#include <cstdint>
#include <string_view>
#include <vector>

#include "ir/program.h"
#include "passes/cost/device_model.h"

namespace modelpar::passes {

inline constexpr std::string_view kSimulatePassId = "simulate";

struct SimulateOptions {
  /// Keep every instruction's start and end in the report (for traces).
  bool record_timeline = false;
};

struct DeviceReport {
  double compute_busy_us = 0;
  double idle_us = 0;  ///< step time - compute busy
  double send_busy_us = 0;
  double recv_busy_us = 0;
  int64_t peak_bytes = 0;
  int64_t persistent_bytes = 0;
  int64_t num_instructions = 0;
};

/// One instruction on the critical path (a transfer appears as its recv).
struct CriticalStep {
  int device = 0;
  int32_t index = 0;  ///< into the device's schedule
  ir::Instruction::Kind kind = ir::Instruction::Kind::Run;
  double start_us = 0, end_us = 0;
};

struct SimulationReport {
  double step_time_us = 0;
  std::vector<DeviceReport> devices;
  std::vector<CriticalStep> critical_path;  ///< earliest first
  int64_t num_instructions = 0;
  int64_t num_transfers = 0;
  /// With record_timeline: per device, per instruction; a send and its recv
  /// share the transfer's times; a free gets its device's previous end.
  std::vector<std::vector<double>> start_us, end_us;
};

SimulationReport simulate(const ir::Program& p, const DeviceModel& machine,
                          const SimulateOptions& options = {});

}  // namespace modelpar::passes
