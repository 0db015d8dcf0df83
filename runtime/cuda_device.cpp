// CUDA devices (device.h): a logical device is a compute stream plus one
// transmit stream per peer on its GPU (and a receive stream on the peer's GPU
// when the peer is another GPU); events are c10::cuda::CUDAEvents. Several
// logical devices may share one GPU, each with its own streams. Compiled only
// when MODELPAR_WITH_CUDA is on.
#include <cuda_runtime_api.h>

#include <map>
#include <memory>
#include <mutex>
#include <vector>

#include <ATen/core/Tensor.h>
#include <c10/cuda/CUDACachingAllocator.h>
#include <c10/cuda/CUDAEvent.h>
#include <c10/cuda/CUDAException.h>
#include <c10/cuda/CUDAFunctions.h>
#include <c10/cuda/CUDAGuard.h>
#include <c10/cuda/CUDAStream.h>

#include "runtime/check.h"
#include "runtime/device.h"
#include "runtime/peer_streams.h"

// Note [Dedicated CUDA streams]
// ~~~~~~~~~~~~~~~~~~~~~~~~~~~~~
// c10's stream pool hands its streams out round-robin, so two logical devices
// (or the executor and unrelated code) could silently share a stream and
// serialise. modelpar creates its own streams instead (cudaStreamCreate, non-
// blocking) and wraps them with getStreamFromExternal. It never destroys them:
// the caching allocator remembers the streams a block was used on
// (recordStream) and records an event on each when the block is freed, which
// may happen long after the executor is gone (a returned output, a caller's
// input that was sent). So a stream is leased: an executor takes streams from
// a per-GPU free list (creating one only when the list is empty), owns them
// exclusively while it lives, and gives them back when destroyed (RAII:
// CudaStream). A stale recordStream on a re-leased stream only delays a reuse
// until that stream's earlier work is done, which is harmless.

namespace modelpar::runtime {
namespace {

class StreamRegistry {
 public:
  static StreamRegistry& get() {
    static auto* registry = new StreamRegistry();  // never destroyed, like the streams
    return *registry;
  }
  cudaStream_t acquire(c10::DeviceIndex device) {
    {
      std::lock_guard<std::mutex> lock(mu_);
      std::vector<cudaStream_t>& free = free_[device];
      if (!free.empty()) {
        cudaStream_t s = free.back();
        free.pop_back();
        return s;
      }
    }
    c10::cuda::CUDAGuard guard(device);
    cudaStream_t s = nullptr;
    C10_CUDA_CHECK(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
    return s;
  }
  void release(c10::DeviceIndex device, cudaStream_t s) {
    std::lock_guard<std::mutex> lock(mu_);
    free_[device].push_back(s);
  }

 private:
  std::mutex mu_;
  std::map<c10::DeviceIndex, std::vector<cudaStream_t>> free_;
};

/// A leased dedicated stream (Note [Dedicated CUDA streams]).
class CudaStream final : public Stream {
 public:
  CudaStream(std::string name, c10::DeviceIndex device)
      : Stream(std::move(name)),
        device_(device),
        stream_(c10::cuda::getStreamFromExternal(StreamRegistry::get().acquire(device), device)) {}
  ~CudaStream() override {
    // Let queued work finish before another executor may lease the stream.
    C10_CUDA_CHECK_WARN(cudaStreamSynchronize(stream_.stream()));
    StreamRegistry::get().release(device_, stream_.stream());
  }
  const c10::cuda::CUDAStream& get() const { return stream_; }
  c10::Stream native() const override { return stream_.unwrap(); }

 private:
  c10::DeviceIndex device_;
  c10::cuda::CUDAStream stream_;
};

const c10::cuda::CUDAStream& cuda(Stream& s) { return static_cast<CudaStream&>(s).get(); }

class CudaEvent final : public Event {
 public:
  void record(Stream& s) override { event_.record(cuda(s)); }
  void block(Stream& s) override { event_.block(cuda(s)); }
  void synchronize() override { event_.synchronize(); }

 private:
  c10::cuda::CUDAEvent event_{cudaEventDisableTiming};
};

void recordOn(const c10::IValue& v, const c10::cuda::CUDAStream& s) {
  if (!v.isTensor()) return;
  const at::Tensor& t = v.toTensor();
  if (!t.defined() || !t.is_cuda() || !t.has_storage()) return;
  // A no-op when `s` is the block's allocation stream, and for memory the
  // caching allocator does not own.
  c10::cuda::CUDACachingAllocator::recordStream(t.storage().data_ptr(), s);
}

class CudaDevice final : public Device {
 public:
  CudaDevice(int index, c10::Device physical)
      : Device(DeviceKind::Cuda, index, physical),
        compute_("compute", physical.index()) {}

