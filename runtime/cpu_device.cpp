// CPU worker devices (device.h): how CI runs multi-device plans. Each logical
// device is the worker thread the executor gives it; its transmit streams are
// threads of their own, and events are (stream, ticket) pairs.
#include <atomic>
#include <condition_variable>
#include <deque>
#include <map>
#include <mutex>
#include <thread>

#include <ATen/Parallel.h>
#include <ATen/core/Tensor.h>

#include "runtime/check.h"
#include "runtime/device.h"
#include "runtime/peer_streams.h"
#include "runtime/spin_wait.h"
#include "runtime/threads.h"

// Note [CPU streams]
// ~~~~~~~~~~~~~~~~~~
// A CPU stream counts the work items it has been given (`issued`) and the
// ones that have finished (`completed`); an event is a stream plus the value
// of `issued` when it was recorded, and it has happened once `completed`
// reaches it. Two kinds of stream:
//
//   compute  inline: enqueue() runs the work at once on the calling thread,
//            the device's worker, so issued == completed whenever that thread
//            looks, and an event recorded on it has already happened. A
//            block() onto it waits right there, on the worker.
//   tx->p    asynchronous: a FIFO of closures served by a thread of its own
//            (or by a worker waiting for them: Note [Waiters run the copy]).
//            block() onto it enqueues a closure that waits for the event, so
//            the worker goes on issuing while the stream waits.
//
// Cancel sets the device's flag and wakes every wait (they throw Cancelled);
// queued closures are then dropped but still counted, so reset() can wait for
// `completed == issued` and re-arm. This is torchgpipe's "CPU stream" idea
// made asynchronous, so the CPU build exercises the same event edges a GPU
// needs (seed 002 §3.2.3, seed 000 §1.3.3).

// Note [A sender copies a small value itself]
// ~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~
// A send hands its copy to the tx stream's thread, which sleeps while its
// queue is empty. Woken on a machine whose cores the two workers already
// hold, that thread has to preempt one of them: on a 2-vCPU VM a send's span
// grew from 3 us (calibrated, the other core idle) to 12-20 us while both
// workers computed, and a worker of looped's 1F1B of 32 micro-batches spent
// 1481 us of its step in its sends (4106 us in its runs). When the stream
// has nothing queued or running and the value is at most kCopyHereBytes,
// the sender now runs the copy itself, at once, as a waiter would (Note
// [Waiters run the copy]): no thread is woken, the item still counts on
// the stream (issued, then completed) so its events mean what they meant,
// and it cannot overtake an earlier item since there is none. A larger copy
// still goes to the stream's thread, which overlaps it with the sender's
// compute where a core is free. Measured on that VM (mlp, 10 rounds
// alternating, median step): 1F1B x 32 4870 -> 2964 us, 1F1B x 8 1349 ->
// 960 us, GPipe x 8 1032 -> 935 us, m-ETF 359 -> 310 us.

namespace modelpar::runtime {
namespace {

constexpr int64_t kCopyHereBytes = 64 << 10;  // Note [A sender copies a small value itself]

class CpuStream final : public Stream {
 public:
  /// `owner` names the device in the error when the stream's thread cannot start.
  CpuStream(std::string name, bool async, const std::atomic<bool>* cancelled,
            const std::string& owner = "")
      : Stream(std::move(name)), async_(async), cancelled_(cancelled) {
    // Last, after every member loop() uses; a refusal leaves nothing to join.
    if (async_) {
      thread_ = startThread(c10::str(owner, " copy stream ", this->name()), [this] { loop(); });
    }
  }
  ~CpuStream() override {
    if (!async_) return;
    {
      std::lock_guard<std::mutex> lock(mu_);
      stop_ = true;
    }
    thread_cv_.notify_all();
    thread_.join();
  }

  bool async() const { return async_; }
  c10::Stream native() const override {
    return c10::Stream(c10::Stream::DEFAULT, c10::Device(c10::kCPU));
  }

