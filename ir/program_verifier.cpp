// verify(const Program&): placement, send/recv matching, liveness of values on
// each device, and absence of deadlock, following the semantics below.
#include <cstdint>
#include <string>
#include <unordered_map>
#include <vector>

#include "ir/check.h"
#include "ir/verifier.h"

// Note [Program semantics]
// ~~~~~~~~~~~~~~~~~~~~~~~~
// Each device executes its instruction list in order, one at a time
// (DistIR, seed 003 section 2.1, with Send split into a send and a recv):
//
//   run %y        computes the node's outputs on this device; every value it
//                 reads must be available here.
//   send %v -> d  buffered: it never blocks; %v must be available here.
//   recv %v <- s  blocks until device s has issued `send %v -> this`;
//                 afterwards %v is available here too.
//   free %v       ends this device's copy of %v.
//
// A value is available on a device from the instruction that runs its producer
// there, or its recv there, or from the start if it is a graph input placed
// there (`{device=k}`; a one-device program may omit input devices: they then
// live on device 0), until a `free` on that device. A (value, source,
// destination) triple is sent at most once, and each send has exactly one recv.
//
// "Happens before" is the order whose edges are program order on each device
// plus each send -> its matching recv. The program deadlocks iff that graph has
// a cycle. Example, two devices each waiting for the other:
//
//   device 0              device 1
//   0: recv %b <- 1 <-.  .-> 0: recv %a <- 0
//   1: send %a -> 1 --+--'   1: send %b -> 0
//                     '---------------'
//
// Device 0's recv needs device 1's send, which comes after device 1's recv,
// which needs device 0's send, which comes after device 0's recv. Moving either
// send ahead of the recv on its device breaks the cycle. The check below is
// Kahn's algorithm specialised to per-device chains: it advances each device
// until it blocks on a recv whose send is not yet issued, and wakes the device
// when that send is issued; O(instructions), no recursion.

namespace modelpar::ir {
namespace {

constexpr size_t kMaxCycleSteps = 8;

bool inRange(int32_t id, size_t n) { return id >= 0 && static_cast<size_t>(id) < n; }

class ProgramVerifier {
 public:
  explicit ProgramVerifier(const Program& p)
      : p_(p), g_(p.graph()), num_devices_(p.numDevices()) {}

  void run() {
    verify(g_);
    checkPlacementAttributes();
    checkInstructions();
    matchSendsAndRecvs();
    for (int d = 0; d < num_devices_; ++d) checkLiveness(d);
    checkDeadlock();
    checkOutputs();
  }

 private:
  struct Loc {
    int device = -1;
    int32_t index = -1;
  };
  // Where a device's copy of a value stands while its list is walked.
  enum class State : uint8_t { Absent, Live, Freed };

  const std::vector<Instruction>& sched(int d) const { return p_.schedule(d); }
  size_t global(int d, size_t i) const { return offsets_[static_cast<size_t>(d)] + i; }
  std::string val(ValueId v) const {
    return inRange(v, g_.numValues()) ? "%" + g_.value(v).name : fmt::format("value id {}", v);
  }
  std::string node(NodeId n) const {
    return fmt::format("node {} ({})", g_.nodeRef(n), g_.node(n).qualifiedName());
  }
  std::string describe(const Instruction& ins) const {
    switch (ins.kind) {
      case Instruction::Kind::Run:
        return "run " + (inRange(ins.node, g_.numNodes()) ? g_.nodeRef(ins.node)
                                                          : fmt::format("node id {}", ins.node));
      case Instruction::Kind::Send: return fmt::format("send {} -> {}", val(ins.value), ins.peer);
      case Instruction::Kind::Recv: return fmt::format("recv {} <- {}", val(ins.value), ins.peer);
      case Instruction::Kind::Free: return "free " + val(ins.value);
    }
    return "?";
  }
  // "device 1, instruction 0 (recv %h <- 0)"
  std::string at(int d, size_t i) const {
    return fmt::format("device {}, instruction {} ({})", d, i, describe(sched(d)[i]));
  }
  // The device a value is made on: its input's device, or where its producer runs.
  int home(ValueId v) const {
    const Value& value = g_.value(v);
    if (value.producer != kNoId) return run_at_[static_cast<size_t>(value.producer)].device;
    return inputDevice(g_.inputs()[*g_.inputIndex(v)]);
  }
  int inputDevice(const Input& in) const { return in.device.value_or(0); }

