// CUDA devices and the Executor on GPUs: dedicated streams, event ordering
// between compute and transmit streams, recordStream, and multi-device plans
// on one GPU (logical devices sharing it) and on several. Every test skips
// without CUDA support or without a GPU; scripts/check_cuda_build.sh keeps
// this file compiling against the CUDA wheel.
#include <gtest/gtest.h>

#include <fstream>
#include <sstream>
#include <string>

#include "runtime/device.h"
#include "runtime/executor.h"
#include "tests/support/read_file.h"

#ifdef MODELPAR_WITH_CUDA
#include <ATen/core/Tensor.h>
#include <ATen/cuda/Sleep.h>
#include <ATen/ops/allclose.h>
#include <ATen/ops/empty.h>
#include <ATen/ops/equal.h>
#include <ATen/ops/rand.h>
#include <ATen/ops/randn.h>
#include <ATen/ops/zeros.h>
#include <c10/cuda/CUDAGuard.h>
#include <c10/cuda/CUDAStream.h>

#include "ir/parser.h"
#include "runtime/program_interpreter.h"
#endif

namespace modelpar::runtime {
namespace {

#define SKIP_WITHOUT_GPU()                                                        \
  do {                                                                            \
    if (!cudaDevicesBuilt()) GTEST_SKIP() << "built without CUDA devices";        \
    if (cudaDeviceCount() == 0) GTEST_SKIP() << "no GPU visible";                 \
  } while (false)

#ifdef MODELPAR_WITH_CUDA

constexpr int64_t kLongSpin = 200'000'000;  // cycles: ~0.1 s on a ~2 GHz GPU

c10::cuda::CUDAStream cudaOf(const Stream& s) { return c10::cuda::CUDAStream(c10::cuda::CUDAStream::UNCHECKED, s.native()); }

using modelpar::testing::readFile;

at::TensorOptions gpu() { return at::TensorOptions().device(c10::Device("cuda:0")); }

struct TwoOnOneGpu {
  std::vector<std::unique_ptr<Device>> devs = createDevices(DeviceMap::parse("cuda:0", 2));
  Device& a = *devs[0];
  Device& b = *devs[1];
  TwoOnOneGpu() {
    a.connectTo(b);
    b.connectTo(a);
  }
};

TEST(CudaDevice, StreamsAreDedicatedNotFromThePool) {
  SKIP_WITHOUT_GPU();
  TwoOnOneGpu p;
  std::vector<c10::Stream> ours = {p.a.compute().native(), p.b.compute().native(),
                                   p.a.tx(1).native(), p.b.tx(0).native()};
  for (size_t i = 0; i < ours.size(); ++i) {
    EXPECT_NE(ours[i], c10::cuda::getDefaultCUDAStream(0).unwrap());
    for (size_t j = 0; j < i; ++j) EXPECT_NE(ours[i], ours[j]);
  }
  for (int k = 0; k < 64; ++k) {  // more than the pool holds, both priorities
    const c10::Stream pooled = c10::cuda::getStreamFromPool(k % 2 == 0, 0).unwrap();
    for (const c10::Stream& s : ours) EXPECT_NE(pooled, s);
  }
}

// compute: [spin][x.fill_(1)] ready.record
// tx:                          ready.block [y = x.clone()] done.record
TEST(CudaDevice, TransmitStreamWaitsForComputeThroughAnEvent) {
  SKIP_WITHOUT_GPU();
  TwoOnOneGpu p;
  c10::cuda::CUDAStreamGuard on_compute(cudaOf(p.a.compute()));
  at::Tensor x = at::zeros({1 << 20}, gpu());
  at::cuda::sleep(kLongSpin);
  x.fill_(1);
  std::unique_ptr<Event> ready = p.a.newEvent(), done = p.a.newEvent();
  ready->record(p.a.compute());
  ready->block(p.a.tx(1));
  at::Tensor y;
  p.a.enqueue(p.a.tx(1), [&] { y = x.clone(); });
  done->record(p.a.tx(1));
  done->synchronize();
  EXPECT_EQ(y.sum().item<float>(), static_cast<float>(1 << 20));
}

// A block used on the tx stream and freed must not be handed out again on
// the compute stream while the tx stream still works on it. Checked on the
// values, not on the addresses: with cudaMallocAsync (PYTORCH_CUDA_ALLOC_CONF
// backend:cudaMallocAsync) the freed block may come back at once, and that is
// safe because its reuse is ordered after the recorded stream's work; with
// the native allocator it comes back only once that work is done. Either way
// a write on compute to the new tensor must land after the tx stream's add.
TEST(CudaDevice, RecordStreamKeepsFreedMemoryFromReuseWhileInFlight) {
  SKIP_WITHOUT_GPU();
  TwoOnOneGpu p;
  c10::cuda::CUDAStreamGuard on_compute(cudaOf(p.a.compute()));
  // Returns how many elements of the new tensor the tx stream's late add hit.
  auto hitByTheLateAdd = [&](bool record) {
    at::Tensor t = at::zeros({1 << 20}, gpu());
    p.a.synchronize();
    p.a.enqueue(p.a.tx(1), [&] {
      at::cuda::sleep(kLongSpin);
      t.add_(1);
    });
    if (record) p.a.recordStream(t, p.a.tx(1));
    t.reset();
    at::Tensor t2 = at::empty({1 << 20}, gpu());
    t2.fill_(7);
    p.a.synchronize();
    return t2.ne(7).sum().item<int64_t>();
  };
  EXPECT_EQ(hitByTheLateAdd(/*record=*/true), 0);
  EXPECT_EQ(hitByTheLateAdd(/*record=*/false), 1 << 20) << "control: without recordStream the block is reused early";
}

TEST(CudaExecutor, MlpPipelineOnOneGpuHostingTwoLogicalDevices) {
  SKIP_WITHOUT_GPU();
  ir::Program p = ir::parseProgram(readFile(MODELPAR_SOURCE_DIR "/examples/ir/mlp_pipeline_2dev.txt"));
  std::vector<c10::IValue> in = {at::randn({8, 16}, gpu()), at::randn({8, 4}, gpu()),
                                 at::randn({16, 32}, gpu()), at::randn({32, 4}, gpu())};
  std::vector<c10::IValue> want = ProgramInterpreter(p).run(in);
  Executor ex(p, DeviceMap::parse("cuda:0", 2), ExecutorOptions{.record_trace = true});
  for (int k = 0; k < 5; ++k) {
    std::vector<c10::IValue> out = ex.run(in);
    ASSERT_EQ(out.size(), want.size());
    for (size_t i = 0; i < out.size(); ++i) {
      EXPECT_TRUE(out[i].toTensor().is_cuda());
      EXPECT_TRUE(at::allclose(out[i].toTensor(), want[i].toTensor(), 1e-5, 1e-6)) << i;
    }
  }
  EXPECT_FALSE(ex.lastTrace().empty());
}

// The 2-device MLP pipeline on `map` from CPU inputs equals the interpreter.
void expectMlpPipelineMatchesInterpreter(const DeviceMap& map) {
  ir::Program p = ir::parseProgram(readFile(MODELPAR_SOURCE_DIR "/examples/ir/mlp_pipeline_2dev.txt"));
  std::vector<c10::IValue> in = {at::randn({8, 16}), at::randn({8, 4}), at::randn({16, 32}),
                                 at::randn({32, 4})};
  std::vector<c10::IValue> want = ProgramInterpreter(p).run(in);
  Executor ex(p, map);
  std::vector<c10::IValue> out = ex.run(in);
  for (size_t i = 0; i < out.size(); ++i) {
    EXPECT_TRUE(at::allclose(out[i].toTensor().cpu(), want[i].toTensor(), 1e-4, 1e-5)) << i;
  }
}

TEST(CudaExecutor, CpuInputsAreMovedToTheirLogicalDevice) {
  SKIP_WITHOUT_GPU();
  expectMlpPipelineMatchesInterpreter(DeviceMap::parse("cuda:0", 2));
}

TEST(CudaExecutor, TwoGpus) {
  SKIP_WITHOUT_GPU();
  if (cudaDeviceCount() < 2) GTEST_SKIP() << "needs 2 GPUs";
  expectMlpPipelineMatchesInterpreter(DeviceMap::parse("cuda", 2));
}

TEST(CudaExecutor, FailingOpIsReportedWithDeviceAndInstruction) {
  SKIP_WITHOUT_GPU();
  // aten::mm of mismatched shapes fails inside the CUDA kernel's checks.
  ir::Program p = ir::parseProgram(R"(
    program devices=2
    graph @g(%x: f32[4, 8] input {device=0}, %w: f32[4, 8] input {device=1}) {
      %h: f32[4, 8] = aten::relu(%x) {device=0}
      %y: f32[4, 8] = aten::mm(%h, %w) {device=1}
      return %y
    }
    device 0 {
      run %h
      send %h -> 1
    }
    device 1 {
      recv %h <- 0
      run %y
    }
  )");
  Executor ex(p, DeviceMap::parse("cuda:0", 2));
  try {
    ex.run({at::randn({4, 8}, gpu()), at::randn({4, 8}, gpu())});
    ADD_FAILURE() << "did not throw";
  } catch (const InstructionError& e) {
    EXPECT_EQ(e.device(), 1);
    EXPECT_EQ(e.instruction(), 1u);
  }
}

// --- graph replay (Replay::Graphs; Note [Graph replay]) ----------------------

ExecutorOptions graphReplay() {
  ExecutorOptions o;
  o.replay = Replay::Graphs;
  o.warmup_steps = 1;
  return o;
}

// Two logical devices on one GPU, forward + backward + update: three graphs
// (device 0 is cut around device 1's), fresh inputs every step so that a
// stale static buffer or a missing cross-graph wait shows.
TEST(CudaGraphReplay, EqualsStreamReplayOnTwoLogicalDevicesOverFiveSteps) {
  SKIP_WITHOUT_GPU();
  ir::Program p = ir::parseProgram(readFile(MODELPAR_SOURCE_DIR "/examples/ir/mlp_pipeline_2dev.txt"));
  Executor streams(p, DeviceMap::parse("cuda:0", 2));
  Executor graphs(p, DeviceMap::parse("cuda:0", 2), graphReplay());
  for (int step = 0; step < 1 + 1 + 5; ++step) {  // warm-up, capture, 5 replays
    std::vector<c10::IValue> in = {at::randn({8, 16}, gpu()), at::randn({8, 4}, gpu()),
                                   at::randn({16, 32}, gpu()), at::randn({32, 4}, gpu())};
    std::vector<c10::IValue> want = streams.run(in);
    std::vector<c10::IValue> got = graphs.run(in);
    ASSERT_EQ(got.size(), want.size());
    for (size_t i = 0; i < got.size(); ++i) {
      EXPECT_TRUE(at::allclose(got[i].toTensor(), want[i].toTensor(), 1e-5, 1e-6))
          << "step " << step << " output " << i;
    }
  }
  ReplayStatus st = graphs.replayStatus();
  EXPECT_TRUE(st.captured) << st.summary;
  EXPECT_EQ(st.graphs, 3u) << st.summary;
}

// RNG ops register their generator state with the capturing graph, and each
// replay advances it: the dropout mask of one replay is not the last one's.
TEST(CudaGraphReplay, DropoutDiffersBetweenReplays) {
  SKIP_WITHOUT_GPU();
  ir::Program p = ir::parseProgram(R"(
    program devices=2
    graph @g(%x: f32[4096] input {device=0}) {
      %h: f32[4096] = aten::relu(%x) {device=0}
      %y: f32[4096], %m: bool[4096] = aten::native_dropout(%h, 0.5, true) {device=1}
      return %y, %m
    }
    device 0 {
      run %h
      send %h -> 1
    }
    device 1 {
      recv %h <- 0
      run %y
    }
  )");
  Executor ex(p, DeviceMap::parse("cuda:0", 2), graphReplay());
  at::Tensor x = at::rand({4096}, gpu()).add(0.5);  // > 0, so relu keeps it
  std::vector<at::Tensor> masks;
  for (int step = 0; step < 5; ++step) {
    std::vector<c10::IValue> out = ex.run({x});
    at::Tensor y = out[0].toTensor(), m = out[1].toTensor();
    EXPECT_TRUE(at::allclose(y, x.mul(m.to(at::kFloat)).mul(2))) << step;
    masks.push_back(m);
  }
  EXPECT_TRUE(ex.replayStatus().captured) << ex.replayStatus().summary;
  for (size_t k = 2; k < masks.size(); ++k) {  // the replays, after warm-up and capture
    EXPECT_FALSE(at::equal(masks[k], masks[k - 1])) << "replay " << k << " repeated the last mask";
  }
}

// Note [Parameters at their own addresses]: the graphs read the weights
// where they live (updated in place between steps, as an optimizer does), and
// a weight passed at a new address re-captures once instead of being read at
// the old one.
TEST(CudaGraphReplay, WeightsAreReadAtTheirOwnAddressesAndAMovedOneReCaptures) {
  SKIP_WITHOUT_GPU();
  ir::Program p = ir::parseProgram(readFile(MODELPAR_SOURCE_DIR "/examples/ir/mlp_pipeline_2dev.txt"));
  std::vector<size_t> weights;
  for (size_t k = 0; k < p.graph().inputs().size(); ++k) {
    if (p.graph().inputs()[k].role != ir::InputRole::Input) weights.push_back(k);
  }
  ASSERT_FALSE(weights.empty());
  Executor streams(p, DeviceMap::parse("cuda:0", 2));
  Executor graphs(p, DeviceMap::parse("cuda:0", 2), graphReplay());
  at::Tensor w1 = at::randn({16, 32}, gpu()), w2 = at::randn({32, 4}, gpu());
  for (int step = 0; step < 6; ++step) {
    if (step == 4) w1 = at::randn({16, 32}, gpu());  // moved: a new tensor
    std::vector<c10::IValue> in = {at::randn({8, 16}, gpu()), at::randn({8, 4}, gpu()), w1, w2};
    std::vector<c10::IValue> want = streams.run(in);
    std::vector<c10::IValue> got = graphs.run(in);
    for (size_t i = 0; i < got.size(); ++i) {
      EXPECT_TRUE(at::allclose(got[i].toTensor(), want[i].toTensor(), 1e-5, 1e-6))
          << "step " << step << " output " << i;
    }
    w1.mul_(0.9);
    w2.mul_(0.9);
  }
  ReplayStatus st = graphs.replayStatus();
  EXPECT_TRUE(st.captured) << st.summary;
  EXPECT_EQ(st.recaptures, 1) << st.summary;
  EXPECT_EQ(st.own_address_inputs, weights.size() - 1) << st.summary;
}

TEST(CudaGraphReplay, UncapturableProgramFallsBackToStreamsAndSaysWhy) {
  SKIP_WITHOUT_GPU();
  ir::Program p = ir::parseProgram(R"(
    program devices=1
    graph @g(%x: f32[8] input) {
      %n: i64[N, 1] = aten::nonzero(%x)
      return %n
    }
    device 0 {
      run %n
    }
  )");
  Executor ex(p, DeviceMap::parse("cuda:0", 1), graphReplay());
  at::Tensor x = at::zeros({8}, gpu());
  x.narrow(0, 0, 3).fill_(1);
  for (int step = 0; step < 3; ++step) EXPECT_EQ(ex.run({x})[0].toTensor().size(0), 3);
  ReplayStatus st = ex.replayStatus();
  EXPECT_FALSE(st.captured);
  EXPECT_NE(st.summary.find("aten::nonzero"), std::string::npos) << st.summary;
}

#else  // !MODELPAR_WITH_CUDA

TEST(CudaDevice, SkippedWithoutCuda) { SKIP_WITHOUT_GPU(); }

#endif

}  // namespace
}  // namespace modelpar::runtime
