// Facade of the IR: the one header the rest of modelpar includes.
#pragma once

#include "ir/arg.h"
#include "ir/dot.h"
#include "ir/error.h"
#include "ir/graph.h"
#include "ir/parser.h"
#include "ir/printer.h"
#include "ir/program.h"
#include "ir/types.h"
#include "ir/verifier.h"
