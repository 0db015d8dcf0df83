// CPU worker devices: transmit streams run their work in order on their own
// thread, events order work across streams and with the worker, and cancel()
// wakes every wait.
#include "runtime/device.h"

#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include <ATen/core/Tensor.h>
#include <ATen/ops/equal.h>
#include <ATen/ops/randn.h>

#include "ir/error.h"
#include "runtime/threads.h"

namespace modelpar::runtime {
namespace {

using namespace std::chrono_literals;

struct Pair {
  std::vector<std::unique_ptr<Device>> devs = createDevices(DeviceMap::cpuWorkers(2, 1));
  Device& a = *devs[0];
  Device& b = *devs[1];
  Pair() { a.connectTo(b); }
};

// A copy stream whose thread the system refuses: a typed error naming the
// device and stream, no half-made stream left behind, and a later connect works.
TEST(CpuDevice, RefusedCopyStreamThreadIsAnExecutionErrorAndLeavesNoStream) {
  std::vector<std::unique_ptr<Device>> devs = createDevices(DeviceMap::cpuWorkers(2, 1));
  const int live = liveThreads();
  failThreadStartForTesting(1);
  try {
    devs[0]->connectTo(*devs[1]);
    ADD_FAILURE() << "connectTo did not throw";
  } catch (const ExecutionError& e) {
    EXPECT_NE(std::string(e.what()).find("cannot start the thread of logical device 0 (cpu worker) "
                                         "copy stream tx->1"),
              std::string::npos)
        << e.what();
  }
  failThreadStartForTesting(0);
  EXPECT_EQ(liveThreads(), live);
  // No entry for the stream that failed; the error is the one internal assert's.
  try {
    devs[0]->tx(1);
    FAIL() << "no throw";
  } catch (const InternalError& e) {
    EXPECT_EQ(std::string(e.what()),
              "modelpar internal error (please report): logical device 0 (cpu worker) has no tx "
              "stream to device 1 (connectTo was not called)");
  }
  devs[0]->connectTo(*devs[1]);
  EXPECT_EQ(liveThreads(), live + 1);
  EXPECT_EQ(devs[0]->tx(1).name(), "tx->1");
}

// Issuing to a transmit stream does not run the work on the issuer; the
// items run in issue order.
TEST(CpuDevice, TransmitStreamRunsWorkInOrderWithoutBlockingTheIssuer) {
  Pair p;
  std::mutex mu;
  std::vector<int> order;
  const auto t0 = std::chrono::steady_clock::now();
  for (int k = 0; k < 5; ++k) {
    p.a.enqueue(p.a.tx(1), [&, k] {
      std::this_thread::sleep_for(10ms);
      std::lock_guard<std::mutex> lock(mu);
      order.push_back(k);
    });
  }
  EXPECT_LT(std::chrono::steady_clock::now() - t0, 10ms);
  p.a.synchronize();
  EXPECT_EQ(order, (std::vector<int>{0, 1, 2, 3, 4}));
}

// Note [Waiters run the copy]: threads that wait on a stream may run its
// queued items, but the items still run one at a time and in issue order.
TEST(CpuDevice, WaitersThatRunQueuedWorkKeepItOrderedAndSerial) {
  Pair p;
  constexpr int kItems = 400;
  std::atomic<int> running{0}, overlaps{0};
  std::vector<int> order;  // written by one item at a time (checked by `running`)
  std::vector<std::unique_ptr<Event>> events;
  for (int k = 0; k < kItems; ++k) {
    p.a.enqueue(p.a.tx(1), [&, k] {
      if (running.fetch_add(1) != 0) ++overlaps;
      order.push_back(k);
      running.fetch_sub(1);
    });
    events.push_back(p.a.newEvent());
    events.back()->record(p.a.tx(1));
  }
  std::vector<std::thread> waiters;
  for (int w = 0; w < 3; ++w) {
    waiters.emplace_back([&, w] {
      for (int k = w; k < kItems; k += 7) events[static_cast<size_t>(k)]->synchronize();
    });
  }
  for (std::thread& t : waiters) t.join();
  p.a.synchronize();
  EXPECT_EQ(overlaps.load(), 0);
  ASSERT_EQ(order.size(), static_cast<size_t>(kItems));
  for (int k = 0; k < kItems; ++k) EXPECT_EQ(order[static_cast<size_t>(k)], k);
}

// Note [A sender copies a small value itself]: a small copy onto an idle
// transmit stream runs on the issuing thread, already finished when
// enqueueCopy returns (its event has happened); a large one, or a small one
// behind queued work, is queued (the issuer does not wait), in issue order.
TEST(CpuDevice, SmallCopyOntoAnIdleStreamRunsOnTheSender) {
  Pair p;
  const std::thread::id me = std::this_thread::get_id();
  std::mutex mu;
  std::vector<std::pair<int, std::thread::id>> ran;
  auto item = [&](int k, std::chrono::milliseconds sleep) {
    return [&, k, sleep] {
      std::this_thread::sleep_for(sleep);
      std::lock_guard<std::mutex> lock(mu);
      ran.emplace_back(k, std::this_thread::get_id());
    };
  };
  std::unique_ptr<Event> done = p.a.newEvent();
  p.a.enqueueCopy(p.a.tx(1), item(0, 0ms), 4);
  done->record(p.a.tx(1));
  ASSERT_EQ(ran.size(), 1u);  // ran before enqueueCopy returned
  EXPECT_EQ(ran[0].second, me);
  done->block(p.a.compute());  // already happened: returns at once
  p.a.enqueueCopy(p.a.tx(1), item(1, 30ms), int64_t{64} << 20);  // large: the thread's
  p.a.enqueueCopy(p.a.tx(1), item(2, 0ms), 4);                   // behind it: queued
  {
    std::lock_guard<std::mutex> lock(mu);
    EXPECT_EQ(ran.size(), 1u);
  }
  p.a.synchronize();
  ASSERT_EQ(ran.size(), 3u);
  EXPECT_EQ(ran[1].first, 1);
  EXPECT_EQ(ran[2].first, 2);  // (synchronize may run them itself: Note [Waiters run the copy])
}

// tx:      [sleep 50 ms; flag = 1] (done recorded)
// compute:                         done.block -> reads flag
TEST(CpuDevice, ComputeWaitsForAnEventRecordedOnTransmitStream) {
  Pair p;
  std::atomic<int> flag{0};
  p.a.enqueue(p.a.tx(1), [&] {
    std::this_thread::sleep_for(50ms);
    flag = 1;
  });
  std::unique_ptr<Event> done = p.a.newEvent();
  done->record(p.a.tx(1));
  done->block(p.b.compute());  // blocks this thread: it plays b's worker
  EXPECT_EQ(flag.load(), 1);
}

// An event blocked onto a transmit stream delays that stream's later work,
// not the thread that issued the block.
TEST(CpuDevice, BlockOntoTransmitStreamDoesNotBlockTheIssuer) {
  std::vector<std::unique_ptr<Device>> devs = createDevices(DeviceMap::cpuWorkers(3, 1));
  devs[0]->connectTo(*devs[2]);
  devs[1]->connectTo(*devs[2]);
  std::atomic<int> step{0};
  devs[1]->enqueue(devs[1]->tx(2), [&] {
    std::this_thread::sleep_for(50ms);
    step = 1;
  });
  std::unique_ptr<Event> e = devs[1]->newEvent();
  e->record(devs[1]->tx(2));
  const auto t0 = std::chrono::steady_clock::now();
  e->block(devs[0]->tx(2));
  EXPECT_LT(std::chrono::steady_clock::now() - t0, 40ms);
  int seen = -1;
  devs[0]->enqueue(devs[0]->tx(2), [&] { seen = step.load(); });
  devs[0]->synchronize();
  EXPECT_EQ(seen, 1);
}

TEST(CpuDevice, CancelWakesAWaitAndResetRearms) {
  Pair p;
  std::atomic<bool> release{false}, started{false};
  p.a.enqueue(p.a.tx(1), [&] {
    started = true;
    while (!release) std::this_thread::sleep_for(1ms);
  });
  // The stream's own thread runs the item (a waiter that found it still
  // queued would run it itself: Note [Waiters run the copy]).
  while (!started) std::this_thread::sleep_for(1ms);
  std::unique_ptr<Event> e = p.a.newEvent();
  e->record(p.a.tx(1));
  std::thread canceller([&] {
    std::this_thread::sleep_for(20ms);
    p.a.cancel();
  });
  EXPECT_THROW(e->synchronize(), Cancelled);
  canceller.join();
  release = true;
  p.a.reset();
  int ran = 0;
  p.a.enqueue(p.a.tx(1), [&] { ran = 1; });
  p.a.synchronize();
  EXPECT_EQ(ran, 1);
}

TEST(CpuDevice, CopyToGivesTheReceiverItsOwnTensor) {
  Pair p;
  at::Tensor x = at::randn({8});
  c10::IValue y = p.a.copyTo(x, p.b);
  EXPECT_TRUE(at::equal(y.toTensor(), x));
  EXPECT_NE(y.toTensor().data_ptr(), x.data_ptr());
  EXPECT_EQ(p.a.copyTo(c10::IValue(int64_t{3}), p.b).toInt(), 3);
}

}  // namespace
}  // namespace modelpar::runtime
