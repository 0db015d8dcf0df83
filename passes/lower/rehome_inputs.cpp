// Pass `rehome-inputs` (rehome_inputs.h).
#include "passes/lower/rehome_inputs.h"

#include <algorithm>
#include <charconv>

#include "ir/check.h"
#include "ir/verifier.h"

namespace modelpar::passes {
namespace {

using Kind = ir::Instruction::Kind;

bool isTransfer(const ir::Instruction& i, Kind kind, ir::ValueId v, int peer) {
  return i.kind == kind && i.value == v && i.peer == peer;
}

// Whether device d's list reads v (a run taking it, or a send of it).
bool uses(const ir::Program& p, int d, ir::ValueId v) {
  for (const ir::Instruction& i : p.schedule(d)) {
    if (i.kind == Kind::Send && i.value == v) return true;
    if (i.kind != Kind::Run) continue;
    const std::vector<ir::ValueId> in = p.graph().node(i.node).inputs();
    if (std::find(in.begin(), in.end(), v) != in.end()) return true;
  }
  return false;
}

// Drops the first instruction of device d's list that `match` accepts.
template <typename Match>
void dropFirst(ir::Program& p, int d, Match&& match) {
  std::vector<ir::Instruction>& s = p.schedule(d);
  auto it = std::find_if(s.begin(), s.end(), match);
  if (it != s.end()) s.erase(it);
}

void rehome(ir::Program& p, ir::Input& in, int home) {
  const ir::ValueId v = in.value;
  const int bound = in.device.value_or(0);
  if (bound == home) return;
  in.device = home;
  // Home already holds v: its receives of v before it frees v go, and the
  // matching sends with them.
  std::vector<ir::Instruction>& at_home = p.schedule(home);
  for (size_t k = 0; k < at_home.size();) {
    const ir::Instruction& i = at_home[k];
    if (i.kind == Kind::Free && i.value == v) break;
    if (i.kind == Kind::Recv && i.value == v) {
      const int from = i.peer;
      at_home.erase(at_home.begin() + static_cast<std::ptrdiff_t>(k));
      dropFirst(p, from, [&](const ir::Instruction& s) { return isTransfer(s, Kind::Send, v, home); });
      continue;
    }
    ++k;
  }
  if (!uses(p, bound, v)) {  // bound only to be passed on, and nothing is left to pass
    std::vector<ir::Instruction>& s = p.schedule(bound);
    s.erase(std::remove_if(s.begin(), s.end(),
                           [&](const ir::Instruction& i) { return i.kind == Kind::Free && i.value == v; }),
            s.end());
    return;
  }
  std::vector<ir::Instruction>& there = p.schedule(bound);
  there.insert(there.begin(), ir::Instruction::recv(v, home));
  at_home.insert(at_home.begin(), ir::Instruction::send(v, bound));
}

}  // namespace

ir::Program rehomeInputs(const ir::Program& p, const InputHomes& homes) {
  const ir::Graph& g = p.graph();
  std::vector<std::pair<size_t, int>> moves;  // (input index, home), all checked first
  for (const auto& [name, home] : homes) {
    const std::optional<ir::ValueId> v = g.findValue(name);
    const std::optional<size_t> k = v ? g.inputIndex(*v) : std::nullopt;
    MP_CHECK(k.has_value(), ConfigError, "modelpar {}: %{} is not an input of graph @{}",
             kRehomeInputsPassId, name, g.name());
    MP_CHECK(home >= 0 && home < p.numDevices(), ConfigError,
             "modelpar {}: %{} has home device {}, but the program has devices 0 to {}",
             kRehomeInputsPassId, name, home, p.numDevices() - 1);
    moves.emplace_back(*k, home);
  }
  ir::Program out = p;
  for (const auto& [k, home] : moves) rehome(out, out.graph().inputs()[k], home);
  ir::verify(out);
  return out;
}

InputHomes parseInputHomes(std::string_view text) {
  InputHomes out;
  if (text.empty()) return out;
  for (bool more = true; more;) {
    const size_t plus = text.find('+');
    const std::string_view item = text.substr(0, plus);
    more = plus != std::string_view::npos;
    if (more) text.remove_prefix(plus + 1);
    const size_t at = item.rfind('@');
    int device = -1;
    const char* end = item.data() + item.size();
    const bool ok = at != std::string_view::npos && at > 0 &&
                    std::from_chars(item.data() + at + 1, end, device).ptr == end && at + 1 < item.size();
    MP_CHECK(ok, ConfigError, "modelpar {}: homes item '{}' is not name@device (e.g. fc1.weight@1)",
             kRehomeInputsPassId, item);
    std::string_view name = item.substr(0, at);
    if (name.front() == '%') name.remove_prefix(1);
    out.emplace_back(std::string(name), device);
  }
  return out;
}

}  // namespace modelpar::passes
