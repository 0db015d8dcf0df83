// receiveInSendOrder and checkPairOrder (receive_order.h).
#include "ir/receive_order.h"

#include <algorithm>

#include "ir/check.h"

namespace modelpar::ir {

using Kind = Instruction::Kind;

Program receiveInSendOrder(const Program& p) {
  const auto n = static_cast<size_t>(p.numDevices());
  std::vector<std::vector<std::vector<ValueId>>> sent(n, std::vector<std::vector<ValueId>>(n));
  for (size_t a = 0; a < n; ++a) {
    for (const Instruction& inst : p.schedule(static_cast<int>(a))) {
      if (inst.kind == Kind::Send) sent[a][static_cast<size_t>(inst.peer)].push_back(inst.value);
    }
  }
  Program out = p;
  for (size_t b = 0; b < n; ++b) {
    std::vector<size_t> next(n, 0);                   // per sender: into sent[a][b]
    std::vector<std::vector<ValueId>> early(n);   // per sender: received ahead
    std::vector<Instruction> list;
    for (const Instruction& inst : p.schedule(static_cast<int>(b))) {
      if (inst.kind != Kind::Recv) {
        list.push_back(inst);
        continue;
      }
      const auto a = static_cast<size_t>(inst.peer);
      std::vector<ValueId>& ahead = early[a];
      auto was = std::find(ahead.begin(), ahead.end(), inst.value);
      if (was != ahead.end()) {  // received ahead, at an earlier receive from a
        ahead.erase(was);
        continue;
      }
      const std::vector<ValueId>& order = sent[a][b];
      // Everything a sent before v and b has not yet received, then v.
      bool found = false;
      while (!found && next[a] < order.size()) {
        const ValueId u = order[next[a]++];
        list.push_back(Instruction::recv(u, inst.peer));
        found = u == inst.value;
        if (!found) ahead.push_back(u);
      }
      MP_CHECK(found, InvalidIrError,
               "modelpar rank executor: device {} receives %{} from device {}, which does not "
               "send it (then or later); run ir::verify",
               b, p.graph().value(inst.value).name, a);
    }
    out.schedule(static_cast<int>(b)) = std::move(list);
  }
  return out;
}

void checkPairOrder(const Program& p) {
  const Graph& g = p.graph();
  const auto n = static_cast<size_t>(p.numDevices());
  std::vector<std::vector<std::vector<ValueId>>> sent(n, std::vector<std::vector<ValueId>>(n));
  auto received = sent;  // [from][to]
  for (size_t d = 0; d < n; ++d) {
    for (const Instruction& inst : p.schedule(static_cast<int>(d))) {
      if (inst.kind == Kind::Send) sent[d][static_cast<size_t>(inst.peer)].push_back(inst.value);
      if (inst.kind == Kind::Recv) received[static_cast<size_t>(inst.peer)][d].push_back(inst.value);
    }
  }
  for (size_t a = 0; a < n; ++a) {
    for (size_t b = 0; b < n; ++b) {
      const std::vector<ValueId>& s = sent[a][b];
      const std::vector<ValueId>& r = received[a][b];
      for (size_t k = 0; k < std::min(s.size(), r.size()); ++k) {
        MP_CHECK(s[k] == r[k], ConfigError,
                 "modelpar rank executor: over NCCL, device {}'s transfer {} to device {} is %{} "
                 "but device {} receives %{} there; NCCL pairs transfers by order, not by tag, so "
                 "this program cannot run over NCCL (use Gloo, or a schedule whose transfers keep "
                 "order)", a, k, b, g.value(s[k]).name, b, g.value(r[k]).name);
      }
    }
  }
}

}  // namespace modelpar::ir
