// Pass `simulate` (simulate.h). Instructions get global ids (device offset +
// index); every timed one resolves once.
//
// Note [In-order issue]
// ~~~~~~~~~~~~~~~~~~~~~
// A device's worker issues its instructions in program order, and a recv
// holds it until the value has arrived (CPU workers: the worker waits for
// the copy; GPUs: the compute stream waits for the copy's event, so every
// later kernel on it does too). So a run or send waits for every recv before
// it in the device's program, not only for the values it reads: a stage
// whose program receives the gradient it needs last before the one it needs
// first idles until the last arrives (measured: gpt's 2-stage GPipe, the
// first stage's backward waited 540 us for a gradient sent last while the
// model, reading only its operands, started it on the first one, 2525 us
// simulated against 2798 us run). Runs of a device depend only on that
// device's instructions, and a transfer completing only unblocks its two
// endpoints, so after each transfer only those two devices are advanced.
// A pending dependency is re-checked from where it stopped, never rescanned.
//
// Note [A link's latency does not hold it]
// ~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~
// A transfer takes link.latency_us + bytes / bandwidth from its start to
// the value's arrival, but it holds the sender's send channel and the
// receiver's receive channel for the bytes only: the next transfer on
// either may start while the first's latency runs. What a profile
// calibrates as latency is the hand-off's fixed delay (the receiver seeing
// the value: waking, polling, an event's round trip: modelpar's CPU
// profile measured 13-66 us on 2-vCPU VMs), not time the link is busy, and
// the hand-offs of back-to-back sends overlap in the executor. Held for
// the whole transfer, a stage that sends two values per micro-batch
// serialised them at the hand-off's pace: mlp's GPipe of 32 micro-batches
// over 2 CPU workers sends 64 values forward, simulated at 64 x 63.5 us of
// held link (6406 us) where it ran in 3578 us (2830 at best), and its 1F1B
// (which interleaves its sends with compute) simulated below GPipe where it
// ran slower. The send overhead (DeviceModel::sendOverheadUs) is what each
// send costs its sender, in the sender's compute.
#include "passes/lower/simulate.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <queue>

#include "ir/check.h"
#include "ir/printer.h"
#include "passes/lower/liveness.h"

namespace modelpar::passes {
namespace {

constexpr double kUnknown = std::numeric_limits<double>::quiet_NaN();
constexpr int32_t kNone = -1;

class Simulator {
 public:
  Simulator(const ir::Program& p, const DeviceModel& m) : p_(p), g_(p.graph()), m_(m) {
    nd_ = p.numDevices();
    MP_CHECK(m.numDevices() >= nd_, ConfigError,
             "modelpar {}: the program uses {} devices but the machine has {}", kSimulatePassId,
             nd_, m.numDevices());
    offset_.assign(static_cast<size_t>(nd_) + 1, 0);
    for (int d = 0; d < nd_; ++d) {
      offset_[static_cast<size_t>(d) + 1] = offset_[static_cast<size_t>(d)] +
                                            static_cast<int32_t>(p.schedule(d).size());
    }
    n_ = static_cast<size_t>(offset_.back());
  }

  SimulationReport run(const SimulateOptions& options) {
    flat_ = flatten(g_);
    compile();
    start_.assign(n_, kUnknown);
    end_.assign(n_, kUnknown);
    cause_.assign(n_, kNone);
    for (int d = 0; d < nd_; ++d) advance(d);
    while (!requests_.empty()) {
      auto [req, src] = requests_.top();
      requests_.pop();
      transfer(src, req);
    }
    checkFinished();
    return report(options);
  }

 private:
  struct Device {
    std::vector<int32_t> runs, sends;  // gids in program order
    size_t run_ptr = 0, send_ptr = 0;
    int32_t dep_pos = 0, send_dep_pos = 0;
    double compute_free = 0, tx_free = 0, rx_free = 0;
    int32_t last_run = kNone, last_tx = kNone, last_rx = kNone;  // causes
    bool outstanding = false;
    double request_cause_time = 0;
    int32_t request_cause = kNone;
    double compute_busy = 0, send_busy = 0, recv_busy = 0;
  };

