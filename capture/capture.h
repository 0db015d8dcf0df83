// Facade of capture/: recording a step and building its ir::Graph.
#pragma once

#include "capture/convert.h"
#include "capture/layers.h"
#include "capture/trace.h"
