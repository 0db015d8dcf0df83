// The runtime's one device/stream abstraction (STYLE.md "Runtime"): a logical
// device with a compute stream and one transmit stream per peer, events that
// order work across streams, tensor placement, and the caching allocator's
// stream bookkeeping. The Executor is written once against it; cpu_device.cpp
// implements it with worker threads and counters (how CI runs every plan),
// cuda_device.cpp with CUDA streams and events (torchgpipe's stream.py idea:
// CPU "streams" stand in for CUDA ones so the scheduling code is the same).
#pragma once

#include <cstdint>
#include <exception>
#include <functional>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include <ATen/core/ivalue.h>
#include <c10/core/Device.h>
#include <c10/core/Stream.h>

namespace modelpar::runtime {

/// Thrown out of a wait that cancel() interrupted. It is not an error of its
/// own: the executor reports the error that caused the cancel.
class Cancelled : public std::exception {
 public:
  const char* what() const noexcept override { return "modelpar: cancelled"; }
};

/// An ordered queue of device work. Work enqueued on one stream runs in
/// enqueue order; work on different streams is unordered unless an Event
/// orders it. Owned by its Device; non-copyable.
class Stream {
 public:
  virtual ~Stream() = default;
  Stream(const Stream&) = delete;
  Stream& operator=(const Stream&) = delete;
  /// `compute`, `tx->1`, `rx<-0`.
  const std::string& name() const { return name_; }
  /// The c10 stream behind it (CUDA: the dedicated cudaStream_t; CPU: the
  /// CPU default stream, a placeholder), for interop and tests.
  virtual c10::Stream native() const = 0;

 protected:
  explicit Stream(std::string name) : name_(std::move(name)) {}

 private:
  std::string name_;
};

/// A point in a stream's work. Reusable: each record() replaces the point.
/// Events and streams of one executor all come from devices of one kind.
class Event {
 public:
  virtual ~Event() = default;
  /// Captures the work enqueued on `s` so far.
  virtual void record(Stream& s) = 0;
  /// Work enqueued on `s` after this call starts only once the recorded work
  /// has finished. Never blocks a CUDA host thread; on a CPU worker's compute
  /// stream (whose work runs on the calling thread) it blocks the caller.
  /// A no-op before the first record(). Throws Cancelled.
  virtual void block(Stream& s) = 0;
  /// Blocks the calling thread until the recorded work has finished.
  /// Throws Cancelled.
  virtual void synchronize() = 0;
};

enum class DeviceKind : uint8_t { CpuWorker, Cuda };

/// One logical device of a Program, bound to a real one.
class Device {
 public:
  virtual ~Device() = default;
  Device(const Device&) = delete;
  Device& operator=(const Device&) = delete;

  DeviceKind kind() const { return kind_; }
  /// The logical index (the Program's device number).
  int index() const { return index_; }
  /// The real device tensors of this logical device live on.
  c10::Device physical() const { return physical_; }
  /// `logical device 1 (cuda:0)`.
  std::string describe() const;

  /// Where this device's operators run, in program order.
  virtual Stream& compute() = 0;
  /// The stream this device sends to `peer` on. Precondition: connectTo(peer).
  virtual Stream& tx(int peer) = 0;
  /// Creates the streams for sending to `peer` (this device's tx stream and,
  /// across physical devices, the peer's receive stream). Call before any
  /// work is issued; idempotent. Precondition: same kind as this device.
  virtual void connectTo(Device& peer) = 0;
  /// A new event of this device's kind.
  virtual std::unique_ptr<Event> newEvent() = 0;

  /// Issues `fn` in the order of `s`, which belongs to this device. CUDA:
  /// calls `fn` now with `s` current, so the kernels it launches queue on
  /// `s`. CPU: the compute stream runs `fn` now on the calling thread (the
  /// device's worker); a transmit stream runs it later on its own thread,
  /// after the earlier work of `s`. Exceptions of `fn` propagate on CUDA and
  /// on the CPU compute stream; on a CPU transmit stream they are kept and
  /// rethrown by waits on that stream, so `fn` should report its own errors.
  virtual void enqueue(Stream& s, std::function<void()> fn) = 0;
  /// enqueue() for a copy of `bytes` bytes onto a transmit stream. CPU: when
  /// nothing is queued or running on `s` and the value is small, runs `fn`
  /// now on the calling thread instead of waking the stream's (Note [A
  /// sender copies a small value itself] in cpu_device.cpp).
  virtual void enqueueCopy(Stream& s, std::function<void()> fn, int64_t bytes) {
    (void)bytes;
    enqueue(s, std::move(fn));
  }