  int deviceOf(int32_t gid) const {
    return static_cast<int>(std::upper_bound(offset_.begin(), offset_.end(), gid) - offset_.begin()) - 1;
  }
  const ir::Instruction& inst(int32_t gid) const {
    int d = deviceOf(gid);
    return p_.schedule(d)[static_cast<size_t>(gid - offset_[static_cast<size_t>(d)])];
  }

  // Receives by value, to match sends: CSR of (gid) with device / peer.
  struct RecvIndex {
    std::vector<int32_t> begin;  // by value, numValues() + 1 entries
    std::vector<int32_t> gids;
  };

  // A value not defined on the device being compiled.
  static constexpr int32_t kUnset = -2;

  // compile()'s state while it walks device d's program.
  struct Walk {
    int d;
    std::vector<int32_t>& where;        // defining gid on this device, -1 input
    std::vector<ir::ValueId>& touched;  // the values `where` has set, to reset it
    int32_t last_run = kNone;
    std::vector<int32_t> recvs_since_run = {};  // Note [In-order issue]
  };

  // Dependencies (gids whose end a run / send waits for), durations, matches.
  void compile() {
    devices_.resize(static_cast<size_t>(nd_));
    duration_.assign(n_, 0.0);
    held_.assign(n_, 0.0);
    dep_begin_.assign(n_ + 1, 0);
    match_.assign(n_, kNone);
    const RecvIndex recvs = indexRecvs();

    std::vector<int32_t> where(g_.numValues(), kUnset);  // defining gid on this device, -1 input
    std::vector<ir::ValueId> touched;
    deps_.reserve(n_ * 2);
    for (int d = 0; d < nd_; ++d) {
      Walk w{d, where, touched};
      compileDevice(w, recvs);
      for (ir::ValueId v : touched) where[static_cast<size_t>(v)] = kUnset;
      touched.clear();
    }
    dep_begin_[n_] = static_cast<int32_t>(deps_.size());
  }

  // Receives by value, to match sends.
  RecvIndex indexRecvs() const {
    std::vector<int32_t> recv_begin(g_.numValues() + 1, 0);
    for (int d = 0; d < nd_; ++d) {
      for (const ir::Instruction& i : p_.schedule(d)) {
        if (i.kind == ir::Instruction::Kind::Recv) ++recv_begin[static_cast<size_t>(i.value) + 1];
      }
    }
    for (size_t v = 0; v < g_.numValues(); ++v) recv_begin[v + 1] += recv_begin[v];
    std::vector<int32_t> recvs(static_cast<size_t>(recv_begin.back()));
    std::vector<int32_t> fill(recv_begin.begin(), recv_begin.end() - 1);
    for (int d = 0; d < nd_; ++d) {
      const auto& s = p_.schedule(d);
      for (size_t i = 0; i < s.size(); ++i) {
        if (s[i].kind != ir::Instruction::Kind::Recv) continue;
        recvs[static_cast<size_t>(fill[static_cast<size_t>(s[i].value)]++)] =
            offset_[static_cast<size_t>(d)] + static_cast<int32_t>(i);
      }
    }
    return RecvIndex{std::move(recv_begin), std::move(recvs)};
  }

