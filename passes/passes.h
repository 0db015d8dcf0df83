// Facade of passes/: the one header the rest of modelpar includes.
#pragma once

#include "passes/calibrate.h"
#include "passes/chrome_trace.h"
#include "passes/coarsen.h"
#include "passes/cost_model.h"
#include "passes/device_model.h"
#include "passes/json.h"
#include "passes/liveness.h"
#include "passes/lower.h"
#include "passes/op_family.h"
#include "passes/pipeline.h"
#include "passes/place_metf.h"
#include "passes/place_msct.h"
#include "passes/place_mtopo.h"
#include "passes/placement.h"
#include "passes/simulate.h"
#include "passes/task_graph.h"