  /// Makes a value usable on this device: a tensor moves to physical() on
  /// the compute stream (no copy when it is already there); other values pass
  /// through. Called on the device's worker thread.
  virtual c10::IValue place(const c10::IValue& v) = 0;
  /// A copy of `v` that `dst` owns (a later in-place op on either side does
  /// not show on the other). Call it inside enqueue(tx(dst.index()), ...).
  virtual c10::IValue copyTo(const c10::IValue& v, Device& dst) = 0;
  /// Tells the caching allocator that the tensor in `v` (if any) is used on
  /// `s`, so its memory is not reused before the work queued there so far has
  /// finished. CUDA: CUDACachingAllocator::recordStream; CPU: no-op.
  virtual void recordStream(const c10::IValue& v, Stream& s) = 0;

  /// Called once on the thread that will issue this device's work, before
  /// any: binds the thread to the device (CUDA) or sets its intra-op thread
  /// count (CPU).
  virtual void enterWorker() = 0;
  /// On the caller's thread, before a step: the compute stream waits for the
  /// caller's current stream (CUDA), so inputs the caller is still writing
  /// are complete before they are read. CPU: no-op.
  virtual void acceptFromCaller() = 0;
  /// On the caller's thread, after a step: the caller's current stream is
  /// recorded on the output's memory (CUDA), so the caching allocator does
  /// not hand it to this device's streams while the caller still uses it.
  virtual void handToCaller(const c10::IValue& v) = 0;
  /// On the worker, at the end of a step. CPU: waits for the device's
  /// copies (synchronize()), so the step's values are complete when the
  /// worker reports done. CUDA: nothing; the host never waits for the GPU
  /// (joinCaller() orders the caller after the step instead).
  virtual void finishStep() = 0;
  /// On the caller's thread, after a step: the caller's current streams wait
  /// (on the GPU, through events) for all work issued to this device's
  /// streams, so whatever the caller does next with the outputs or the inputs
  /// comes after the step. CPU: no-op.
  virtual void joinCaller() = 0;
  /// Blocks until all work issued to this device's streams has finished.
  /// Throws Cancelled (CPU) when cancelled while waiting.
  virtual void synchronize() = 0;

  /// Interrupts every wait on this device's streams and events (they throw
  /// Cancelled) and drops CPU work still queued. Safe from any thread.
  virtual void cancel() = 0;
  /// After a cancelled step: waits until the streams are idle and re-arms
  /// them. Call with no work being issued.
  virtual void reset() = 0;

 protected:
  Device(DeviceKind kind, int index, c10::Device physical)
      : kind_(kind), index_(index), physical_(physical) {}

 private:
  DeviceKind kind_;
  int index_;
  c10::Device physical_;
};

/// How a Program's logical devices bind to real ones.
///
/// Example:
///   DeviceMap::cpuWorkers(4, /*threads_per_device=*/1)  // CI
///   DeviceMap::parse("cuda:0", 4)        // one GPU hosting 4 logical devices
///   DeviceMap::parse("cuda", 2)          // logical i -> cuda:i
struct DeviceMap {
  /// One entry per logical device. All CPU (CPU workers) or all CUDA; CUDA
  /// entries may repeat a GPU (logical devices sharing one physical device).
  std::vector<c10::Device> devices;
  /// Intra-op threads of each CPU worker; 0 picks
  /// max(1, at::get_num_threads() / number of workers).
  int threads_per_device = 0;

  static DeviceMap cpuWorkers(int n, int threads_per_device = 0);
  /// `cpu-workers` (or `cpu`): n CPU workers; `cuda`: logical i on cuda:i;
  /// `cuda:K`: all n on GPU K; a comma-separated list of n devices
  /// (`cuda:0,cuda:1,cuda:0`). Throws ConfigError for anything else or a
  /// list whose length is not n.
  static DeviceMap parse(std::string_view spec, int n, int threads_per_device = 0);

  DeviceKind kind() const;
  /// `4 cpu-workers x 1 thread`, `cuda:0,cuda:0`.
  std::string toString() const;
};

/// True when this build has the CUDA implementation (MODELPAR_WITH_CUDA).
bool cudaDevicesBuilt();
/// Number of visible GPUs; 0 without CUDA support or without a GPU.
int cudaDeviceCount();

/// Creates the logical devices of `map`, in order. Throws ConfigError for an
/// empty or mixed map, a CUDA map in a build without CUDA or with a GPU index
/// out of range, or an unsupported device type.
std::vector<std::unique_ptr<Device>> createDevices(const DeviceMap& map);

// Implementations (cpu_device.cpp, cuda_device.cpp); use createDevices.
std::vector<std::unique_ptr<Device>> createCpuWorkerDevices(const DeviceMap& map);
std::vector<std::unique_ptr<Device>> createCudaDevices(const DeviceMap& map);

}  // namespace modelpar::runtime
