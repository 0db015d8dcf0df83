// Facade of passes/: the one header the rest of modelpar includes to plan.
// It holds the planning entry points with their options structs and plans
// (planPlacement, planPipeline, planJoint, rehomePlanInputs, searchStrategy),
// the pass registry (runPasses, the `opt` driver's passes), the option names
// and their checks, and the Chrome trace of a plan's simulated step; through
// them the machine (DeviceModel, parseBytes) and the cost options.
//
// Code that binds or benchmarks one pass on its own (python/'s
// `microbatch`, `checkpoint`, `partition` bindings, bench/, tests/passes/)
// includes that pass's header beside this one: a pass's header is its
// specification (STYLE.md), and the facade does not re-export every pass.
#pragma once

#include "passes/cost/device_model.h"
#include "passes/lower/chrome_trace.h"
#include "passes/option_names.h"
#include "passes/pass_registry.h"
#include "passes/plan_joint.h"
#include "passes/plan_pipeline.h"
#include "passes/plan_placement.h"
#include "passes/plan_rehome.h"
#include "passes/search/strategy_search.h"