  void checkPlacementAttributes() {
    for (const Input& in : g_.inputs()) {
      MP_CHECK(in.device || num_devices_ == 1, InvalidIrError,
               "modelpar verify: graph @{}: graph input {} has no device; a program with more "
               "than one device needs one on every input", g_.name(), val(in.value));
      MP_CHECK(inputDevice(in) < num_devices_, InvalidIrError,
               "modelpar verify: graph @{}: graph input {} has device={} but the program has {} "
               "devices", g_.name(), val(in.value), inputDevice(in), num_devices_);
    }
    for (size_t n = 0; n < g_.numNodes(); ++n) {
      const std::optional<int>& dev = g_.nodes()[n].device;
      MP_CHECK(!dev || *dev < num_devices_, InvalidIrError,
               "modelpar verify: graph @{}: {} has device={} but the program has {} devices",
               g_.name(), node(static_cast<NodeId>(n)), dev.value_or(0), num_devices_);
    }
  }

  // Ids and peers in range; every node run exactly once, where its attribute says.
  void checkInstructions() {
    offsets_.assign(static_cast<size_t>(num_devices_) + 1, 0);
    run_at_.assign(g_.numNodes(), Loc{});
    for (int d = 0; d < num_devices_; ++d) {
      const auto& s = sched(d);
      offsets_[static_cast<size_t>(d) + 1] = offsets_[static_cast<size_t>(d)] + s.size();
      for (size_t i = 0; i < s.size(); ++i) {
        const Instruction& ins = s[i];
        if (ins.kind == Instruction::Kind::Run) {
          checkRun(d, i, ins.node);
          continue;
        }
        MP_CHECK(inRange(ins.value, g_.numValues()), InvalidIrError,
                 "modelpar verify: graph @{}: {}: value id {} does not exist (the graph has {} "
                 "values)", g_.name(), at(d, i), ins.value, g_.numValues());
        if (ins.kind == Instruction::Kind::Free) continue;
        MP_CHECK(ins.peer >= 0 && ins.peer < num_devices_, InvalidIrError,
                 "modelpar verify: graph @{}: {}: device {} does not exist (the program has {} "
                 "devices)", g_.name(), at(d, i), ins.peer, num_devices_);
        MP_CHECK(ins.peer != d, InvalidIrError,
                 "modelpar verify: graph @{}: {}: a device cannot send to or receive from itself",
                 g_.name(), at(d, i));
      }
    }
    for (size_t n = 0; n < g_.numNodes(); ++n) {
      const auto id = static_cast<NodeId>(n);
      const std::optional<int>& dev = g_.node(id).device;
      MP_CHECK(run_at_[n].device >= 0, InvalidIrError,
               "modelpar verify: graph @{}: {} is never run; add `run {}` to {}", g_.name(),
               node(id), g_.nodeRef(id), dev ? fmt::format("device {}", *dev) : "a device");
    }
  }

  void checkRun(int d, size_t i, NodeId n) {
    MP_CHECK(inRange(n, g_.numNodes()), InvalidIrError,
             "modelpar verify: graph @{}: {}: node id {} does not exist (the graph has {} nodes)",
             g_.name(), at(d, i), n, g_.numNodes());
    Loc& first = run_at_[static_cast<size_t>(n)];
    MP_CHECK(first.device < 0, InvalidIrError,
             "modelpar verify: graph @{}: {} is run twice (device {} instruction {} and device {} "
             "instruction {}); keep one", g_.name(), node(n), first.device, first.index, d, i);
    const std::optional<int>& dev = g_.node(n).device;
    MP_CHECK(!dev || *dev == d, InvalidIrError,
             "modelpar verify: graph @{}: {} has device={} but runs on device {} (instruction "
             "{}); move `run {}` to device {} or change the attribute", g_.name(), node(n),
             dev.value_or(0), d, i, g_.nodeRef(n), dev.value_or(0));
    first = Loc{d, static_cast<int32_t>(i)};
  }

