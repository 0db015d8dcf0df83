// Analyses of a Program for the rank executor (rank_schedule.h).
#include "runtime/rank_schedule.h"

#include <algorithm>

#include "runtime/check.h"

namespace modelpar::runtime {

using Kind = ir::Instruction::Kind;

OutputPlaces outputPlaces(const ir::Program& p) {
  const ir::Graph& g = p.graph();
  const auto n = static_cast<size_t>(p.numDevices());
  std::vector<std::vector<bool>> has(n, std::vector<bool>(g.numValues()));
  for (const ir::Input& in : g.inputs()) {
    has[static_cast<size_t>(in.device.value_or(0))][static_cast<size_t>(in.value)] = true;
  }
  for (size_t d = 0; d < n; ++d) {
    std::vector<bool>& h = has[d];
    for (const ir::Instruction& inst : p.schedule(static_cast<int>(d))) {
      if (inst.kind == Kind::Run) {
        for (ir::ValueId v : g.node(inst.node).outputs) h[static_cast<size_t>(v)] = true;
      } else if (inst.kind == Kind::Recv) {
        h[static_cast<size_t>(inst.value)] = true;
      } else if (inst.kind == Kind::Free) {
        h[static_cast<size_t>(inst.value)] = false;
      }
    }
  }
  OutputPlaces out;
  for (ir::ValueId v : g.outputs()) {
    int holder = -1;
    std::vector<bool> present(n);
    for (size_t d = 0; d < n; ++d) {
      present[d] = has[d][static_cast<size_t>(v)];
      if (holder < 0 && present[d]) holder = static_cast<int>(d);
    }
    out.holder.push_back(holder);
    out.present.push_back(std::move(present));
  }
  return out;
}

}  // namespace modelpar::runtime