  /// Issues `fn`. An asynchronous stream queues it for its thread, or, when
  /// `run_here_if_idle` and nothing is queued or running, runs it now on the
  /// calling thread (Note [A sender copies a small value itself]).
  void enqueue(std::function<void()> fn, bool run_here_if_idle = false) {
    if (!async_) {
      {
        std::lock_guard<std::mutex> lock(mu_);
        ++issued_;
      }
      struct Done {  // counts the item as finished even when fn throws
        CpuStream* s;
        ~Done() {
          std::lock_guard<std::mutex> lock(s->mu_);
          ++s->completed_;
        }
      } done{this};
      fn();
      return;
    }
    {
      std::unique_lock<std::mutex> lock(mu_);
      queue_.push_back(std::move(fn));
      ++issued_;
      if (run_here_if_idle && queue_.size() == 1 && !running_) {
        runFront(lock);
        return;
      }
    }
    cv_.notify_all();
    thread_cv_.notify_all();
  }

  uint64_t issued() {
    std::lock_guard<std::mutex> lock(mu_);
    return issued_;
  }

  bool reached(uint64_t ticket) {
    std::lock_guard<std::mutex> lock(mu_);
    return completed_ >= ticket && !fault_;
  }

  /// Waits until `ticket` items have finished, running queued items itself
  /// when the stream's thread is not running one (Note [Waiters run the
  /// copy]). Throws Cancelled, or the exception a closure of this stream threw.
  void waitFor(uint64_t ticket) {
    std::unique_lock<std::mutex> lock(mu_);
    while (completed_ < ticket && !cancelled_->load()) {
      if (canHelp()) {
        runFront(lock);
        continue;
      }
      // The stream's thread runs an item: poll for its end first (Note
      // [Spinning before sleeping]), then sleep until it or a cancel comes.
      const uint64_t seen = completed_;
      lock.unlock();
      const bool moved = spinUntil([&] { return completed_.load() != seen || cancelled_->load(); });
      lock.lock();
      if (!moved) {
        cv_.wait(lock, [&] { return completed_ >= ticket || cancelled_->load() || canHelp(); });
      }
    }
    if (cancelled_->load()) throw Cancelled();
    if (fault_) std::rethrow_exception(fault_);
  }

  /// Waits until every issued item has finished or been dropped, ignoring
  /// cancellation, and forgets a kept exception.
  void drain() {
    std::unique_lock<std::mutex> lock(mu_);
    cv_.wait(lock, [&] { return completed_ == issued_; });
    fault_ = nullptr;
  }

  void wake() {
    std::lock_guard<std::mutex> lock(mu_);  // no lost wake-up: waiters hold mu_ to test the flag
    cv_.notify_all();
    thread_cv_.notify_all();
  }

 private:
  // Note [Waiters run the copy]
  // ~~~~~~~~~~~~~~~~~~~~~~~~~~~~
  // An asynchronous stream's items run in order, one at a time, on its own
  // thread, which sleeps while the queue is empty. A worker that has to wait
  // for an item (a recv waiting for its copy) and finds it still queued, with
  // no item running, runs it itself instead of waiting for the stream's
  // thread to wake up: on a VM that wake-up took 30-80 us (a 2-device
  // pipeline's hand-offs, traced), far longer than copying a small tensor.
  // The items still run in issue order and never two at once (`running_`),
  // so the events recorded on the stream mean what they meant.
  bool canHelp() const { return !running_ && !queue_.empty(); }

  /// Runs the front item on the calling thread; `lock` holds mu_ on entry
  /// and on return.
  void runFront(std::unique_lock<std::mutex>& lock) {
    std::function<void()> fn = std::move(queue_.front());
    queue_.pop_front();
    running_ = true;
    lock.unlock();
    if (!cancelled_->load()) {
      try {
        fn();
      } catch (const Cancelled&) {
      } catch (...) {
        std::lock_guard<std::mutex> fault_lock(mu_);
        if (!fault_) fault_ = std::current_exception();
      }
    }
    fn = nullptr;  // drop what the closure holds before counting it done
    lock.lock();
    running_ = false;
    ++completed_;
    cv_.notify_all();
    // The next item is the thread's if no waiter takes it; a stopping thread
    // waits for the item a waiter ran to end.
    if (!queue_.empty() || stop_) thread_cv_.notify_all();
  }

  void loop() {
    std::unique_lock<std::mutex> lock(mu_);
    for (;;) {
      thread_cv_.wait(lock, [&] { return canHelp() || (stop_ && queue_.empty() && !running_); });
      if (!canHelp()) return;
      runFront(lock);
    }
  }

