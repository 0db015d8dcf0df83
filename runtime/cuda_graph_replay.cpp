// CUDA Graph capture and replay of an Executor's program (Replay::Graphs;
// the protocol is Note [Graph replay] in executor_replay.cpp): one
// at::cuda::CUDAGraph per graph segment (graph_segments.h), captured by the
// device's worker on its compute stream, its tx streams joined into the
// capture by events, one private memory pool shared by all the graphs, and
// external events for the sends between graphs. Compiled only with
// MODELPAR_WITH_CUDA. NOT RUN: no GPU was available when this was written
// (scripts/gpu_check.sh runs the GPU tests under compute-sanitizer).
#include <cuda_runtime_api.h>

#include <condition_variable>
#include <map>
#include <mutex>
#include <set>

#include <ATen/core/CachingHostAllocator.h>
#include <ATen/cuda/CUDAGraph.h>
#include <c10/cuda/CUDACachingAllocator.h>
#include <c10/cuda/CUDAEvent.h>
#include <c10/cuda/CUDAGuard.h>
#include <c10/cuda/CUDAStream.h>

#include "runtime/check.h"
#include "runtime/executor_impl.h"
#include "runtime/graph_segments.h"

// Note [Graph replay ordering]
// ~~~~~~~~~~~~~~~~~~~~~~~~~~~~
// Capture. The capture step runs on the workers like a stream step, but each
// segment is a capture: worker d, at the first instruction of its segment s,
// waits until every segment before s in the launch order has been captured,
// then begins a capture on its compute stream (mode ThreadLocal: the other
// workers may make CUDA calls meanwhile) into the shared private pool. Inside:
//
//   compute   [ops] ready.record ......................... join.wait [ops] end
//   tx->R            ready.wait [copy %v] done.record ext.record join.record
//
//   - `ready`, `done`, `join` are ordinary events: inside one capture they
//     become edges of the graph (the tx stream joins the capture through the
//     `ready` wait and is joined back before the capture ends, as CUDA
//     requires). A fence (an in-place op after sends) waits on `done` when
//     the send is in the same segment; an earlier segment's sends were joined.
//   - `ext` (CUDAEvent with cudaEventExternal, created per send) is recorded
//     with cudaEventRecordExternal: an event-record node. The receiver's
//     segment waits on it with cudaEventWaitExternal: an event-wait node.
//     Captures are serialised in the launch order (one at a time), which is
//     what sharing one pool asks for (CUDAGraph.h: graphs sharing a pool are
//     safe when replayed in capture order).
//
// Replay. On the caller's thread: every compute stream waits for the caller's
// stream (the input copies), then every graph is launched on its device's
// compute stream in the launch order, then the caller's stream waits for
// every compute stream. No host synchronisation.
//
// Ordering guarantees of a replay, and what they rest on:
//   1. Within a logical device: its graphs run in order on one stream; its tx
//      work is inside its graphs (joined), so it is ordered too.
//   2. Across devices: a recv's segment waits on the send's external event.
//      CUDA resolves an event wait against the most recent record *issued
//      before the wait is issued*; for graphs the nodes are issued at
//      cudaGraphLaunch. The launch order puts the sending graph's launch
//      first, so the wait sees this step's record, never the last step's.
//      (That graph event nodes follow the host-order semantics of
//      cudaEventRecord / cudaStreamWaitEvent is the CUDA documentation's
//      description of event-record and event-wait nodes; it has not been
//      checked on a GPU here.)
//   3. Across steps: the caller's stream joins all compute streams at the end
//      of a replay, and the next step's input copies and launches come after
//      it, so a step never overwrites a buffer the previous one still reads.
//   4. Memory: the caching allocator reuses a freed pool block only for the
//      stream it was allocated on, and a device's streams are ordered by (1),
//      so reuse within the pool is safe, except for blocks used on two
//      streams (a sent value on the tx stream, a copy read by the receiver):
//      the capture keeps every sent value and every received copy alive
//      until all segments are captured, so no capture reuses them.
//   5. RNG: in torch 2.14 an RNG op registers its generator's state with the
//      capturing graph itself (libtorch_cuda: "RNG op during graph capture but
//      could not find the CUDAGraph object"; Python's
//      CUDAGraph.register_generator_state is a deprecated no-op), and each
//      replay advances the generator by the graph's whole increment, so
//      dropout differs between replays. This file therefore calls no
//      register_generator_state: the C++ overload takes a CUDAGeneratorState
//      that the default generator does not expose.
// Not supported (captureIssues() reports them): sends across GPUs (a CUDAGraph
// is one device), host synchronisation, data-dependent shapes.

