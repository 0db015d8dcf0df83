// Facade of the runtime: the one header the rest of modelpar includes to
// execute Graphs and Programs.
#pragma once

#include "runtime/device.h"
#include "runtime/execution_trace.h"
#include "runtime/executor.h"
#include "runtime/interpreter.h"
#include "runtime/op_call.h"
#include "runtime/program_interpreter.h"
#include "runtime/rank_executor.h"
#include "runtime/sym_ops.h"
#include "runtime/value_types.h"