  const bool async_;
  const std::atomic<bool>* cancelled_;
  std::mutex mu_;
  std::condition_variable cv_;         // waiters: an item finished, or one can be helped
  std::condition_variable thread_cv_;  // the stream's thread: an item to run, or stop
  std::deque<std::function<void()>> queue_;
  uint64_t issued_ = 0;
  std::atomic<uint64_t> completed_{0};  // written under mu_; polled by spinUntil
  std::exception_ptr fault_;
  bool stop_ = false;
  bool running_ = false;  // an item runs now (on the stream's thread or a waiter)
  std::thread thread_;
};

CpuStream& cpu(Stream& s) { return static_cast<CpuStream&>(s); }

class CpuEvent final : public Event {
 public:
  void record(Stream& s) override {
    stream_ = &cpu(s);
    ticket_ = stream_->issued();
  }
  void block(Stream& s) override {
    if (stream_ == nullptr || stream_ == &s || stream_->reached(ticket_)) return;
    CpuStream& waiter = cpu(s);
    if (!waiter.async()) {
      stream_->waitFor(ticket_);  // the caller is the waiter's worker
      return;
    }
    waiter.enqueue([src = stream_, t = ticket_] { src->waitFor(t); });
  }
  void synchronize() override {
    if (stream_ != nullptr) stream_->waitFor(ticket_);
  }

 private:
  CpuStream* stream_ = nullptr;
  uint64_t ticket_ = 0;
};

class CpuWorkerDevice final : public Device {
 public:
  CpuWorkerDevice(int index, int threads)
      : Device(DeviceKind::CpuWorker, index, c10::Device(c10::kCPU)),
        threads_(threads),
        compute_("compute", /*async=*/false, &cancelled_) {}

  Stream& compute() override { return compute_; }
  Stream& tx(int peer) override { return tx_.at(*this, peer); }
  void connectTo(Device& peer) override {
    checkSameKind(*this, peer);
    tx_.connect(peer.index(), [&] {
      return std::make_unique<CpuStream>(c10::str("tx->", peer.index()), /*async=*/true,
                                         &cancelled_, describe());
    });
  }
  std::unique_ptr<Event> newEvent() override { return std::make_unique<CpuEvent>(); }

  void enqueue(Stream& s, std::function<void()> fn) override { cpu(s).enqueue(std::move(fn)); }
  void enqueueCopy(Stream& s, std::function<void()> fn, int64_t bytes) override {
    cpu(s).enqueue(std::move(fn), bytes <= kCopyHereBytes);
  }

  c10::IValue place(const c10::IValue& v) override {
    if (v.isTensor() && v.toTensor().defined() && !v.toTensor().device().is_cpu()) {
      return v.toTensor().to(c10::Device(c10::kCPU));
    }
    return v;
  }
  c10::IValue copyTo(const c10::IValue& v, Device&) override {
    if (v.isTensor() && v.toTensor().defined()) return v.toTensor().clone();
    return v;
  }
  void recordStream(const c10::IValue&, Stream&) override {}

  void enterWorker() override {
    // Let ATen initialise this thread's OpenMP settings first (its lazy init
    // would otherwise overwrite ours on the first parallel op), then set ours.
    (void)at::get_num_threads();
    at::set_num_threads(threads_);
  }
  void acceptFromCaller() override {}
  void handToCaller(const c10::IValue&) override {}
  void finishStep() override { synchronize(); }
  void joinCaller() override {}
  void synchronize() override {
    for (auto& [peer, s] : tx_) s->waitFor(s->issued());
  }

  void cancel() override {
    cancelled_.store(true);
    compute_.wake();
    for (auto& [peer, s] : tx_) s->wake();
  }
  void reset() override {
    for (auto& [peer, s] : tx_) s->drain();
    compute_.drain();
    cancelled_.store(false);
  }

 private:
  int threads_;
  std::atomic<bool> cancelled_{false};
  CpuStream compute_;
  PeerStreams<CpuStream> tx_{"tx", "to"};  // by destination
};

}  // namespace

std::vector<std::unique_ptr<Device>> createCpuWorkerDevices(const DeviceMap& map) {
  const int n = static_cast<int>(map.devices.size());
  const int threads = map.threads_per_device > 0 ? map.threads_per_device
                                                 : std::max(1, at::get_num_threads() / n);
  std::vector<std::unique_ptr<Device>> out;
  for (int i = 0; i < n; ++i) out.push_back(std::make_unique<CpuWorkerDevice>(i, threads));
  return out;
}

}  // namespace modelpar::runtime