namespace modelpar::runtime::detail {
namespace {

c10::cuda::CUDAStream cudaOf(Stream& s) {
  return c10::cuda::CUDAStream(c10::cuda::CUDAStream::UNCHECKED, s.native());
}

/// Note [Abandoning a capture], the pinned host memory half: since PyTorch
/// PR 167507 (torch 2.11 or so) CUDAGraph::capture_begin also routes the
/// caching host allocator's allocations into the graph's pool
/// (begin_allocate_to_pool, with a filter that holds the CUDAGraph), and
/// capture_end / reset undo it. An abandoned capture undoes it here, or the
/// host allocator keeps calling the filter of a destroyed CUDAGraph. A
/// torch without those methods compiles to nothing (the requires-clause).
template <typename HostAllocator>
void endHostPoolRouting(HostAllocator* host, c10::MempoolId_t pool) noexcept {
  if constexpr (requires { host->end_allocate_to_pool(pool); host->release_pool(pool); }) {
    try {
      host->end_allocate_to_pool(pool);  // throws if this capture never routed host memory
      host->release_pool(pool);
    } catch (...) {
    }
  }
}

class CudaGraphCapture final : public GraphCapture {
 public:
  CudaGraphCapture(const ir::Program& p, std::vector<Lane>& lanes, std::deque<Mail>& mail)
      : lanes_(lanes),
        order_(graphSegments(p)),
        by_device_(lanes.size()),
        next_(lanes.size(), 0),
        open_(lanes.size(), -1),
        tx_used_(lanes.size()),
        ext_(mail.size()),
        sent_in_(mail.size(), -1),
        graphs_(order_.size()),
        pool_(at::cuda::graph_pool_handle()) {
    for (size_t k = 0; k < order_.size(); ++k) {
      by_device_[static_cast<size_t>(order_[k].device)].push_back(k);
    }
  }

  void before(int d, size_t i) override {
    const size_t ud = static_cast<size_t>(d);
    const std::vector<size_t>& mine = by_device_[ud];
    if (next_[ud] >= mine.size() || order_[mine[next_[ud]]].begin != i) return;
    const size_t k = mine[next_[ud]];
    {
      std::unique_lock<std::mutex> lock(mu_);
      cv_.wait(lock, [&] { return turn_ == k || cancelled_; });
      if (cancelled_) throw Cancelled();
    }
    graphs_[k] = std::make_unique<at::cuda::CUDAGraph>();
    graphs_[k]->capture_begin(pool_, cudaStreamCaptureModeThreadLocal);
    open_[ud] = static_cast<int64_t>(k);
  }

  void after(int d, size_t i) override {
    const size_t ud = static_cast<size_t>(d);
    if (open_[ud] < 0) return;
    const size_t k = static_cast<size_t>(open_[ud]);
    if (order_[k].end != i + 1) return;
    Device& dev = *lanes_[ud].device;
    for (int peer : tx_used_[ud]) {
      std::unique_ptr<c10::cuda::CUDAEvent>& join = join_[{d, peer}];
      if (!join) join = std::make_unique<c10::cuda::CUDAEvent>(cudaEventDisableTiming);
      join->record(cudaOf(dev.tx(peer)));
      join->block(cudaOf(dev.compute()));
    }
    tx_used_[ud].clear();
    graphs_[k]->capture_end();
    open_[ud] = -1;
    ++next_[ud];
    {
      std::lock_guard<std::mutex> lock(mu_);
      ++turn_;
    }
    cv_.notify_all();
  }

  void sent(int d, int peer, int32_t mail, const c10::IValue& v) override {
    const size_t ud = static_cast<size_t>(d);
    Device& dev = *lanes_[ud].device;
    std::unique_ptr<c10::cuda::CUDAEvent>& ext = ext_[static_cast<size_t>(mail)];
    // Created in place: CUDAEvent's move does not always carry the external
    // flag (pytorch-internals.md §5.3).
    if (!ext) ext = std::make_unique<c10::cuda::CUDAEvent>(cudaEventDisableTiming | cudaEventExternal);
    // The flag is applied when the *current* stream (compute) is capturing.
    ext->record(cudaOf(dev.tx(peer)));
    tx_used_[ud].insert(peer);
    sent_in_[static_cast<size_t>(mail)] = open_[ud];
    keep(v);
  }

  bool fenceApplies(int d, int32_t mail) override {
    const int64_t k = sent_in_[static_cast<size_t>(mail)];
    return k >= 0 && k == open_[static_cast<size_t>(d)];
  }

  void received(int d, int32_t mail, const c10::IValue& v) override {
    Device& dev = *lanes_[static_cast<size_t>(d)].device;
    const std::unique_ptr<c10::cuda::CUDAEvent>& ext = ext_[static_cast<size_t>(mail)];
    MP_RT_INTERNAL_ASSERT(ext != nullptr, "modelpar graph capture: device ", d,
                          " receives send slot ", mail, " before it was captured");
    ext->block(cudaOf(dev.compute()));
    keep(v);
  }

