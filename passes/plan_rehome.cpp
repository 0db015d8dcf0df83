// rehomePlanInputs (plan_rehome.h).
#include "passes/plan_rehome.h"

#include <chrono>

#include <fmt/format.h>

#include "passes/lower/simulate.h"

namespace modelpar::passes {
namespace {

double secondsSince(std::chrono::steady_clock::time_point start) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
}

int64_t transfers(const ir::Program& p) {
  int64_t n = 0;
  for (int d = 0; d < p.numDevices(); ++d) {
    for (const ir::Instruction& i : p.schedule(d)) n += i.kind == ir::Instruction::Kind::Send;
  }
  return n;
}

// PlacementPlan and PipelinePlan both hold program, machine, simulation and
// stats under those names.
template <class Plan>
Plan rehome(Plan plan, const InputHomes& homes) {
  auto start = std::chrono::steady_clock::now();
  const int64_t before = transfers(plan.program);
  plan.program = rehomeInputs(plan.program, homes);
  // The placement says so too, so that what is lowered from it again (a
  // pipeline's two phases, split_phases.h) binds the inputs where this
  // program does. rehomeInputs has checked every name and device.
  const ir::Graph& g = plan.program.graph();
  plan.placement.input_device.resize(g.inputs().size(), -1);
  for (const auto& [name, device] : homes) {
    auto index = g.inputIndex(*g.findValue(name));
    plan.placement.input_device[*index] = device;
  }
  PassStats moved;
  moved.pass = std::string(kRehomeInputsPassId);
  moved.seconds = secondsSince(start);
  moved.in = static_cast<int64_t>(homes.size());
  moved.in_what = "inputs";
  moved.out = transfers(plan.program) - before;
  moved.out_what = "transfers";
  moved.detail = fmt::format("{} transfers in all", transfers(plan.program));

  start = std::chrono::steady_clock::now();
  SimulateOptions options;
  options.record_timeline = !plan.simulation.start_us.empty();  // as the plan was simulated
  plan.simulation = simulate(plan.program, plan.machine, options);
  PassStats simulated;
  simulated.pass = std::string(kSimulatePassId);
  simulated.seconds = secondsSince(start);
  simulated.in = plan.simulation.num_instructions;
  simulated.in_what = "instructions";
  simulated.detail = fmt::format("step {} with the inputs at home",
                                 formatMicros(plan.simulation.step_time_us));
  plan.stats.push_back(std::move(moved));
  plan.stats.push_back(std::move(simulated));
  return plan;
}

}  // namespace

PlacementPlan rehomePlanInputs(PlacementPlan plan, const InputHomes& homes) {
  return rehome(std::move(plan), homes);
}

PipelinePlan rehomePlanInputs(PipelinePlan plan, const InputHomes& homes) {
  return rehome(std::move(plan), homes);
}

}  // namespace modelpar::passes
