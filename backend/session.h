// The capture session: the one process-wide trace that every modelpar op is
// recorded into, whatever thread runs it, and what turns it into a graph,
// runs it and hands the results back to the tensors (sync).
#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <unordered_map>
#include <unordered_set>
#include <vector>

#include <ATen/core/Tensor.h>

#include "backend/storage.h"
#include "backend/step_runner.h"
#include "capture/trace.h"
#include "modelpar/modelpar.h"

namespace modelpar::backend {

// Note [Tensors, storages and trace values]
// The trace is functional SSA; PyTorch programs are not (views, in-place ops,
// out= ops). The bridge is the storage:
//  * Each modelpar storage has, while a trace is open, one trace value for
//    its contents as seen through its base geometry (StorageState::value).
//    A storage first read in a trace becomes a graph input (its CPU data).
//  * A view (another geometry on the same storage) is recorded as the view
//    op itself (`aten::t`, `aten::slice.Tensor`) and remembered per storage
//    by geometry, with the storage version it reflects. Any TensorImpl with
//    that storage and geometry is that view: detach(), .data, shallow copies
//    and autograd's saved variables need no bookkeeping of their own.
//  * A write is rewritten functionally (functional.h): `x.relu_()` records
//    `%x1 = aten::relu(%x)`. Writing through the base makes the result the
//    storage's new value; writing through a view records the scatter back
//    (a reshape or permute back when the view is one of the base, else
//    `aten::slice_scatter`, `aten::select_scatter`, `aten::diagonal_scatter`,
//    else `aten::as_strided_scatter`). Either way
//    the storage version is bumped, so every other view is stale and is
//    rebuilt from the new value on its next use by replaying the op that made
//    it (ViewStep), or `aten::as_strided` when that op is unknown.
//  * At a sync, every live storage whose value a node produced is a graph
//    output; the results become the storages' CPU contents. Values of dead
//    storages are intermediates the plan may free.
// So the graph has no aliasing and no mutation: any order consistent with its
// dataflow computes what eager mode computes, which is what placement and
// pipelining need. Limits: a view whose dtype differs from its storage's
// (`view(dtype)`) and in-place view ops (`t_`, `squeeze_`, `as_strided_`)
// raise UnsupportedOpError; `resize_` only to the same size.

// Note [Per-step scalars are inputs]
// An optimizer's update reads Python or C++ numbers that change every step:
// the learning rate under a scheduler, Adam's bias corrections computed from
// its step count (a CPU scalar tensor unless capturable, or an int64 in
// LibTorch). Written into the graph as constants, they would make every
// step's graph text new: a capture per step and a cache that never replays.
// So while the update is recorded (phase update: after a backward, under
// no_grad), every floating-point number passed as a `Scalar` or `float`
// argument, or inside a `Scalar[]` (the foreach ops' lists), becomes a
// `float` graph input holding it (capture/convert.h ArgContext::floating);
// the graph key has the input's type, not its value, so the next step's
// different numbers replay the same plan. Forward and backward numbers stay
// constants: they do not change between steps, and passes read some of
// them (batch-norm momentum and eps when micro-batching). CPU 0-dim tensors
// were graph inputs already (scalarInput). Integers stay constants (sizes,
// dims); a `float[]` argument (sizes such as scale factors) too.

/// Options of the capture and of how steps run: the public modelpar::Options
/// (include/modelpar/modelpar.h), checked by device_options.h.
using SessionOptions = modelpar::Options;

struct SessionCounters {
  int64_t captures = 0;      // graphs built and planned (cache misses)
  int64_t replays = 0;       // syncs that reused a cached plan
  int64_t syncs = 0;         // syncs that ran a non-empty graph
  int64_t graph_breaks = 0;  // ops run eagerly because they cannot be captured
  int64_t ops_recorded = 0;  // nodes recorded into traces
  int64_t evictions = 0;     // cached plans dropped (Options::max_plans, least recently used first)
};

struct CachedPlan {
  std::shared_ptr<const StepRunner> runner;
  int64_t index = 0;      // captures before this one (its number in summaries)
  int64_t runs = 0;
  uint64_t last_used = 0;  // sync tick of its last run (LRU eviction)
  std::string options;     // the options it was planned with (nonDefaultOptions)
};

/// One cached plan for people: graph text, runs and summary (modelpar::PlanInfo).
struct PlanReport {
  std::string graph;
  int64_t runs = 0;
  std::string summary;
};

/// The process-wide capture session. Every method locks captureMutex().
class Session {
 public:
  static Session& get();

