// The reference Program interpreter (program_interpreter.h; see
// Note [Reference program execution]).
#include "runtime/program_interpreter.h"

#include <deque>
#include <map>
#include <tuple>

#include <ATen/core/Tensor.h>
#include <c10/util/Exception.h>

#include "ir/printer.h"
#include "ir/verifier.h"
#include "runtime/check.h"
#include "runtime/value_types.h"

namespace modelpar::runtime {
namespace {

// Sent values waiting for their receive, keyed by (value, from, to).
using Mailbox = std::map<std::tuple<ir::ValueId, int, int>, std::deque<c10::IValue>>;

// The receiver gets its own tensor: a later in-place op on either side must
// not show through on the other, as it could not across real devices.
c10::IValue copyForTransfer(const c10::IValue& v) {
  if (v.isTensor() && v.toTensor().defined()) return v.toTensor().clone();
  return v;
}

class Execution {
 public:
  Execution(const ir::Program& p, const std::vector<ResolvedOp>& ops)
      : p_(p), g_(p.graph()), ops_(ops),
        envs_(static_cast<size_t>(p.numDevices()), Env(p.graph().numValues())) {}

  void bindInputs(std::vector<c10::IValue> inputs) {
    checkGraphInputs(g_, inputs);
    for (size_t i = 0; i < inputs.size(); ++i) {
      const ir::Input& in = g_.inputs()[i];
      const int d = in.device.value_or(0);
      MP_RT_CHECK(d >= 0 && d < p_.numDevices(), InvalidIrError, "input %",
                  g_.value(in.value).name, " is placed on device ", d, " but the program has ",
                  p_.numDevices(), " devices");
      slot(d, in.value) = std::move(inputs[i]);
    }
  }

  // Round robin in device order; each device runs until it blocks or ends.
  void execute() {
    const int n = p_.numDevices();
    std::vector<size_t> pc(static_cast<size_t>(n), 0);
    for (;;) {
      bool progressed = false;
      bool finished = true;
      for (int d = 0; d < n; ++d) {
        const std::vector<ir::Instruction>& sched = p_.schedule(d);
        size_t& i = pc[static_cast<size_t>(d)];
        while (i < sched.size() && step(d, i, sched[i])) {
          ++i;
          progressed = true;
        }
        finished = finished && i == sched.size();
      }
      if (finished) return;
      if (!progressed) throwDeadlock(pc);
    }
  }

  std::vector<c10::IValue> outputs() const {
    std::vector<c10::IValue> out;
    for (ir::ValueId v : g_.outputs()) {
      const c10::IValue* found = nullptr;
      for (const Env& env : envs_) {
        if (!env[static_cast<size_t>(v)].isNone()) {
          found = &env[static_cast<size_t>(v)];
          break;
        }
      }
      MP_RT_CHECK(found != nullptr, ExecutionError, "graph output %", g_.value(v).name,
                  " is on no device when the program ends (freed, or never computed)");
      out.push_back(*found);
    }
    return out;
  }

 private:
  c10::IValue& slot(int d, ir::ValueId v) {
    return envs_[static_cast<size_t>(d)][static_cast<size_t>(v)];
  }

  std::string where(int d, size_t i, const ir::Instruction& inst) const {
    std::string s = c10::str("device ", d, ", instruction ", i, " (", ir::printInstruction(g_, inst));
    if (inst.kind == ir::Instruction::Kind::Run) s += ", " + ops_[static_cast<size_t>(inst.node)].opName();
    return s + ")";
  }

  // Executes one instruction; false when it is a receive that must wait.
  bool step(int d, size_t i, const ir::Instruction& inst) {
    using Kind = ir::Instruction::Kind;
    switch (inst.kind) {
      case Kind::Run: {
        const ResolvedOp& op = ops_[static_cast<size_t>(inst.node)];
        std::vector<c10::IValue> out;
        try {
          out = op.call(envs_[static_cast<size_t>(d)]);
        } catch (const c10::Error& e) {
          MP_RT_THROW(ExecutionError, where(d, i, inst), ": ", e.what_without_backtrace());
        } catch (const Error& e) {
          MP_RT_THROW(ExecutionError, where(d, i, inst), ": ", e.what());
        }
        const std::vector<ir::ValueId>& defs = g_.node(inst.node).outputs;
        for (size_t k = 0; k < defs.size(); ++k) slot(d, defs[k]) = std::move(out[k]);
        return true;
      }
      case Kind::Send: {
        const c10::IValue& v = slot(d, inst.value);
        MP_RT_CHECK(!v.isNone(), ExecutionError, where(d, i, inst), ": %",
                    g_.value(inst.value).name, " is not on device ", d);
        mailbox_[{inst.value, d, inst.peer}].push_back(copyForTransfer(v));
        return true;
      }
      case Kind::Recv: {
        auto it = mailbox_.find({inst.value, inst.peer, d});
        if (it == mailbox_.end() || it->second.empty()) return false;
        slot(d, inst.value) = std::move(it->second.front());
        it->second.pop_front();
        return true;
      }
      case Kind::Free: {
        c10::IValue& v = slot(d, inst.value);
        MP_RT_CHECK(!v.isNone(), ExecutionError, where(d, i, inst), ": %",
                    g_.value(inst.value).name, " is not on device ", d);
        v = c10::IValue();
        return true;
      }
    }
    return true;
  }

  [[noreturn]] void throwDeadlock(const std::vector<size_t>& pc) const {
    std::string waits;
    for (int d = 0; d < p_.numDevices(); ++d) {
      const size_t i = pc[static_cast<size_t>(d)];
      const std::vector<ir::Instruction>& sched = p_.schedule(d);
      if (i == sched.size()) continue;
      waits += c10::str(waits.empty() ? "" : "; ", "device ", d, " waits at instruction ", i, " (",
                        ir::printInstruction(g_, sched[i]), ")");
    }
    MP_RT_THROW(ExecutionError, "deadlock at run time: ", waits,
                "; no device can issue the sends these wait for");
  }

  const ir::Program& p_;
  const ir::Graph& g_;
  const std::vector<ResolvedOp>& ops_;
  std::vector<Env> envs_;  // by device
  Mailbox mailbox_;
};

}  // namespace

ProgramInterpreter::ProgramInterpreter(const ir::Program& p, ProgramInterpreterOptions options)
    : program_(p) {
  if (options.verify) ir::verify(program_);
  const ir::Graph& g = program_.graph();
  ops_.reserve(g.numNodes());
  for (size_t n = 0; n < g.numNodes(); ++n) ops_.emplace_back(g, static_cast<ir::NodeId>(n));
}

std::vector<c10::IValue> ProgramInterpreter::run(std::vector<c10::IValue> inputs) const {
  Execution r(program_, ops_);
  r.bindInputs(std::move(inputs));
  r.execute();
  return r.outputs();
}

}  // namespace modelpar::runtime