  // Pairs every recv with the one send of the same (value, source, destination).
  void matchSendsAndRecvs() {
    const auto nd = static_cast<uint64_t>(num_devices_);
    auto key = [&](ValueId v, int src, int dst) {
      return (static_cast<uint64_t>(v) * nd + static_cast<uint64_t>(src)) * nd +
             static_cast<uint64_t>(dst);
    };
    std::unordered_map<uint64_t, size_t> send_of;  // key -> global index of the send
    for (int d = 0; d < num_devices_; ++d) {
      const auto& s = sched(d);
      for (size_t i = 0; i < s.size(); ++i) {
        if (s[i].kind != Instruction::Kind::Send) continue;
        auto [it, fresh] = send_of.emplace(key(s[i].value, d, s[i].peer), global(d, i));
        MP_CHECK(fresh, InvalidIrError,
                 "modelpar verify: graph @{}: {}: {} is sent to device {} twice (also at "
                 "instruction {}); drop one send", g_.name(), at(d, i), val(s[i].value),
                 s[i].peer, it->second - global(d, 0));
      }
    }
    const size_t total = offsets_.back();
    partner_.assign(total, SIZE_MAX);
    for (int d = 0; d < num_devices_; ++d) {
      const auto& s = sched(d);
      for (size_t i = 0; i < s.size(); ++i) {
        if (s[i].kind != Instruction::Kind::Recv) continue;
        const ValueId v = s[i].value;
        const int src = s[i].peer;
        auto it = send_of.find(key(v, src, d));
        MP_CHECK(it != send_of.end(), InvalidIrError,
                 "modelpar verify: graph @{}: {}: no matching send of {} from device {} to device "
                 "{}; add `send {} -> {}` to device {}", g_.name(), at(d, i), val(v), src, d,
                 val(v), d, src);
        const size_t snd = it->second;
        MP_CHECK(partner_[snd] == SIZE_MAX, InvalidIrError,
                 "modelpar verify: graph @{}: {}: {} is received from device {} twice (also at "
                 "instruction {}); drop one recv", g_.name(), at(d, i), val(v), src,
                 partner_[snd] - global(d, 0));
        partner_[snd] = global(d, i);
        partner_[global(d, i)] = snd;
      }
    }
    for (int d = 0; d < num_devices_; ++d) {
      const auto& s = sched(d);
      for (size_t i = 0; i < s.size(); ++i) {
        if (s[i].kind != Instruction::Kind::Send) continue;
        MP_CHECK(partner_[global(d, i)] != SIZE_MAX, InvalidIrError,
                 "modelpar verify: graph @{}: {}: no matching recv of {} on device {}; add `recv "
                 "{} <- {}` there or drop this send", g_.name(), at(d, i), val(s[i].value),
                 s[i].peer, val(s[i].value), d);
      }
    }
  }