  // The dependencies, durations and matches of device w.d's instructions.
  void compileDevice(Walk& w, const RecvIndex& recvs) {
    const int d = w.d;
    for (const ir::Input& in : g_.inputs()) {
      if (in.device.value_or(0) != d) continue;
      w.where[static_cast<size_t>(in.value)] = kNone;
      w.touched.push_back(in.value);
    }
    const auto& sched = p_.schedule(d);
    for (size_t i = 0; i < sched.size(); ++i) {
      const ir::Instruction& ins = sched[i];
      int32_t gid = offset_[static_cast<size_t>(d)] + static_cast<int32_t>(i);
      dep_begin_[static_cast<size_t>(gid)] = static_cast<int32_t>(deps_.size());
      switch (ins.kind) {
        case ir::Instruction::Kind::Run:
          compileRun(w, i, gid, ins);
          break;
        case ir::Instruction::Kind::Send:
          compileSend(w, i, gid, ins, recvs);
          break;
        case ir::Instruction::Kind::Recv:
          w.recvs_since_run.push_back(gid);
          if (w.where[static_cast<size_t>(ins.value)] == kUnset) w.touched.push_back(ins.value);
          w.where[static_cast<size_t>(ins.value)] = gid;
          break;
        case ir::Instruction::Kind::Free:
          break;
      }
    }
  }

  // Instruction i of device w.d (ins) waits for the instruction defining v.
  void depOn(const Walk& w, size_t i, const ir::Instruction& ins, ir::ValueId v) {
    int32_t where = w.where[static_cast<size_t>(v)];
    MP_CHECK(where != kUnset, InvalidIrError,
             "modelpar {}: device {} instruction {} ({}) uses %{} which is not on the "
             "device; run ir::verify", kSimulatePassId, w.d, i,
             ir::printInstruction(g_, ins), g_.value(v).name);
    if (where >= 0) deps_.push_back(where);
  }

  // A run: waits for its operands and the recvs before it; defines its outputs.
  void compileRun(Walk& w, size_t i, int32_t gid, const ir::Instruction& ins) {
    auto n = static_cast<size_t>(ins.node);
    MP_CHECK(!std::isnan(flat_.time_us[n]), ConfigError,
             "modelpar {}: node {} ({}) has no cost; run the cost pass first",
             kSimulatePassId, g_.nodeRef(ins.node), g_.node(ins.node).qualifiedName());
    for (int32_t k = flat_.arg_begin[n]; k < flat_.arg_begin[n + 1]; ++k) {
      depOn(w, i, ins, flat_.args[static_cast<size_t>(k)]);
    }
    deps_.insert(deps_.end(), w.recvs_since_run.begin(), w.recvs_since_run.end());
    w.recvs_since_run.clear();
    duration_[static_cast<size_t>(gid)] = flat_.time_us[n];
    for (int32_t k = flat_.out_begin[n]; k < flat_.out_begin[n + 1]; ++k) {
      auto o = static_cast<size_t>(flat_.outs[static_cast<size_t>(k)]);
      if (w.where[o] == kUnset) w.touched.push_back(static_cast<ir::ValueId>(o));
      w.where[o] = gid;
    }
    devices_[static_cast<size_t>(w.d)].runs.push_back(gid);
    w.last_run = gid;
  }

  // A send: its dependencies, its transfer's time, and its matching recv.
  void compileSend(Walk& w, size_t i, int32_t gid, const ir::Instruction& ins,
                   const RecvIndex& recvs) {
    const int d = w.d;
    depOn(w, i, ins, ins.value);
    // The worker issues the send after the run before it: that run
    // lasts the send's host cost longer (DeviceModel::sendOverheadUs;
    // a send before any run of its device costs its device nothing).
    if (w.last_run != kNone) duration_[static_cast<size_t>(w.last_run)] += m_.sendOverheadUs();
    if (w.last_run != kNone) deps_.push_back(w.last_run);
    deps_.insert(deps_.end(), w.recvs_since_run.begin(), w.recvs_since_run.end());
    MP_CHECK(ins.peer >= 0 && ins.peer < nd_, InvalidIrError,
             "modelpar {}: device {} sends to device {} of {}", kSimulatePassId, d,
             ins.peer, nd_);
    duration_[static_cast<size_t>(gid)] =
        m_.transferUs(d, ins.peer, flat_.dense_bytes[static_cast<size_t>(ins.value)]);
    // Note [A link's latency does not hold it]
    held_[static_cast<size_t>(gid)] =
        duration_[static_cast<size_t>(gid)] - m_.link(d, ins.peer).latency_us;
    auto v = static_cast<size_t>(ins.value);
    for (int32_t k = recvs.begin[v]; k < recvs.begin[v + 1]; ++k) {
      int32_t r = recvs.gids[static_cast<size_t>(k)];
      if (match_[static_cast<size_t>(r)] != kNone || deviceOf(r) != ins.peer ||
          inst(r).peer != d) {
        continue;
      }
      match_[static_cast<size_t>(r)] = gid;
      match_[static_cast<size_t>(gid)] = r;
      break;
    }
    MP_CHECK(match_[static_cast<size_t>(gid)] != kNone, InvalidIrError,
             "modelpar {}: device {} instruction {} ({}) has no matching recv on "
             "device {}", kSimulatePassId, d, i, ir::printInstruction(g_, ins), ins.peer);
    devices_[static_cast<size_t>(d)].sends.push_back(gid);
    ++num_transfers_;
  }

