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
#include "capture/trace.h"
#include "runtime/interpreter.h"

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

/// Options of the capture (modelpar/modelpar.h mirrors them).
struct SessionOptions {
  bool strict = false;               // an op that cannot be captured raises
  bool warn_on_graph_break = true;   // one warning per op name
  bool cache = true;                 // replay identical graphs
};

struct SessionCounters {
  int64_t captures = 0;      // graphs built and planned (cache misses)
  int64_t replays = 0;       // syncs that reused a cached plan
  int64_t syncs = 0;         // syncs that ran a non-empty graph
  int64_t graph_breaks = 0;  // ops run eagerly because they cannot be captured
  int64_t ops_recorded = 0;  // nodes recorded into traces
};

struct CachedPlan {
  std::shared_ptr<const runtime::Interpreter> interpreter;
  int64_t runs = 0;
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
  /// Starts recording one operator call: later nodes get its autograd
  /// sequence number (autograd_info.h). Returns the previous number, for
  /// endCall (calls nest: a copy kernel records through the capture kernel).
  int64_t beginCall(const std::vector<c10::IValue>& args);
  void endCall(int64_t previous) { current_seq_ = previous; }
  /// Records a node with the session's layer and phase; returns its outputs.
  std::vector<ir::ValueId> record(const std::string& op, std::vector<ir::Arg> args,
                                  std::vector<ir::Type> types);
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
  void setOptions(const SessionOptions& o);
  SessionCounters counters();
  void resetCounters();
  /// Text of each cached plan's graph and how often it ran, in capture order.
  std::vector<std::pair<std::string, int64_t>> plans();
  void clearPlans();
  /// Text of the graph the last sync ran ("" if none).
  std::string lastGraph();

 private:
  Session() = default;
  void enterTrace(StorageState& s, const at::Tensor& t);
  ir::ValueId lookup(StorageState& s, const Geometry& g, int depth);
  /// The storage's new value after view `g` of it took the value `v`.
  ir::ValueId writeBack(StorageState& s, const Geometry& g, ir::ValueId v);
  std::optional<ir::Phase> currentPhase();
  std::string currentLayer();

  uint64_t epoch_ = 1;
  capture::Trace trace_;
  std::vector<at::Tensor> input_data_;  // parallel to trace_.inputs()
  bool backward_seen_ = false;
  int64_t current_seq_ = -1;

  struct Named {
    c10::weak_intrusive_ptr<c10::TensorImpl> impl;
    std::string name;
    ir::InputRole role;
  };
  std::unordered_map<const c10::TensorImpl*, Named> names_;

  std::unordered_map<std::string, CachedPlan> cache_;
  std::vector<std::string> cache_order_;
  std::string last_graph_;
  SessionOptions options_;
  SessionCounters counters_;
  std::unordered_set<std::string> warned_;
};

}  // namespace modelpar::backend
