// Building an Executor (executor.h): resolving a Program into per-device
// steps and mailbox slots, creating the devices and starting one worker per
// logical device. Running a step is in executor.cpp.
#include <algorithm>
#include <map>
#include <tuple>
#include <utility>

#include <ATen/Parallel.h>
#include <c10/util/Exception.h>

#include "ir/printer.h"
#include "ir/random_ops.h"
#include "ir/verifier.h"
#include "runtime/capture_check.h"
#include "runtime/check.h"
#include "runtime/executor_impl.h"
#include "runtime/threads.h"

namespace modelpar::runtime {
namespace {

using detail::Kind;

/// True when the operator writes one of its arguments (in-place, out=).
bool writesAnInput(const c10::OperatorHandle& op) {
  for (const c10::Argument& a : op.schema().arguments()) {
    if (a.alias_info() != nullptr && a.alias_info()->isWrite()) return true;
  }
  return false;
}

}  // namespace

Executor::Impl::Impl(const ir::Program& p, const DeviceMap& map, ExecutorOptions options)
    : program_(p), map_(map), options_(options) {
  if (options_.verify) ir::verify(program_);
  MP_RT_CHECK(map_.devices.size() == static_cast<size_t>(program_.numDevices()), ConfigError,
              "modelpar executor: the program has ", program_.numDevices(),
              " devices but the device map ", map_.toString(), " has ", map_.devices.size());
  const int caller_threads = at::get_num_threads();
  std::vector<std::unique_ptr<Device>> devices = createDevices(map_);
  lanes_ = std::vector<Lane>(devices.size());
  for (size_t d = 0; d < devices.size(); ++d) {
    lanes_[d].device = std::move(devices[d]);
    // Note [Factory ops follow their device] (op_call.cpp): GPUs only.
    if (lanes_[d].device->physical().is_cuda()) lanes_[d].place_on = lanes_[d].device->physical();
    if (options_.measure_memory) lanes_[d].meter = std::make_unique<detail::StorageMeter>();
  }
  resolve();
  initReplay();

  // A worker that cannot start (the system refuses a thread) must not leave
  // the ones before it running: the destructor does not run for a
  // constructor that throws, and a joinable std::thread member would call
  // std::terminate. Stop and join them, then report.
  for (size_t d = 0; d < lanes_.size(); ++d) {
    try {
      lanes_[d].thread = startThread(c10::str("the executor worker of ", lanes_[d].device->describe()),
                                     [this, d] { workerMain(static_cast<int>(d)); });
    } catch (const ExecutionError& e) {
      stopWorkers();
      if (map_.kind() == DeviceKind::CpuWorker) at::set_num_threads(caller_threads);
      MP_RT_THROW(ExecutionError, "modelpar executor: started ", d, " of ", lanes_.size(),
                  " workers of ", map_.toString(), ", then: ", e.what(),
                  " (the started workers were stopped and joined)");
    }
  }
  std::unique_lock<std::mutex> lock(ctl_mu_);
  done_cv_.wait(lock, [&] { return started_ == static_cast<int>(lanes_.size()); });
  const std::string error = startup_error_;
  lock.unlock();
  // at::set_num_threads on the workers also changed the process default that
  // threads initialise from; give the caller's back.
  if (map_.kind() == DeviceKind::CpuWorker) at::set_num_threads(caller_threads);
  if (!error.empty()) {
    stopWorkers();
    MP_RT_THROW(ConfigError, "modelpar executor: cannot start the workers of ", map_.toString(), ": ",
                error);
  }
}

void Executor::Impl::stopWorkers() {
  {
    std::lock_guard<std::mutex> lock(ctl_mu_);
    shutdown_ = true;
  }
  ctl_cv_.notify_all();
  for (Lane& lane : lanes_) {
    if (lane.thread.joinable()) lane.thread.join();
  }
}

Executor::Impl::~Impl() { stopWorkers(); }

// Resolves every node once and places the inputs on their lanes; returns,
// per node, whether its operator writes one of its arguments.
std::vector<bool> Executor::Impl::resolveOps() {
  const ir::Graph& g = program_.graph();
  const int n = program_.numDevices();
  ops_.reserve(g.numNodes());
  std::vector<bool> writes(g.numNodes());
  for (size_t k = 0; k < g.numNodes(); ++k) {
    ops_.emplace_back(g, static_cast<ir::NodeId>(k));
    writes[k] = writesAnInput(ops_.back().handle());
  }
  written_inputs_.assign(g.inputs().size(), false);
  for (size_t k : inputsWrittenInPlace(program_)) written_inputs_[k] = true;
  for (size_t k = 0; k < g.inputs().size(); ++k) {
    const ir::Input& in = g.inputs()[k];
    const int d = in.device.value_or(0);
    MP_RT_CHECK(d >= 0 && d < n, InvalidIrError, "input %", g.value(in.value).name,
                " is placed on device ", d, " but the program has ", n, " devices");
    lanes_[static_cast<size_t>(d)].inputs.emplace_back(k, in.value);
  }
  return writes;
}

// A new mailbox slot with its events on device `owner`; returns its index.
int32_t Executor::Impl::newMailSlot(int owner) {
  Mail& m = mail_.emplace_back();
  m.ready = lanes_[static_cast<size_t>(owner)].device->newEvent();
  m.done = lanes_[static_cast<size_t>(owner)].device->newEvent();
  return static_cast<int32_t>(mail_.size() - 1);
}

// Resolves every node once and turns each instruction into a Step: value
// slots, mailbox slots, events, and the streams its sends need.
void Executor::Impl::resolve() {
  const ir::Graph& g = program_.graph();
  const int n = program_.numDevices();
  const std::vector<bool> writes = resolveOps();

  // Sends first, so that every recv finds its slot; an unmatched recv gets a
  // slot nobody posts to (the run-time deadlock check reports it).
  std::map<std::tuple<ir::ValueId, int, int>, int32_t> slot_of;  // (value, from, to)
  for (int d = 0; d < n; ++d) {
    Lane& lane = lanes_[static_cast<size_t>(d)];
    const std::vector<ir::Instruction>& sched = program_.schedule(d);
    lane.steps.resize(sched.size());
    lane.env.assign(g.numValues(), c10::IValue());
    std::vector<int32_t> unfenced;  // sends since the last run that writes an input
    for (size_t i = 0; i < sched.size(); ++i) {
      const ir::Instruction& inst = sched[i];
      Step& s = lane.steps[i];
      s.kind = inst.kind;
      s.value = inst.value;
      s.peer = inst.peer;
      if (inst.kind == Kind::Run) {
        MP_RT_CHECK(inst.node >= 0 && static_cast<size_t>(inst.node) < g.numNodes(),
                    InvalidIrError, where(d, i), ": no such node");
        s.op = &ops_[static_cast<size_t>(inst.node)];
        s.defs = &g.node(inst.node).outputs;
        s.node = inst.node;
        if (writes[static_cast<size_t>(inst.node)]) s.fence = std::exchange(unfenced, {});
        continue;
      }
      MP_RT_CHECK(inst.value >= 0 && static_cast<size_t>(inst.value) < g.numValues(),
                  InvalidIrError, where(d, i), ": no such value");
      if (inst.kind == Kind::Free) continue;
      MP_RT_CHECK(inst.peer >= 0 && inst.peer < n && inst.peer != d, InvalidIrError, where(d, i),
                  ": the peer must be another of the program's ", n, " devices");
      if (inst.kind != Kind::Send) continue;
      auto [it, fresh] = slot_of.try_emplace({inst.value, d, inst.peer}, -1);
      MP_RT_CHECK(fresh, InvalidIrError, where(d, i), ": %", g.value(inst.value).name,
                  " is sent from device ", d, " to device ", inst.peer, " twice");
      it->second = s.mail = newMailSlot(d);
      unfenced.push_back(s.mail);
      lane.device->connectTo(*lanes_[static_cast<size_t>(inst.peer)].device);
    }
  }
  std::vector<bool> received(mail_.size());
  for (int d = 0; d < n; ++d) {
    Lane& lane = lanes_[static_cast<size_t>(d)];
    for (size_t i = 0; i < lane.steps.size(); ++i) {
      Step& s = lane.steps[i];
      if (s.kind != Kind::Recv) continue;
      auto it = slot_of.find({s.value, s.peer, d});
      s.mail = it != slot_of.end() ? it->second : newMailSlot(s.peer);
      if (it == slot_of.end()) received.push_back(false);
      MP_RT_CHECK(!received[static_cast<size_t>(s.mail)], InvalidIrError, where(d, i), ": %",
                  g.value(s.value).name, " is received from device ", s.peer, " twice");
      received[static_cast<size_t>(s.mail)] = true;
    }
  }
  // Note [Reproducible random ops over workers].
  if (!randomOpsOrdered(program_)) seedRandomSteps();
  if (options_.record_trace) {
    trace_.host.resize(static_cast<size_t>(n));
    trace_.transfer.resize(static_cast<size_t>(n));
  }
}

// Marks the random ops' steps seeded and lists their generators' devices
// (Note [Reproducible random ops over workers]).
void Executor::Impl::seedRandomSteps() {
  const ir::Graph& g = program_.graph();
  seeding_.emplace();
  for (Lane& lane : lanes_) {
    const c10::Device gen_device = lane.place_on.value_or(c10::Device(c10::kCPU));
    for (Step& s : lane.steps) {
      if (s.kind != Kind::Run || !ir::isRandom(g.node(s.node))) continue;
      s.seeded = true;
      if (std::find(seeded_devices_.begin(), seeded_devices_.end(), gen_device) ==
          seeded_devices_.end()) {
        seeded_devices_.push_back(gen_device);
      }
    }
  }
}

std::string Executor::Impl::where(int d, size_t i) const {
  const ir::Graph& g = program_.graph();
  const ir::Instruction& inst = program_.schedule(d)[i];
  std::string s = c10::str("device ", d, ", instruction ", i, " (");
  try {
    s += ir::printInstruction(g, inst);
  } catch (const std::exception&) {
    s += ir::name(inst.kind);
  }
  if (inst.kind == Kind::Run && inst.node >= 0 && static_cast<size_t>(inst.node) < ops_.size()) {
    s += ", " + ops_[static_cast<size_t>(inst.node)].opName();
  }
  return s + ")";
}

Executor::Executor(const ir::Program& p, const DeviceMap& map, ExecutorOptions options)
    : impl_(std::make_unique<Impl>(p, map, options)) {}
Executor::~Executor() = default;
const ir::Program& Executor::program() const { return impl_->program_; }
const DeviceMap& Executor::deviceMap() const { return impl_->map_; }
const ExecutionTrace& Executor::lastTrace() const { return impl_->trace_; }

}  // namespace modelpar::runtime