  // Runs every run of device d whose inputs are known; then offers its next send.
  void advance(int d) {
    Device& dev = devices_[static_cast<size_t>(d)];
    while (dev.run_ptr < dev.runs.size()) {
      int32_t r = dev.runs[dev.run_ptr];
      auto rb = dep_begin_[static_cast<size_t>(r)], re = dep_begin_[static_cast<size_t>(r) + 1];
      int32_t k = rb + dev.dep_pos;
      while (k < re && !std::isnan(end_[static_cast<size_t>(deps_[static_cast<size_t>(k)])])) ++k;
      dev.dep_pos = k - rb;
      if (k < re) break;  // waits for a transfer
      double start = dev.compute_free;
      int32_t cause = dev.last_run;
      for (int32_t j = rb; j < re; ++j) {
        int32_t dep = deps_[static_cast<size_t>(j)];
        if (end_[static_cast<size_t>(dep)] > start) {
          start = end_[static_cast<size_t>(dep)];
          cause = dep;
        }
      }
      double end = start + duration_[static_cast<size_t>(r)];
      start_[static_cast<size_t>(r)] = start;
      end_[static_cast<size_t>(r)] = end;
      cause_[static_cast<size_t>(r)] = cause;
      dev.compute_free = end;
      dev.compute_busy += duration_[static_cast<size_t>(r)];
      dev.last_run = r;
      ++dev.run_ptr;
      dev.dep_pos = 0;
    }
    if (dev.outstanding || dev.send_ptr >= dev.sends.size()) return;
    int32_t s = dev.sends[dev.send_ptr];
    auto sb = dep_begin_[static_cast<size_t>(s)], se = dep_begin_[static_cast<size_t>(s) + 1];
    int32_t k = sb + dev.send_dep_pos;
    while (k < se && !std::isnan(end_[static_cast<size_t>(deps_[static_cast<size_t>(k)])])) ++k;
    dev.send_dep_pos = k - sb;
    if (k < se) return;
    double req = dev.tx_free;
    int32_t cause = dev.last_tx;
    for (int32_t j = sb; j < se; ++j) {
      int32_t dep = deps_[static_cast<size_t>(j)];
      if (end_[static_cast<size_t>(dep)] > req) {
        req = end_[static_cast<size_t>(dep)];
        cause = dep;
      }
    }
    dev.outstanding = true;
    dev.request_cause = cause;
    requests_.emplace(req, d);
  }

  void transfer(int src, double req) {
    Device& from = devices_[static_cast<size_t>(src)];
    int32_t s = from.sends[from.send_ptr];
    int32_t r = match_[static_cast<size_t>(s)];
    int dst = inst(s).peer;
    Device& to = devices_[static_cast<size_t>(dst)];
    double start = req;
    int32_t cause = from.request_cause;
    if (to.rx_free > start) {
      start = to.rx_free;
      cause = to.last_rx;
    }
    double end = start + duration_[static_cast<size_t>(s)];
    for (int32_t gid : {s, r}) {
      start_[static_cast<size_t>(gid)] = start;
      end_[static_cast<size_t>(gid)] = end;
    }
    cause_[static_cast<size_t>(r)] = cause;
    cause_[static_cast<size_t>(s)] = r;  // the transfer is represented by its recv
    // Note [A link's latency does not hold it]: the channels are held for
    // the bytes only; the value arrives the link's latency after that.
    double held = held_[static_cast<size_t>(s)];
    from.tx_free = start + held;
    from.last_tx = r;
    from.send_busy += held;
    to.rx_free = start + held;
    to.last_rx = r;
    to.recv_busy += held;
    ++from.send_ptr;
    from.send_dep_pos = 0;
    from.outstanding = false;
    advance(dst);
    advance(src);
  }

