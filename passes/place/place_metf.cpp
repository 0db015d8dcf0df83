// Pass `place-metf` (place_metf.h).
#include "passes/place/place_metf.h"

#include "passes/place/list_scheduler.h"

namespace modelpar::passes {
namespace {

// Step 2 of algorithms.md §1.6: every free device considers every ready task
// that fits; the globally earliest (start, topological rank, device) wins.
class EarliestTaskFirst final : public SchedulingPolicy {
 public:
  Choice choose(const ListScheduler& s, double now, std::span<const int32_t> ready,
                std::span<const int> free) override {
    // Tasks come in rank order and devices ascending, so a strictly earlier
    // start is the only way to win; nothing starts before `now`, so the first
    // candidate that starts now is the answer.
    Choice best;
    for (int32_t t : ready) {
      for (int d : free) {
        double start = 0;
        if (!s.evaluate(t, d, now, &start)) continue;
        if (start < best.start) best = Choice{t, d, start};
        if (best.start <= now) return best;
      }
    }
    return best;
  }
};

}  // namespace

Placement placeMEtf(const ir::Graph& g, const TaskGraph& tg, const DeviceModel& machine) {
  ListScheduler s(tg, machine, kMEtfPassId);
  EarliestTaskFirst policy;
  s.run(policy);
  return s.toPlacement(g, std::string(kMEtfPassId));
}

Placement placeMEtf(const ir::Graph& g, const DeviceModel& machine, const MEtfOptions& options) {
  TaskGraph tg = buildTaskGraph(g, options.units);
  return placeMEtf(g, tg, machine);
}

}  // namespace modelpar::passes