  Stream& compute() override { return compute_; }
  Stream& tx(int peer) override { return tx_.at(*this, peer); }
  void connectTo(Device& peer) override {
    checkSameKind(*this, peer);
    auto& dst = static_cast<CudaDevice&>(peer);
    tx_.connect(dst.index(), [&] {
      return std::make_unique<CudaStream>(c10::str("tx->", dst.index()), physical().index());
    });
    if (dst.physical() != physical()) {
      dst.rx_.connect(index(), [&] {
        return std::make_unique<CudaStream>(c10::str("rx<-", index()), dst.physical().index());
      });
    }
  }
  std::unique_ptr<Event> newEvent() override { return std::make_unique<CudaEvent>(); }

  void enqueue(Stream& s, std::function<void()> fn) override {
    if (&s == &compute_) {  // current on the worker since enterWorker()
      fn();
      return;
    }
    c10::cuda::CUDAStreamGuard guard(cuda(s));
    fn();
  }

  c10::IValue place(const c10::IValue& v) override {
    if (!v.isTensor() || !v.toTensor().defined()) return v;
    const at::Tensor& t = v.toTensor();
    if (t.device() == physical()) {
      recordOn(v, compute_.get());  // allocated on the caller's stream, used on ours
      return v;
    }
    c10::cuda::CUDAStreamGuard guard(compute_.get());
    return t.to(physical());
  }

  c10::IValue copyTo(const c10::IValue& v, Device& dst) override {
    if (!v.isTensor() || !v.toTensor().defined()) return v;
    const at::Tensor& t = v.toTensor();
    auto& to = static_cast<CudaDevice&>(dst);
    if (to.physical() == physical()) return t.clone();  // on the current (tx) stream
    // Across GPUs ATen copies on the source's current stream (our tx) after a
    // barrier with the destination's current stream, which we make the
    // peer's rx stream; the copy is allocated there (seed 000 §1.3.3).
    c10::cuda::CUDAMultiStreamGuard guard(to.rx_.at(to, index()).get());
    return t.to(t.options().device(to.physical()), /*non_blocking=*/true, /*copy=*/true);
  }

  void recordStream(const c10::IValue& v, Stream& s) override { recordOn(v, cuda(s)); }

  void enterWorker() override {
    c10::cuda::set_device(physical().index());
    c10::cuda::setCurrentCUDAStream(compute_.get());
  }
  void acceptFromCaller() override {
    const c10::cuda::CUDAStream caller = c10::cuda::getCurrentCUDAStream(physical().index());
    if (caller == compute_.get()) return;
    entry_.record(caller);
    entry_.block(compute_.get());
  }
  void handToCaller(const c10::IValue& v) override {
    if (!v.isTensor() || !v.toTensor().defined() || !v.toTensor().is_cuda()) return;
    recordOn(v, c10::cuda::getCurrentCUDAStream(v.toTensor().device().index()));
  }
  void finishStep() override {}
  void joinCaller() override {
    size_t k = 0;
    auto join = [&](const c10::cuda::CUDAStream& s) {
      const c10::cuda::CUDAStream caller = c10::cuda::getCurrentCUDAStream(s.device_index());
      if (s == caller) return;
      if (k == exit_.size()) exit_.push_back(std::make_unique<c10::cuda::CUDAEvent>(cudaEventDisableTiming));
      exit_[k]->record(s);
      exit_[k++]->block(caller);
    };
    join(compute_.get());
    for (auto& [peer, s] : tx_) join(s->get());
    for (auto& [peer, s] : rx_) join(s->get());
  }
  void synchronize() override {
    for (auto& [peer, s] : tx_) s->get().synchronize();
    for (auto& [peer, s] : rx_) s->get().synchronize();
    compute_.get().synchronize();
  }

  // GPU work cannot be recalled; the executor stops issuing and its own
  // waits are cancelled, so there is nothing to wake here.
  void cancel() override {}
  void reset() override { synchronize(); }

 private:
  CudaStream compute_;
  PeerStreams<CudaStream> tx_{"tx", "to"};    // by destination
  PeerStreams<CudaStream> rx_{"rx", "from"};  // by source, on this GPU
  c10::cuda::CUDAEvent entry_{cudaEventDisableTiming};
  // joinCaller's: one per stream, in the order it visits them (each stays on
  // its stream's GPU, which CUDAEvent requires).
  std::vector<std::unique_ptr<c10::cuda::CUDAEvent>> exit_;
};

}  // namespace

bool cudaDevicesBuilt() { return true; }
int cudaDeviceCount() { return c10::cuda::device_count(); }

std::vector<std::unique_ptr<Device>> createCudaDevices(const DeviceMap& map) {
  const int gpus = cudaDeviceCount();
  std::vector<std::unique_ptr<Device>> out;
  for (size_t i = 0; i < map.devices.size(); ++i) {
    const c10::Device& d = map.devices[i];
    const int gpu = d.has_index() ? d.index() : 0;
    MP_RT_CHECK(gpu < gpus, ConfigError, "modelpar executor: logical device ", i, " maps to cuda:",
                gpu, " but ", gpus, " GPUs are visible; use a smaller index or cuda:0 for all");
    out.push_back(std::make_unique<CudaDevice>(static_cast<int>(i),
                                               c10::Device(c10::kCUDA, static_cast<c10::DeviceIndex>(gpu))));
  }
  return out;
}

}  // namespace modelpar::runtime