  /// Note [Shared host cores]: the time the timeline's stretches with more
  /// devices computing than `cores` gain when they share the cores.
  double sharedCoreStretch(double cores) const {
    std::vector<std::pair<double, int>> edges;  // (time, +1 start / -1 end)
    for (const Device& dev : devices_) {
      for (int32_t r : dev.runs) {
        double a = start_[static_cast<size_t>(r)], b = end_[static_cast<size_t>(r)];
        if (std::isnan(a) || !(b > a)) continue;
        edges.emplace_back(a, +1);
        edges.emplace_back(b, -1);
      }
    }
    std::sort(edges.begin(), edges.end());  // an end sorts before a start at the same time
    double extra = 0, at = 0;
    int computing = 0;
    for (const auto& [t, delta] : edges) {
      if (computing > cores) extra += (computing / cores - 1.0) * (t - at);
      computing += delta;
      at = t;
    }
    return extra;
  }

  void checkFinished() const {
    for (int d = 0; d < nd_; ++d) {
      const Device& dev = devices_[static_cast<size_t>(d)];
      int32_t blocked = kNone;
      if (dev.run_ptr < dev.runs.size()) blocked = dev.runs[dev.run_ptr];
      else if (dev.send_ptr < dev.sends.size()) blocked = dev.sends[dev.send_ptr];
      if (blocked == kNone) continue;
      MP_THROW(InvalidIrError,
               "modelpar {}: the program deadlocks: device {} never gets past instruction {} "
               "({}); run ir::verify for the cycle", kSimulatePassId, d,
               blocked - offset_[static_cast<size_t>(d)], ir::printInstruction(g_, inst(blocked)));
    }
  }

