// Program construction and access.
#include "ir/program.h"

#include <array>

#include "ir/check.h"

namespace modelpar::ir {

std::string_view name(Instruction::Kind k) {
  static constexpr std::array<std::string_view, 4> kNames = {"run", "send", "recv", "free"};
  return kNames[static_cast<size_t>(k)];
}

Program::Program(Graph graph, int num_devices) : graph_(std::move(graph)) {
  MP_CHECK(num_devices >= 1, InvalidIrError,
           "modelpar ir: a program needs at least one device, got {}", num_devices);
  schedules_.resize(static_cast<size_t>(num_devices));
}

const std::vector<Instruction>& Program::schedule(int device) const {
  MP_CHECK(device >= 0 && device < numDevices(), InvalidIrError,
           "modelpar ir: device {} is out of range (the program has {} devices)", device,
           numDevices());
  return schedules_[static_cast<size_t>(device)];
}

std::vector<Instruction>& Program::schedule(int device) {
  MP_CHECK(device >= 0 && device < numDevices(), InvalidIrError,
           "modelpar ir: device {} is out of range (the program has {} devices)", device,
           numDevices());
  return schedules_[static_cast<size_t>(device)];
}

void Program::append(int device, Instruction inst) { schedule(device).push_back(inst); }

}  // namespace modelpar::ir