  // Walks device d's list with the state of each value on d. The state arrays are
  // shared by all devices and reset through `touched`, so this is O(list + inputs).
  void checkLiveness(int d) {
    if (state_.empty()) {
      state_.assign(g_.numValues(), State::Absent);
      since_.assign(g_.numValues(), -1);
      alive_at_end_.assign(g_.numValues(), 0);
      last_free_.assign(g_.numValues(), Loc{});
    }
    std::vector<ValueId> touched;
    auto set = [&](ValueId v, State st, int32_t i) {
      state_[static_cast<size_t>(v)] = st;
      since_[static_cast<size_t>(v)] = i;
      touched.push_back(v);
    };
    for (const Input& in : g_.inputs()) {
      if (inputDevice(in) == d) set(in.value, State::Live, -1);
    }
    const auto& s = sched(d);
    for (size_t i = 0; i < s.size(); ++i) {
      const Instruction& ins = s[i];
      const auto idx = static_cast<int32_t>(i);
      switch (ins.kind) {
        case Instruction::Kind::Run:
          for (ValueId v : g_.node(ins.node).inputs()) requireHere(d, i, v);
          for (ValueId v : g_.node(ins.node).outputs) set(v, State::Live, idx);
          break;
        case Instruction::Kind::Send: requireHere(d, i, ins.value); break;
        case Instruction::Kind::Recv: {
          const auto v = static_cast<size_t>(ins.value);
          MP_CHECK(state_[v] != State::Live, InvalidIrError,
                   "modelpar verify: graph @{}: {}: {} is already on device {} ({}); drop this "
                   "recv", g_.name(), at(d, i), val(ins.value), d,
                   since_[v] < 0 ? std::string("a graph input placed here")
                                 : fmt::format("since instruction {}", since_[v]));
          set(ins.value, State::Live, idx);
          break;
        }
        case Instruction::Kind::Free:
          requireHere(d, i, ins.value);
          set(ins.value, State::Freed, idx);
          last_free_[static_cast<size_t>(ins.value)] = Loc{d, idx};
          break;
      }
    }
    for (ValueId v : touched) {
      if (state_[static_cast<size_t>(v)] == State::Live) alive_at_end_[static_cast<size_t>(v)] = 1;
      state_[static_cast<size_t>(v)] = State::Absent;
    }
  }

  void requireHere(int d, size_t i, ValueId v) {
    const auto sv = static_cast<size_t>(v);
    if (state_[sv] == State::Live) return;
    MP_CHECK(state_[sv] != State::Freed, InvalidIrError,
             "modelpar verify: graph @{}: {}: {} was freed at instruction {}; move the free later",
             g_.name(), at(d, i), val(v), since_[sv]);
    const int from = home(v);
    MP_CHECK(from != d, InvalidIrError,
             "modelpar verify: graph @{}: {}: {} is not on device {} yet (its producer runs at "
             "instruction {}); run that first", g_.name(), at(d, i), val(v), d,
             run_at_[static_cast<size_t>(g_.value(v).producer)].index);
    MP_THROW(InvalidIrError,
             "modelpar verify: graph @{}: {}: {} is not on device {} (it lives on device {}; add "
             "`send {} -> {}` there and `recv {} <- {}` here)", g_.name(), at(d, i), val(v), d,
             from, val(v), d, val(v), from);
  }

  void checkDeadlock() {
    std::vector<size_t> pc(static_cast<size_t>(num_devices_), 0);
    std::vector<char> issued(offsets_.back(), 0);
    std::vector<int> waiter(offsets_.back(), -1);  // send -> the device blocked on its recv
    std::vector<int> ready;
    for (int d = num_devices_ - 1; d >= 0; --d) ready.push_back(d);
    while (!ready.empty()) {
      const int d = ready.back();
      ready.pop_back();
      const auto& s = sched(d);
      size_t& i = pc[static_cast<size_t>(d)];
      for (; i < s.size(); ++i) {
        const size_t gi = global(d, i);
        if (s[i].kind == Instruction::Kind::Recv && !issued[partner_[gi]]) {
          waiter[partner_[gi]] = d;
          break;
        }
        if (s[i].kind != Instruction::Kind::Send) continue;
        issued[gi] = 1;
        if (waiter[gi] >= 0) ready.push_back(waiter[gi]);
      }
    }
    std::vector<int> stuck;
    for (int d = 0; d < num_devices_; ++d) {
      if (pc[static_cast<size_t>(d)] < sched(d).size()) stuck.push_back(d);
    }
    if (stuck.empty()) return;
    reportDeadlock(pc, stuck);
  }