  SimulationReport report(const SimulateOptions& options) {
    SimulationReport rep;
    rep.num_instructions = static_cast<int64_t>(n_);
    rep.num_transfers = num_transfers_;
    int32_t last = kNone;
    for (size_t gid = 0; gid < n_; ++gid) {
      if (std::isnan(end_[gid])) continue;
      if (last == kNone || end_[gid] > end_[static_cast<size_t>(last)]) last = static_cast<int32_t>(gid);
    }
    rep.step_time_us = last == kNone ? 0.0 : end_[static_cast<size_t>(last)];
    // Note [Shared host cores]
    // ~~~~~~~~~~~~~~~~~~~~~~~~
    // The model gives every device a compute stream of its own. CPU worker
    // devices are threads of one process: when the machine's other work
    // leaves them c cores (DeviceModel::hostCores, measured by
    // modelpar/step_search.py at the search), n > c workers cannot compute
    // at once, and a pipeline whose stages the model overlaps runs nearer to
    // their sum (measured: gpt's 2-stage GPipe on 2 cores of a loaded
    // machine, the stages' busy times 760 + 741 us, no instant where both
    // computed, the step 1.5x its simulation). The step then takes at least
    // the compute of every device over c cores (work-conserving sharing).
    // And where k > c devices compute at once, each runs at c / k of its
    // speed (processor sharing: on an idle 2-core VM two workers measured
    // c = 1.8, and a 2-stage pipeline's operators ran 9-13 % longer than
    // alone), so every such stretch of the timeline lasts k / c times as
    // long: the step gains sum (k / c - 1) * length over them (a first-order
    // stretch, exact when the overlap lies on the critical path, as a
    // pipeline's steady state does). The timeline and critical path stay
    // those of dedicated cores.
    if (m_.hostCores() > 0) {
      double busy = 0;
      for (const Device& dev : devices_) busy += dev.compute_busy;
      rep.step_time_us = std::max(rep.step_time_us + sharedCoreStretch(m_.hostCores()),
                                  busy / m_.hostCores());
    }
    rep.step_time_us += m_.stepOverheadUs() + (nd_ - 1) * m_.workerOverheadUs();
    // Critical path: follow causes back from the last end; a send stands for its recv.
    for (int32_t c = last; c != kNone; c = cause_[static_cast<size_t>(c)]) {
      const ir::Instruction& i = inst(c);
      if (i.kind == ir::Instruction::Kind::Send) continue;
      int d = deviceOf(c);
      rep.critical_path.push_back({d, c - offset_[static_cast<size_t>(d)], i.kind,
                                   start_[static_cast<size_t>(c)], end_[static_cast<size_t>(c)]});
    }
    std::reverse(rep.critical_path.begin(), rep.critical_path.end());
    // Memory in program order (liveness.h).
    std::vector<DeviceLiveness> live = analyzeLiveness(p_, flat_);
    for (int d = 0; d < nd_; ++d) {
      const Device& dev = devices_[static_cast<size_t>(d)];
      const DeviceLiveness& L = live[static_cast<size_t>(d)];
      DeviceReport dr;
      dr.compute_busy_us = dev.compute_busy;
      dr.idle_us = rep.step_time_us - dev.compute_busy;
      dr.send_busy_us = dev.send_busy;
      dr.recv_busy_us = dev.recv_busy;
      dr.persistent_bytes = L.persistent_bytes;
      dr.num_instructions = offset_[static_cast<size_t>(d) + 1] - offset_[static_cast<size_t>(d)];
      int64_t cur = L.persistent_bytes + L.start_bytes, peak = cur;
      size_t k = 0;
      for (size_t i = 0; i < L.alloc_bytes.size(); ++i) {
        cur += L.alloc_bytes[i];
        peak = std::max(peak, cur + L.temp_bytes[i]);
        for (; k < L.releases.size() && L.releases[k].after <= static_cast<int32_t>(i); ++k) {
          cur -= L.releases[k].bytes;
        }
      }
      dr.peak_bytes = peak;
      rep.devices.push_back(dr);
    }
    if (options.record_timeline) {
      for (int d = 0; d < nd_; ++d) {
        std::vector<double> s, e;
        double prev = 0;
        for (int32_t gid = offset_[static_cast<size_t>(d)]; gid < offset_[static_cast<size_t>(d) + 1]; ++gid) {
          double a = start_[static_cast<size_t>(gid)], b = end_[static_cast<size_t>(gid)];
          if (std::isnan(a)) a = b = prev;  // frees
          s.push_back(a);
          e.push_back(b);
          if (inst(gid).kind == ir::Instruction::Kind::Run) prev = b;
        }
        rep.start_us.push_back(std::move(s));
        rep.end_us.push_back(std::move(e));
      }
    }
    return rep;
  }

  const ir::Program& p_;
  const ir::Graph& g_;
  const DeviceModel& m_;
  FlatGraph flat_;
  int nd_ = 0;
  size_t n_ = 0;
  std::vector<int32_t> offset_;
  std::vector<Device> devices_;
  std::vector<double> duration_, start_, end_;
  std::vector<double> held_;  // per send: how long its transfer holds the two channels
  std::vector<int32_t> cause_, dep_begin_, deps_, match_;
  int64_t num_transfers_ = 0;
  using Request = std::pair<double, int>;  // (time, source device): ties to the lower device
  std::priority_queue<Request, std::vector<Request>, std::greater<>> requests_;
};

}  // namespace

SimulationReport simulate(const ir::Program& p, const DeviceModel& machine,
                          const SimulateOptions& options) {
  return Simulator(p, machine).run(options);
}

}  // namespace modelpar::passes
