// The device's options (modelpar::Options in include/modelpar/modelpar.h):
// the up-front check, with torch.compile's option names, values and words
// (passes/option_names.h, python/modelpar/planning/options.py), and what they
// ask of a sync.
#pragma once

#include <string>

#include "modelpar/modelpar.h"

namespace modelpar::backend {

/// Throws ConfigError naming the first bad option and its valid values:
/// devices outside 1..64, an unknown device_map or placer, a placer with one
/// device, a device_map list whose length is not devices, a CUDA map without
/// CUDA devices, memory <= 0, max_plans < 1, a bad pipeline value. Without
/// passes/ in the build every planning option is refused.
void checkOptions(const Options& o);

/// True when steps are planned by passes/ and run on the Executor (devices
/// > 1, memory set, a pipeline, a CUDA device_map), false for the one-device
/// interpreter.
bool planned(const Options& o);

/// True when `a` and `b` plan a step the same way (cached plans stay valid).
bool samePlanning(const Options& a, const Options& b);

/// The options that differ from their defaults, as `devices=2, placer='m-etf'`
/// (the form of torch.compile's plan summaries); "" when none do.
std::string nonDefaultOptions(const Options& o);

}  // namespace modelpar::backend
