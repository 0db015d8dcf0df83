// rehomePlanInputs: a placement's or a pipeline's plan with some graph inputs
// bound on other devices (pass `rehome-inputs`, passes/lower/rehome_inputs.h)
// and its step simulated again on the plan's machine.
//
// Over a process group an inference graph planned apart moves each parameter
// it binds away from its training home back there (Note [One home per
// parameter] in python/modelpar/distributed/homes.py). The plan people read
// (plans(), its summary, its simulated trace) must be the program that runs:
// its step counts the transfers the move adds, its peak memory the copies
// they leave where the inputs are read (parameters themselves are counted by
// the `persist` bytes of the nodes that use them: Note [Memory model]). The plan's placement, units and stage map are those
// of its nodes, which do not move, but the placement binds the moved inputs
// at their homes (so a pipeline's phases split from it bind them there too);
// two rows are added to its statistics, `rehome-inputs` and `simulate`. No memory check: a moved parameter is
// already held by its home (the training step binds it there).
//
// Errors: those of rehomeInputs (ConfigError naming an input that is not a
// graph input, or a device outside the program's), before anything changes.
#pragma once

#include "passes/lower/rehome_inputs.h"
#include "passes/plan_pipeline.h"
#include "passes/plan_placement.h"

namespace modelpar::passes {

PlacementPlan rehomePlanInputs(PlacementPlan plan, const InputHomes& homes);
PipelinePlan rehomePlanInputs(PipelinePlan plan, const InputHomes& homes);

}  // namespace modelpar::passes
