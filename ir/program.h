// ir::Program: a Graph plus, for each logical device, the ordered list of what
// that device does (run a node, send or receive a value, free a value). The
// simulator and every executor read the same Program (seed 003, DistIR).
#pragma once

#include <cstdint>
#include <string_view>
#include <vector>

#include "ir/graph.h"

namespace modelpar::ir {

/// One step of a device's schedule. Text:
///   run %y          run the node whose first output is %y (or `run ^label`)
///   send %y -> 1    start sending this device's copy of %y to device 1
///   recv %y <- 0    wait for %y from device 0; afterwards %y lives here too
///   free %y         drop this device's copy of %y
/// Sends never block (they are buffered); a receive blocks until the
/// matching send has been issued. See Note [Program semantics] in
/// program_verifier.cpp.
struct Instruction {
  enum class Kind : uint8_t { Run, Send, Recv, Free };
  Kind kind = Kind::Run;
  NodeId node = kNoId;    // Run
  ValueId value = kNoId;  // Send, Recv, Free
  int peer = -1;          // Send: destination device; Recv: source device

  static Instruction run(NodeId n) { return {Kind::Run, n, kNoId, -1}; }
  static Instruction send(ValueId v, int to) { return {Kind::Send, kNoId, v, to}; }
  static Instruction recv(ValueId v, int from) { return {Kind::Recv, kNoId, v, from}; }
  static Instruction free(ValueId v) { return {Kind::Free, kNoId, v, -1}; }
  bool operator==(const Instruction&) const = default;
};
std::string_view name(Instruction::Kind k);  // run send recv free

/// A whole distributed step: the graph (with devices on nodes and inputs) and
/// one instruction list per logical device 0..numDevices()-1.
///
/// Example (text):
///   program devices=2
///   graph @step(%x: f32[4, 8] input {device=0}, %w: f32[8, 8] param {device=1}) {
///     %h: f32[4, 8] = aten::relu(%x) {device=0}
///     %y: f32[4, 8] = aten::mm(%h, %w) {device=1}
///     return %y
///   }
///   device 0 {
///     run %h
///     send %h -> 1
///   }
///   device 1 {
///     recv %h <- 0
///     run %y
///   }
class Program {
 public:
  /// Throws InvalidIrError unless num_devices >= 1.
  Program(Graph graph, int num_devices);

  const Graph& graph() const { return graph_; }
  Graph& graph() { return graph_; }
  int numDevices() const { return static_cast<int>(schedules_.size()); }
  const std::vector<Instruction>& schedule(int device) const;
  std::vector<Instruction>& schedule(int device);
  /// Appends to a device's list. Throws InvalidIrError for a bad device.
  void append(int device, Instruction inst);

  bool operator==(const Program&) const = default;

 private:
  Graph graph_;
  std::vector<std::vector<Instruction>> schedules_;
};

}  // namespace modelpar::ir
