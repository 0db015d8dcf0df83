// Pass `rehome-inputs`: Program + {graph input -> device} -> the same
// computation with each named input bound on its given device (its home)
// and sent from there to where the program read it.
//
// Over a process group a rank's optimizer updates only the parameters it
// binds, so every graph compiled for a model must bind each parameter on the
// rank the training step does (Note [One home per parameter] in
// python/modelpar/distributed/homes.py). A graph planned apart (an inference
// graph, a pipeline's forward-only partition) may place a parameter
// elsewhere; this pass moves it home without re-planning the graph:
//
//   * the input's `device` becomes its home h;
//   * at the very start of h's list: `send %x -> d`, where d is the device
//     the program bound it on; at the very start of d's list: `recv %x <- h`
//     (d's own sends of %x, later in its list, still forward it);
//   * h already holds %x from the start: a `recv %x` on h before any `free
//     %x` there is dropped, with its matching send;
//   * when d, after the rewrite, neither runs a node reading %x nor sends
//     it, the new transfer and d's frees of %x are dropped.
//
// Sends never block (Note [Program semantics]), and both new instructions
// come first in their lists, so a deadlock-free program stays one (the
// result is verified). The program's graph is unchanged apart from the
// inputs' devices; instructions are only added and dropped, never reordered.
//
// Errors (ConfigError, before anything changes): a name that is not a graph
// input, a device outside the program's.
#pragma once

#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "ir/program.h"

namespace modelpar::passes {

inline constexpr std::string_view kRehomeInputsPassId = "rehome-inputs";

/// (graph input name without '%', home device)
using InputHomes = std::vector<std::pair<std::string, int>>;

/// `p` with every input of `homes` bound on its home (see above). An input
/// already at home is left as it is.
ir::Program rehomeInputs(const ir::Program& p, const InputHomes& homes);

/// The driver's form of `homes`: `name@device` items joined by '+', e.g.
/// `fc1.weight@1+fc1.bias@1`. ConfigError naming a malformed item.
InputHomes parseInputHomes(std::string_view text);

}  // namespace modelpar::passes