  // Every stuck device waits at a recv whose send sits later on another stuck
  // device, so following "waits for" from any stuck device must close a cycle.
  [[noreturn]] void reportDeadlock(const std::vector<size_t>& pc, const std::vector<int>& stuck) {
    auto waitAt = [&](int d) {
      return fmt::format("device {} waits at instruction {} ({})", d, pc[static_cast<size_t>(d)],
                         describe(sched(d)[pc[static_cast<size_t>(d)]]));
    };
    std::string waits = waitAt(stuck[0]);
    for (size_t k = 1; k < stuck.size() && k < kMaxCycleSteps; ++k) {
      waits += (k == 1 ? " while " : ", ") + waitAt(stuck[k]);
    }
    if (stuck.size() > kMaxCycleSteps) waits += ", ...";

    std::vector<int> pos(static_cast<size_t>(num_devices_), -1);
    std::vector<int> path;
    int d = stuck[0];
    while (pos[static_cast<size_t>(d)] < 0) {
      pos[static_cast<size_t>(d)] = static_cast<int>(path.size());
      path.push_back(d);
      d = sched(d)[pc[static_cast<size_t>(d)]].peer;
    }
    const std::vector<int> cycle(path.begin() + pos[static_cast<size_t>(d)], path.end());

    auto step = [&](int dev, size_t i) {
      return fmt::format("device {} instruction {} ({})", dev, i, describe(sched(dev)[i]));
    };
    std::vector<std::string> steps = {step(cycle[0], pc[static_cast<size_t>(cycle[0])])};
    for (size_t k = 0; k < cycle.size(); ++k) {
      const int from = cycle[k];
      const int to = cycle[(k + 1) % cycle.size()];
      const size_t snd = partner_[global(from, pc[static_cast<size_t>(from)])];
      const std::string waits_for = k == 0 ? "waits for " : "which waits for ";
      steps.push_back(waits_for + step(to, snd - global(to, 0)));
      steps.push_back(k + 1 == cycle.size()
                          ? fmt::format("which comes after device {} instruction {}", to,
                                        pc[static_cast<size_t>(to)])
                          : "which comes after " + step(to, pc[static_cast<size_t>(to)]));
    }
    std::string chain = steps[0];
    for (size_t k = 1; k < steps.size() && k < kMaxCycleSteps; ++k) {
      chain += (k == 1 ? " " : ", ") + steps[k];
    }
    if (steps.size() > kMaxCycleSteps) chain += ", ...";
    MP_THROW(InvalidIrError,
             "modelpar verify: graph @{}: deadlock: {}: the cycle is {}; move a send ahead of the "
             "recv it waits behind", g_.name(), waits, chain);
  }

  void checkOutputs() {
    for (ValueId v : g_.outputs()) {
      const Loc& f = last_free_[static_cast<size_t>(v)];
      MP_CHECK(alive_at_end_[static_cast<size_t>(v)], InvalidIrError,
               "modelpar verify: graph @{}: graph output {} is not alive on any device at the "
               "end{}", g_.name(), val(v),
               f.device < 0 ? std::string()
                            : fmt::format(" (freed on device {} at instruction {}; drop that free)",
                                          f.device, f.index));
    }
  }

  const Program& p_;
  const Graph& g_;
  const int num_devices_;
  std::vector<size_t> offsets_;  // per device, the global index of its instruction 0
  std::vector<Loc> run_at_;      // per node, where it runs
  std::vector<size_t> partner_;  // per global instruction: a send's recv, a recv's send
  std::vector<State> state_;     // per value, on the device being walked
  std::vector<int32_t> since_;   // per value, instruction of the last state change (-1: start)
  std::vector<char> alive_at_end_;
  std::vector<Loc> last_free_;
};

}  // namespace

void verify(const Program& p) { ProgramVerifier(p).run(); }

}  // namespace modelpar::ir