  void abandon(int d) noexcept override {
    const size_t ud = static_cast<size_t>(d);
    if (open_[ud] < 0) return;
    // Note [Abandoning a capture]: at::cuda::CUDAGraph::capture_end() cannot
    // close a capture that failed: it throws at cudaStreamEndCapture (an
    // invalidated capture) before it tells the caching allocator that the
    // capture is over, which would leave every later allocation on this
    // device routed into the graph pool; and a CUDAGraph whose capture never
    // ended does not release its pool reference when destroyed (its reset()
    // releases only with a graph or an executable). So close it in
    // capture_end's order, without its checks: take the stream out of
    // capture mode, end the allocator's routing into the pool, and drop the
    // pool reference the capture took (beginAllocateToPool's).
    // Before that, join back the tx streams that joined this capture (a send
    // in the segment, as after() does on success): a fork left unjoined makes
    // cudaStreamEndCapture fail with cudaErrorStreamCaptureUnjoined, and the
    // tx streams must leave capture mode with the compute stream, or the
    // fall-back stream step cannot use them. On an invalidated capture these
    // calls fail; cudaStreamEndCapture still takes every stream of the
    // capture out of capture mode. (tests/runtime/capture_failure_test.cpp.)
    const c10::cuda::CUDAStream stream = cudaOf(lanes_[ud].device->compute());
    for (int peer : tx_used_[ud]) {
      try {
        std::unique_ptr<c10::cuda::CUDAEvent>& join = join_[{d, peer}];
        if (!join) join = std::make_unique<c10::cuda::CUDAEvent>(cudaEventDisableTiming);
        join->record(cudaOf(lanes_[ud].device->tx(peer)));
        join->block(stream);
      } catch (...) {
        // noexcept; an invalidated capture refuses the join, and ending it is enough.
      }
    }
    tx_used_[ud].clear();
    (void)cudaGetLastError();
    cudaGraph_t g = nullptr;
    if (cudaStreamEndCapture(stream.stream(), &g) == cudaSuccess && g != nullptr) {
      (void)cudaGraphDestroy(g);
    }
    (void)cudaGetLastError();
    try {
      c10::cuda::CUDACachingAllocator::endAllocateToPool(stream.device_index(), pool_);
      c10::cuda::CUDACachingAllocator::releasePool(stream.device_index(), pool_);
    } catch (...) {
      // noexcept: the error that made the executor abandon is the one reported.
    }
    try {
      endHostPoolRouting(at::getHostAllocator(at::kCUDA), pool_);
    } catch (...) {
    }
    graphs_[static_cast<size_t>(open_[ud])].reset();
    open_[ud] = -1;
    cancel();
  }

  void cancel() override {
    {
      std::lock_guard<std::mutex> lock(mu_);
      cancelled_ = true;
    }
    cv_.notify_all();
  }

  void finish() override {
    std::lock_guard<std::mutex> lock(mu_);
    MP_RT_INTERNAL_ASSERT(turn_ == order_.size(), "modelpar graph capture: ", turn_, " of ",
                          order_.size(), " segments were captured (", toString(order_), ")");
    keep_.clear();  // back to the private pool, which no capture allocates from any more
  }

  void replay() override {
    for (Lane& lane : lanes_) lane.device->acceptFromCaller();
    for (size_t k = 0; k < order_.size(); ++k) {
      Device& dev = *lanes_[static_cast<size_t>(order_[k].device)].device;
      c10::cuda::CUDAStreamGuard guard(cudaOf(dev.compute()));
      graphs_[k]->replay();
    }
    for (Lane& lane : lanes_) lane.device->joinCaller();  // as a stream-replayed step ends
  }

  size_t numGraphs() const override { return order_.size(); }

 private:
  void keep(const c10::IValue& v) {
    std::lock_guard<std::mutex> lock(mu_);
    keep_.push_back(v);
  }

  std::vector<Lane>& lanes_;
  std::vector<GraphSegment> order_;               // launch order
  std::vector<std::vector<size_t>> by_device_;    // indices into order_, in device order
  std::vector<size_t> next_;                      // per device: its next segment
  std::vector<int64_t> open_;                     // per device: the segment being captured
  std::vector<std::set<int>> tx_used_;            // per device: tx peers used in the open segment
  std::vector<std::unique_ptr<c10::cuda::CUDAEvent>> ext_;  // per send slot
  std::vector<int64_t> sent_in_;                  // per send slot: its segment
  std::map<std::pair<int, int>, std::unique_ptr<c10::cuda::CUDAEvent>> join_;
  std::vector<std::unique_ptr<at::cuda::CUDAGraph>> graphs_;  // by launch index
  c10::MempoolId_t pool_;

  std::mutex mu_;
  std::condition_variable cv_;
  size_t turn_ = 0;  // launch index of the segment whose capture may begin
  bool cancelled_ = false;
  std::vector<c10::IValue> keep_;
};

}  // namespace

std::unique_ptr<GraphCapture> createCudaGraphCapture(const ir::Program& p, std::vector<Lane>& lanes,
                                                     std::deque<Mail>& mail) {
  return std::make_unique<CudaGraphCapture>(p, lanes, mail);
}

}  // namespace modelpar::runtime::detail
