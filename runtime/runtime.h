// Facade of the runtime: the one header the rest of modelpar includes to
// execute Graphs and Programs.
#pragma once

#include "runtime/interpreter.h"
#include "runtime/op_call.h"
#include "runtime/program_interpreter.h"
#include "runtime/value_types.h"