  // --- recording (used by the kernels; caller holds captureMutex) ---
  /// The trace value of a modelpar tensor's current contents.
  ir::ValueId valueOf(const at::Tensor& t);
  /// A graph input holding a copy of a CPU scalar (0-dim) tensor.
  ir::ValueId scalarInput(const at::Tensor& cpu_scalar);
  /// A `float` graph input holding `x`: Note [Per-step scalars are inputs].
  ir::ValueId floatInput(double x);
  /// True while the ops being recorded are the optimizer update (phase
  /// update: after a backward, under no_grad).
  bool recordingUpdate();
  /// Starts recording one operator call: later nodes get its autograd
  /// sequence number (autograd_info.h). Returns the previous number, for
  /// endCall (calls nest: a copy kernel records through the capture kernel).
  int64_t beginCall(const std::vector<c10::IValue>& args);
  void endCall(int64_t previous) { current_seq_ = previous; }
  /// Records a node with the session's layer and phase, marked `random`
  /// when the op draws random numbers (capture::drawsRandom); returns its
  /// outputs.
  std::vector<ir::ValueId> record(const std::string& op, std::vector<ir::Arg> args,
                                  std::vector<ir::Type> types, bool random = false);
  /// `t` is a fresh storage whose contents are `v`.
  void defineFresh(const at::Tensor& t, ir::ValueId v);
  /// `t` is a view made by `step` whose contents are `v`.
  void defineView(const at::Tensor& t, ir::ValueId v, std::shared_ptr<const ViewStep> step);
  /// `t`'s elements are now `v` (same dtype and sizes as t).
  void commit(const at::Tensor& t, ir::ValueId v);
  /// True when `t`'s storage has a value in the open trace.
  bool inTrace(const at::Tensor& t);

  // --- materialising ---
  /// Ends the step: runs the trace and stores the results (see the Note).
  void sync();
  /// A CPU tensor with `t`'s contents, aliasing the storage's CPU copy;
  /// syncs first if the contents are pending in the trace.
  at::Tensor cpuView(const at::Tensor& t);
  /// Gives a fresh modelpar tensor the CPU contents `data` (same geometry).
  void setContents(const at::Tensor& t, const at::Tensor& data);
  /// Records an op that could not be captured: counts it, warns once.
  void noteGraphBreak(const std::string& op, const std::string& reason);

  // --- names and layers ---
  void nameTensor(const at::Tensor& t, const std::string& name, ir::InputRole role);
  void pushScope(const std::string& name, bool absolute);
  void popScope();

  SessionOptions options();
  /// Checks `o` (device_options.h; ConfigError, nothing applied), applies
  /// it, and drops the cached plans when it plans steps differently; with a
  /// smaller max_plans the least recently used plans go (counted).
  void setOptions(const SessionOptions& o);
  SessionCounters counters();
  void resetCounters();
  /// Each cached plan's graph text, runs and summary, in capture order.
  std::vector<PlanReport> plans();
  void clearPlans();
  /// Text of the graph the last sync ran ("" if none).
  std::string lastGraph();
  /// Summary of the plan the last sync ran ("" if none).
  std::string lastPlan();

 private:
  Session() = default;
  void enterTrace(StorageState& s, const at::Tensor& t);
  ir::ValueId lookup(StorageState& s, const Geometry& g, int depth);
  /// The storage's new value after view `g` of it took the value `v`.
  ir::ValueId writeBack(StorageState& s, const Geometry& g, ir::ValueId v);
  std::optional<ir::Phase> currentPhase();
  std::string currentLayer();
  /// Drops least recently used plans until at most `keep` are cached.
  void evictTo(size_t keep);
  std::string summaryOf(const CachedPlan& p) const;

  uint64_t epoch_ = 1;
  capture::Trace trace_;
  std::vector<c10::IValue> input_data_;  // parallel to trace_.inputs()
  bool backward_seen_ = false;
  int64_t current_seq_ = -1;

  struct Named {
    c10::weak_intrusive_ptr<c10::TensorImpl> impl;
    std::string name;
    ir::InputRole role;
  };
  std::unordered_map<const c10::TensorImpl*, Named> names_;

  std::unordered_map<std::string, CachedPlan> cache_;
  std::vector<std::string> cache_order_;  // keys in capture order
  uint64_t tick_ = 0;                     // syncs that ran a graph, for LRU
  std::string last_graph_;
  CachedPlan last_plan_;                  // a copy of the last run plan's entry
  SessionOptions options_;
  SessionCounters counters_;
  std::unordered_set<std::string> warned_;
};

}  // namespace modelpar::backend
