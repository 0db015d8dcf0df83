// The process-wide capture session (session.h).
#include "backend/session.h"

#include <algorithm>
#include <cstdio>
#include <cstring>
#include <functional>
#include <numeric>
#include <unordered_set>

#include <c10/core/GradMode.h>
#include <c10/util/Exception.h>
#include <c10/util/thread_name.h>

#include "backend/autograd_info.h"
#include "backend/device_options.h"
#include "capture/convert.h"
#include "capture/layers.h"
#include "ir/printer.h"
#include "runtime/check.h"
#include "runtime/value_types.h"

namespace modelpar::backend {
namespace {

constexpr size_t kMaxViewsPerStorage = 64;

ir::Type typeOf(const Geometry& g) {
  std::optional<ir::ScalarType> s = runtime::fromC10(g.dtype);
  MP_RT_CHECK(s, UnsupportedOpError, "modelpar: tensors of dtype ", g.dtype, " cannot be captured");
  return ir::Type::tensor(*s, g.sizes);
}

std::vector<ir::Arg> intList(const std::vector<int64_t>& xs) {
  std::vector<ir::Arg> out;
  out.reserve(xs.size());
  for (int64_t x : xs) out.push_back(ir::Arg::integer(x));
  return out;
}

ViewEntry* findView(StorageState& s, const Geometry& g) {
  for (ViewEntry& e : s.views) {
    if (e.geometry == g) return &e;
  }
  return nullptr;
}

void upsertView(StorageState& s, ViewEntry entry) {
  if (ViewEntry* e = findView(s, entry.geometry)) {
    if (!entry.step) entry.step = e->step;
    *e = std::move(entry);
    return;
  }
  if (s.views.size() >= kMaxViewsPerStorage) s.views.erase(s.views.begin());
  s.views.push_back(std::move(entry));
}

/// The backward pass of PrivateUse1 tensors runs on the autograd engine's
/// device thread (named by c10::setThreadName).
bool onAutogradThread() {
  thread_local const bool is = c10::getThreadName().rfind("pt_autograd", 0) == 0;
  return is;
}

thread_local std::vector<std::string> t_scopes;

}  // namespace

Session& Session::get() {
  static auto* s = new Session();  // never destroyed: storages may die after main
  return *s;
}

// --- recording -------------------------------------------------------------

void Session::enterTrace(StorageState& s, const at::Tensor& t) {
  if (s.epoch == epoch_) return;
  s.epoch = epoch_;
  s.version = 0;
  if (!s.cpu) {
    // Never written (`empty`): its contents are whatever empty_strided gives.
    ir::Type type = typeOf(s.base);
    std::vector<ir::Arg> args{ir::Arg::list(intList(s.base.sizes)),
                              ir::Arg::list(intList(s.base.strides))};
    args.push_back(ir::Arg::dtype(type.dtype).withKeyword("dtype"));
    args.push_back(ir::Arg::device("cpu").withKeyword("device"));
    s.value = record("aten::empty_strided", std::move(args), {std::move(type)})[0];
    s.unchanged_input = false;
    return;
  }
  if (!s.named) {
    auto it = names_.find(t.unsafeGetTensorImpl());
    if (it != names_.end() && !it->second.impl.expired()) {
      s.name = it->second.name;
      s.role = it->second.role;
      s.named = true;
    }
  }
  capture::TracedInput in;
  if (s.named) {
    in.role = s.role;
    in.name = s.name;
    in.owner = s.role == ir::InputRole::Input ? "" : capture::ownerOf(s.name);
  } else {
    in.role = t.is_leaf() && t.requires_grad() ? ir::InputRole::Parameter : ir::InputRole::Input;
  }
  // Strides and offset are not in the IR type but as_strided nodes depend
  // on them: a step whose input is laid out differently is another plan.
  in.key_note = c10::str(c10::IntArrayRef(s.base.strides), "+", s.base.offset);
  s.value = trace_.addInput(typeOf(s.base), std::move(in));
  input_data_.emplace_back(cpuTensor(s.cpu, s.base));
  s.unchanged_input = true;
}

ir::ValueId Session::lookup(StorageState& s, const Geometry& g, int depth) {
  if (g == s.base) return s.value;
  ViewEntry* e = findView(s, g);
  if (e && e->epoch == epoch_ && e->version == s.version) return e->value;
  MP_RT_CHECK(g.dtype == s.base.dtype, UnsupportedOpError, "modelpar: a ", g.dtype,
              " view of a ", s.base.dtype, " storage cannot be captured");
  std::shared_ptr<const ViewStep> step = e ? e->step : nullptr;
  if (step && step->source == g) step = nullptr;  // would replay itself
  ir::ValueId v = ir::kNoId;
  if (step && depth < 16) {
    // Replay the op that made the view on the current source contents.
    const ir::ValueId src = lookup(s, step->source, depth + 1);
    std::vector<ir::Arg> args = step->args;
    for (ir::Arg& a : args) a.remapValues([&](ir::ValueId x) { return x == ir::kNoId ? src : x; });
    v = record(step->op, std::move(args), {typeOf(g)})[0];
  } else {
    v = record("aten::as_strided",
               {ir::Arg::value(s.value), ir::Arg::list(intList(g.sizes)),
                ir::Arg::list(intList(g.strides)), ir::Arg::integer(g.offset)},
               {typeOf(g)})[0];
  }
  upsertView(s, ViewEntry{g, v, s.version, epoch_, step});
  return v;
}

ir::ValueId Session::valueOf(const at::Tensor& t) {
  StorageState& s = stateOf(t);
  enterTrace(s, t);
  return lookup(s, Geometry::of(t), 0);
}

ir::ValueId Session::scalarInput(const at::Tensor& cpu) {
  at::Tensor copy = cpu.clone();
  const bool wrapped = cpu.unsafeGetTensorImpl()->is_wrapped_number();
  if (wrapped) copy.unsafeGetTensorImpl()->set_wrapped_number(true);
  capture::TracedInput in;
  in.name = cpu.dim() == 0 ? "s" : "x";
  in.key_note = wrapped ? "wrapped" : "";
  ir::ValueId v = trace_.addInput(capture::typeOf(copy), std::move(in));
  input_data_.push_back(std::move(copy));
  return v;
}

ir::ValueId Session::floatInput(double x) {
  capture::TracedInput in;
  in.name = "f";
  ir::ValueId v = trace_.addInput(ir::Type::scalar(ir::Type::Kind::Float), std::move(in));
  input_data_.emplace_back(x);
  return v;
}

bool Session::recordingUpdate() { return currentPhase() == ir::Phase::Update; }

int64_t Session::beginCall(const std::vector<c10::IValue>& args) {
  const int64_t previous = current_seq_;
  current_seq_ = autogradSequenceNr(args, onAutogradThread());
  return previous;
}

std::vector<ir::ValueId> Session::record(const std::string& op, std::vector<ir::Arg> args,
                                         std::vector<ir::Type> types, bool random) {
  const std::optional<ir::Phase> phase = currentPhase();
  if (phase == ir::Phase::Backward) backward_seen_ = true;
  ++counters_.ops_recorded;
  return trace_.addNode(op, std::move(args), std::move(types), currentLayer(), phase, current_seq_,
                        random);
}

void Session::defineFresh(const at::Tensor& t, ir::ValueId v) {
  StorageState& s = stateOf(t);
  s.epoch = epoch_;
  s.version = 0;
  s.value = v;
  s.unchanged_input = false;
}

void Session::defineView(const at::Tensor& t, ir::ValueId v, std::shared_ptr<const ViewStep> step) {
  StorageState& s = stateOf(t);
  enterTrace(s, t);
  Geometry g = Geometry::of(t);
  if (g == s.base) return;  // the storage's own value already stands for it
  upsertView(s, ViewEntry{std::move(g), v, s.version, epoch_, std::move(step)});
}

void Session::commit(const at::Tensor& t, ir::ValueId v) {
  StorageState& s = stateOf(t);
  enterTrace(s, t);
  const Geometry g = Geometry::of(t);
  if (g == s.base) {
    s.value = v;
  } else {
    s.value = writeBack(s, g, v);
  }
  ++s.version;
  s.unchanged_input = false;
  if (!(g == s.base)) upsertView(s, ViewEntry{g, v, s.version, epoch_, nullptr});
}

ir::ValueId Session::writeBack(StorageState& s, const Geometry& g, ir::ValueId v) {
  const ir::Type base_type = typeOf(s.base);
  // 1. All of the base's elements in the same order (a reshape of a dense
  //    base): the new base is the new view reshaped back.
  auto dense = [](const Geometry& x) {  // row-major contiguous (size-1 dims: any stride)
    int64_t expected = 1;
    for (size_t d = x.sizes.size(); d-- > 0;) {
      if (x.sizes[d] == 1) continue;
      if (x.strides[d] != expected) return false;
      expected *= x.sizes[d];
    }
    return true;
  };
  const auto numel = [](const Geometry& x) {
    return std::accumulate(x.sizes.begin(), x.sizes.end(), int64_t{1}, std::multiplies<>());
  };
  if (g.offset == s.base.offset && numel(g) == numel(s.base) && dense(g) && dense(s.base)) {
    return record("aten::reshape", {ir::Arg::value(v), ir::Arg::list(intList(s.base.sizes))},
                  {base_type})[0];
  }
  // 2. The base's dimensions permuted (t(), transpose, permute): permute back.
  if (g.offset == s.base.offset && g.sizes.size() == s.base.sizes.size()) {
    std::vector<int64_t> inverse(g.sizes.size(), -1);
    bool ok = true;
    for (size_t d = 0; d < g.sizes.size() && ok; ++d) {  // view dim d is base dim p
      ok = false;
      for (size_t p = 0; p < s.base.sizes.size(); ++p) {
        if (inverse[p] < 0 && s.base.sizes[p] == g.sizes[d] && s.base.strides[p] == g.strides[d]) {
          inverse[p] = static_cast<int64_t>(d);
          ok = true;
          break;
        }
      }
    }
    if (ok) return record("aten::permute", {ir::Arg::value(v), ir::Arg::list(intList(inverse))}, {base_type})[0];
  }
  // 3. A slice, select or diagonal of the base: its scatter op.
  const ViewEntry* e = findView(s, g);
  const ViewStep* step = e && e->step ? e->step.get() : nullptr;
  std::string scatter;
  if (step && step->source == s.base && !step->args.empty()) {
    if (step->op == "aten::slice.Tensor") scatter = "aten::slice_scatter";
    if (step->op == "aten::select.int") scatter = "aten::select_scatter";
    if (step->op == "aten::diagonal") scatter = "aten::diagonal_scatter";
  }
  std::vector<ir::Arg> args{ir::Arg::value(s.value), ir::Arg::value(v)};
  if (!scatter.empty()) {
    args.insert(args.end(), step->args.begin() + 1, step->args.end());
  } else {
    // 4. Anything else, by position in the storage.
    scatter = "aten::as_strided_scatter";
    args.push_back(ir::Arg::list(intList(g.sizes)));
    args.push_back(ir::Arg::list(intList(g.strides)));
    args.push_back(ir::Arg::integer(g.offset));
  }
  return record(scatter, std::move(args), {base_type})[0];
}

bool Session::inTrace(const at::Tensor& t) { return stateOf(t).epoch == epoch_; }

std::optional<ir::Phase> Session::currentPhase() {
  if (onAutogradThread()) return ir::Phase::Backward;
  if (backward_seen_ && !c10::GradMode::is_enabled()) return ir::Phase::Update;
  return ir::Phase::Forward;
}

std::string Session::currentLayer() { return t_scopes.empty() ? std::string() : t_scopes.back(); }

// --- materialising ---------------------------------------------------------

void Session::sync() {
  std::lock_guard<std::recursive_mutex> lock(captureMutex());
  // Every live storage whose value a node produced is an output.
  std::vector<std::pair<ir::ValueId, StorageState*>> outs;
  forEachLiveStorage([&](StorageState& s) {
    if (s.epoch == epoch_ && !s.unchanged_input) outs.emplace_back(s.value, &s);
  });
  std::sort(outs.begin(), outs.end(),
            [](const auto& a, const auto& b) { return a.first < b.first; });
  auto finish = [&] {
    trace_.clear();
    input_data_.clear();
    backward_seen_ = false;
    ++epoch_;
  };
  if (outs.empty()) {
    finish();
    return;
  }
  std::vector<ir::ValueId> out_values;
  out_values.reserve(outs.size());
  for (const auto& o : outs) out_values.push_back(o.first);

  std::vector<c10::IValue> results;
  try {
    capture::BuiltGraph built = trace_.build(out_values);
    auto it = options_.cache ? cache_.find(built.key) : cache_.end();
    CachedPlan* plan = nullptr;
    CachedPlan uncached;
    if (it != cache_.end()) {
      plan = &it->second;
      ++counters_.replays;
    } else {
      // Plan first: a step that cannot be planned leaves no cache entry.
      auto runner = std::make_shared<const StepRunner>(built.graph, options_);
      if (options_.cache) {
        evictTo(static_cast<size_t>(options_.max_plans) - 1);
        cache_order_.push_back(built.key);
        plan = &cache_[built.key];
      } else {
        plan = &uncached;
      }
      plan->runner = std::move(runner);
      plan->index = counters_.captures++;
      plan->options = nonDefaultOptions(options_);
    }
    ++plan->runs;
    plan->last_used = ++tick_;
    ++counters_.syncs;
    last_graph_ = ir::print(built.graph);
    last_plan_ = *plan;
    std::vector<c10::IValue> inputs;
    inputs.reserve(built.input_slots.size());
    for (size_t slot : built.input_slots) inputs.push_back(input_data_[slot]);
    results = plan->runner->run(std::move(inputs));
  } catch (...) {
    // The step is lost; tensors keep their last materialised contents.
    for (const auto& o : outs) o.second->epoch = 0;
    finish();
    throw;
  }

  // Hand the results to the storages: adopt a result's storage when it is
  // exactly the storage's layout and nobody else has it, else copy.
  std::unordered_set<const c10::StorageImpl*> claimed;
  for (const c10::IValue& in : input_data_) {
    if (in.isTensor()) claimed.insert(in.toTensor().storage().unsafeGetStorageImpl());
  }
  for (size_t i = 0; i < outs.size(); ++i) {
    StorageState& s = *outs[i].second;
    const at::Tensor r = results[i].toTensor();
    const c10::StorageImpl* impl = r.storage().unsafeGetStorageImpl();
    if (r.device().is_cpu() && r.storage().nbytes() == s.nbytes && Geometry::of(r) == s.base &&
        claimed.insert(impl).second) {
      s.cpu = r.storage();
    } else {
      c10::Storage st = newCpuStorage(s.nbytes);
      cpuTensor(st, s.base).copy_(r);
      s.cpu = std::move(st);
    }
  }
  finish();
}

at::Tensor Session::cpuView(const at::Tensor& t) {
  std::lock_guard<std::recursive_mutex> lock(captureMutex());
  StorageState& s = stateOf(t);
  if (s.epoch == epoch_ && !s.unchanged_input) sync();
  if (!s.cpu) {
    s.cpu = newCpuStorage(s.nbytes);
    if (s.nbytes) std::memset(s.cpu.mutable_data(), 0, s.nbytes);
  }
  return cpuTensor(s.cpu, Geometry::of(t));
}

void Session::setContents(const at::Tensor& t, const at::Tensor& data) {
  std::lock_guard<std::recursive_mutex> lock(captureMutex());
  StorageState& s = stateOf(t);
  c10::Storage st = newCpuStorage(s.nbytes);
  cpuTensor(st, Geometry::of(t)).copy_(data);
  s.cpu = std::move(st);
}

void Session::noteGraphBreak(const std::string& op, const std::string& reason) {
  std::lock_guard<std::recursive_mutex> lock(captureMutex());
  ++counters_.graph_breaks;
  if (options_.warn_on_graph_break && warned_.insert(op).second) {
    TORCH_WARN("modelpar: ", op, " cannot be captured: ", reason,
               ". It ran eagerly on the CPU after materialising the step so far (a graph "
               "break; counted in modelpar counters). Set strict mode to make this an error.");
  }
}

// --- names, options, counters ------------------------------------------------

void Session::nameTensor(const at::Tensor& t, const std::string& name, ir::InputRole role) {
  std::lock_guard<std::recursive_mutex> lock(captureMutex());
  for (auto it = names_.begin(); it != names_.end();) {
    it = it->second.impl.expired() ? names_.erase(it) : std::next(it);
  }
  names_.insert_or_assign(
      t.unsafeGetTensorImpl(),
      Named{c10::weak_intrusive_ptr<c10::TensorImpl>(t.getIntrusivePtr()), name, role});
  if (isModelpar(t)) {
    StorageState& s = stateOf(t);
    s.name = name;
    s.role = role;
    s.named = true;
  }
}

void Session::pushScope(const std::string& name, bool absolute) {
  if (absolute || t_scopes.empty()) {
    t_scopes.push_back(name);
  } else {
    t_scopes.push_back(t_scopes.back() + "." + name);
  }
}

void Session::popScope() {
  if (!t_scopes.empty()) t_scopes.pop_back();
}

SessionOptions Session::options() {
  std::lock_guard<std::recursive_mutex> lock(captureMutex());
  return options_;
}
void Session::setOptions(const SessionOptions& o) {
  checkOptions(o);
  std::lock_guard<std::recursive_mutex> lock(captureMutex());
  if (!samePlanning(o, options_)) clearPlans();
  options_ = o;
  evictTo(static_cast<size_t>(o.max_plans));
}
SessionCounters Session::counters() {
  std::lock_guard<std::recursive_mutex> lock(captureMutex());
  return counters_;
}
void Session::resetCounters() {
  std::lock_guard<std::recursive_mutex> lock(captureMutex());
  counters_ = SessionCounters{};
}

void Session::evictTo(size_t keep) {
  while (cache_.size() > keep) {
    auto lru = cache_order_.begin();
    for (auto k = cache_order_.begin(); k != cache_order_.end(); ++k) {
      if (cache_.at(*k).last_used < cache_.at(*lru).last_used) lru = k;
    }
    cache_.erase(*lru);
    cache_order_.erase(lru);
    ++counters_.evictions;
  }
}

std::string Session::summaryOf(const CachedPlan& p) const {
  // The layout of torch.compile's PlanRecord.summary() (python/modelpar/compile/records.py).
  const StepRunner& r = *p.runner;
  const ir::Graph& g = r.graph();
  int64_t params = 0, buffers = 0;
  for (const ir::Input& in : g.inputs()) {
    params += in.role == ir::InputRole::Parameter;
    buffers += in.role == ir::InputRole::Buffer;
  }
  auto right = [](int64_t n, size_t width) {
    std::string s = std::to_string(n);
    return std::string(width > s.size() ? width - s.size() : 0, ' ') + s;
  };
  std::string out = c10::str("modelpar device plan ", p.index, ": the step captured on the modelpar device\n",
                             "  runs: ", p.runs, " step", p.runs == 1 ? "" : "s", " (", p.runs - 1,
                             " replayed)\n");
  if (!p.options.empty()) out += c10::str("  options: ", p.options, "\n");
  out += c10::str("  graph      inputs params buffers  nodes values  runs on\n", "  step       ",
                  right(static_cast<int64_t>(g.inputs().size()), 6), " ", right(params, 6), " ",
                  right(buffers, 7), " ", right(static_cast<int64_t>(g.numNodes()), 6), " ",
                  right(static_cast<int64_t>(g.numValues()), 6), "  ", r.runsOn(), "\n");
  if (!r.placementSummary().empty()) {
    char us[32];
    std::snprintf(us, sizeof us, "%.1f", r.simulatedStepUs());
    out += c10::str("  simulated step (forward, backward and update ",
                    r.pipelined() ? "pipelined" : "placed as one", "): ", us, " us\n  [",
                    r.pipelined() ? "pipeline" : "step", "]\n");
    size_t begin = 0;
    const std::string& text = r.placementSummary();
    while (begin < text.size()) {
      size_t end = text.find('\n', begin);
      if (end == std::string::npos) end = text.size();
      out += "    " + text.substr(begin, end - begin) + "\n";
      begin = end + 1;
    }
  }
  return out;
}

std::vector<PlanReport> Session::plans() {
  std::lock_guard<std::recursive_mutex> lock(captureMutex());
  std::vector<PlanReport> out;
  for (const std::string& key : cache_order_) {
    const CachedPlan& p = cache_.at(key);
    out.push_back(PlanReport{ir::print(p.runner->graph()), p.runs, summaryOf(p)});
  }
  return out;
}

void Session::clearPlans() {
  std::lock_guard<std::recursive_mutex> lock(captureMutex());
  cache_.clear();
  cache_order_.clear();
}

std::string Session::lastGraph() {
  std::lock_guard<std::recursive_mutex> lock(captureMutex());
  return last_graph_;
}

std::string Session::lastPlan() {
  std::lock_guard<std::recursive_mutex> lock(captureMutex());
  return last_plan_.runner ? summaryOf(last_plan_) : std::string();
}

}  // namespace modelpar::backend
