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

ir::Program receiveInSendOrder(const ir::Program& p) {
  const auto n = static_cast<size_t>(p.numDevices());
  std::vector<std::vector<std::vector<ir::ValueId>>> sent(n, std::vector<std::vector<ir::ValueId>>(n));
  for (size_t a = 0; a < n; ++a) {
    for (const ir::Instruction& inst : p.schedule(static_cast<int>(a))) {
      if (inst.kind == Kind::Send) sent[a][static_cast<size_t>(inst.peer)].push_back(inst.value);
    }
  }
  ir::Program out = p;
  for (size_t b = 0; b < n; ++b) {
    std::vector<size_t> next(n, 0);                   // per sender: into sent[a][b]
    std::vector<std::vector<ir::ValueId>> early(n);   // per sender: received ahead
    std::vector<ir::Instruction> list;
    for (const ir::Instruction& inst : p.schedule(static_cast<int>(b))) {
      if (inst.kind != Kind::Recv) {
        list.push_back(inst);
        continue;
      }
      const auto a = static_cast<size_t>(inst.peer);
      std::vector<ir::ValueId>& ahead = early[a];
      auto was = std::find(ahead.begin(), ahead.end(), inst.value);
      if (was != ahead.end()) {  // received ahead, at an earlier receive from a
        ahead.erase(was);
        continue;
      }
      const std::vector<ir::ValueId>& order = sent[a][b];
      // Everything a sent before v and b has not yet received, then v.
      bool found = false;
      while (!found && next[a] < order.size()) {
        const ir::ValueId u = order[next[a]++];
        list.push_back(ir::Instruction::recv(u, inst.peer));
        found = u == inst.value;
        if (!found) ahead.push_back(u);
      }
      MP_RT_CHECK(found, InvalidIrError, "modelpar rank executor: device ", b, " receives %",
                  p.graph().value(inst.value).name, " from device ", a,
                  ", which does not send it (then or later); run ir::verify");
    }
    out.schedule(static_cast<int>(b)) = std::move(list);
  }
  return out;
}

void checkPairOrder(const ir::Program& p) {
  const ir::Graph& g = p.graph();
  const auto n = static_cast<size_t>(p.numDevices());
  std::vector<std::vector<std::vector<ir::ValueId>>> sent(n, std::vector<std::vector<ir::ValueId>>(n));
  auto received = sent;  // [from][to]
  for (size_t d = 0; d < n; ++d) {
    for (const ir::Instruction& inst : p.schedule(static_cast<int>(d))) {
      if (inst.kind == Kind::Send) sent[d][static_cast<size_t>(inst.peer)].push_back(inst.value);
      if (inst.kind == Kind::Recv) received[static_cast<size_t>(inst.peer)][d].push_back(inst.value);
    }
  }
  for (size_t a = 0; a < n; ++a) {
    for (size_t b = 0; b < n; ++b) {
      const std::vector<ir::ValueId>& s = sent[a][b];
      const std::vector<ir::ValueId>& r = received[a][b];
      for (size_t k = 0; k < std::min(s.size(), r.size()); ++k) {
        MP_RT_CHECK(s[k] == r[k], ConfigError, "modelpar rank executor: over NCCL, device ", a,
                    "'s transfer ", k, " to device ", b, " is %", g.value(s[k]).name, " but device ",
                    b, " receives %", g.value(r[k]).name,
                    " there; NCCL pairs transfers by order, not by tag, so this program cannot run "
                    "over NCCL (use Gloo, or a schedule whose transfers keep order)");
      }
    }
  }
}

}  // namespace modelpar::runtime
