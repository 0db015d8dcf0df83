// Measured memory (Note [Measured memory], runtime/memory_meter.h): the
// meter counts a storage once however many values view it, and the executor
// reports each device's peak of distinct storage bytes, computed by hand here.
#include "runtime/memory_meter.h"

#include <gtest/gtest.h>

#include <ATen/core/Tensor.h>
#include <ATen/ops/randn.h>
#include <ATen/ops/zeros.h>

#include "ir/error.h"
#include "ir/parser.h"
#include "runtime/executor.h"
#include "tests/support/expect_error.h"

namespace modelpar::runtime {
namespace {

using modelpar::testing::messageOf;

TEST(StorageMeter, CountsAStorageOnceHoweverManyValuesViewIt) {
  detail::StorageMeter m;
  at::Tensor a = at::zeros({4, 8});  // 128 bytes
  m.add(a);
  m.add(a.t());                      // a view: the same storage
  m.add(a.narrow(0, 1, 2));
  EXPECT_EQ(m.bytes(), 128);
  m.remove(a);
  m.remove(a.t());
  EXPECT_EQ(m.bytes(), 128);         // the narrow view still holds it
  m.remove(a.narrow(0, 1, 2));
  EXPECT_EQ(m.bytes(), 0);
}

TEST(StorageMeter, CountsTensorListsAndIgnoresNonTensors) {
  detail::StorageMeter m;
  at::Tensor a = at::zeros({2}), b = at::zeros({3});  // 8 + 12 bytes
  c10::IValue list(std::vector<at::Tensor>{a, b, a});
  m.add(list);
  m.add(c10::IValue(int64_t{7}));
  m.add(c10::IValue());
  EXPECT_EQ(m.bytes(), 20);
  m.remove(list);
  EXPECT_EQ(m.bytes(), 0);
}

TEST(StorageMeter, PeakIsTheMostAfterAnyMarkAndRemembersWhere) {
  detail::StorageMeter m;
  at::Tensor a = at::zeros({4}), b = at::zeros({8});  // 16, 32 bytes
  m.add(a);
  m.mark(-1);
  m.add(b);
  m.mark(0);  // 48
  m.remove(b);
  m.mark(1);  // 16
  EXPECT_EQ(m.result().start_bytes, 16);
  EXPECT_EQ(m.result().peak_bytes, 48);
  EXPECT_EQ(m.result().peak_instruction, 0);
  EXPECT_EQ(m.result().end_bytes, 16);
}

// Two devices. Device 0 computes a, a view at of it, b (sent), and s; it
// frees a while the view at still holds a's storage:
//
//   x (128 B, dev 0) -> relu -> a (128) -> t -> at (view of a)
//                               a -> mul -> b (128) --send--> dev 1
//                               at, b -> mm -> s (8x8: 256)
//   w (8x8 param: 256, dev 1);  b', w -> mm -> y (128) -> relu_ (in place: y's storage)
//
// Device 0, bytes held after each instruction (x = 128 from the start):
//   0 run a      256          4 free a      384 (at keeps a's storage)
//   1 run at     256 (view)   5 run s       640  <- peak
//   2 run b      384          6 free at     512 (a's storage goes)
//   3 send b     384          7 free b      384 (x + s, the output)
// Device 1 (w = 256 from the start):
//   0 recv b     384          2 run z       512 (in place: y's storage)
//   1 run y      512 <- peak  3 free b      384 (w + y)
constexpr const char* kProgram = R"(
  program devices=2
  graph @meter(%x: f32[4, 8] input {device=0}, %w: f32[8, 8] param {device=1}) {
    %a: f32[4, 8] = aten::relu(%x) {device=0}
    %at: f32[8, 4] = aten::t(%a) {device=0}
    %b: f32[4, 8] = aten::mul.Scalar(%a, 2.0) {device=0}
    %s: f32[8, 8] = aten::mm(%at, %b) {device=0}
    %y: f32[4, 8] = aten::mm(%b, %w) {device=1}
    %z: f32[4, 8] = aten::relu_(%y) {device=1}
    return %s, %z
  }
  device 0 { run %a  run %at  run %b  send %b -> 1  free %a  run %s  free %at  free %b }
  device 1 { recv %b <- 0  run %y  run %z  free %b }
)";

TEST(ExecutorMemory, PeakPerDeviceEqualsTheHandCount) {
  ir::Program p = ir::parseProgram(kProgram);
  Executor ex(p, DeviceMap::cpuWorkers(2, 1), ExecutorOptions{.measure_memory = true});
  EXPECT_EQ(ex.memoryReport().steps, 0);
  EXPECT_TRUE(ex.memoryReport().devices.empty());
  for (int step = 1; step <= 2; ++step) {  // every step measured afresh
    ex.run({at::randn({4, 8}), at::randn({8, 8})});
    MemoryReport r = ex.memoryReport();
    EXPECT_EQ(r.steps, step);
    ASSERT_EQ(r.devices.size(), 2u);
    EXPECT_EQ(r.devices[0].start_bytes, 128);
    EXPECT_EQ(r.devices[0].peak_bytes, 640);
    EXPECT_EQ(r.devices[0].peak_instruction, 5);
    EXPECT_EQ(r.devices[0].end_bytes, 384);
    EXPECT_EQ(r.devices[1].start_bytes, 256);
    EXPECT_EQ(r.devices[1].peak_bytes, 512);
    EXPECT_EQ(r.devices[1].peak_instruction, 1);
    EXPECT_EQ(r.devices[1].end_bytes, 384);
  }
}

// A view of an input (narrow) shares the input's storage: no new bytes; a
// second device that never receives anything holds only its input.
TEST(ExecutorMemory, ViewsOfAnInputAddNothing) {
  ir::Program p = ir::parseProgram(R"(
    program devices=2
    graph @views(%x: f32[8, 4] input {device=0}, %y: f32[2] input {device=1}) {
      %lo: f32[4, 4] = aten::narrow(%x, 0, 0, 4) {device=0}
      %hi: f32[4, 4] = aten::narrow(%x, 0, 4, 4) {device=0}
      %s: f32[4, 4] = aten::add.Tensor(%lo, %hi) {device=0}
      %n: f32[2] = aten::neg(%y) {device=1}
      return %s, %n
    }
    device 0 { run %lo  run %hi  run %s  free %lo  free %hi }
    device 1 { run %n }
  )");
  Executor ex(p, DeviceMap::cpuWorkers(2, 1), ExecutorOptions{.measure_memory = true});
  ex.run({at::randn({8, 4}), at::randn({2})});
  MemoryReport r = ex.memoryReport();
  EXPECT_EQ(r.devices[0].peak_bytes, 128 + 64);  // x, then s
  EXPECT_EQ(r.devices[0].peak_instruction, 2);
  EXPECT_EQ(r.devices[1].peak_bytes, 8 + 8);
}

TEST(ExecutorMemory, ReportWithoutMeasureMemoryIsAConfigError) {
  Executor ex(ir::parseProgram(kProgram), DeviceMap::cpuWorkers(2, 1));
  EXPECT_HAS(messageOf<ConfigError>([&] { ex.memoryReport(); }), "measure_memory");
}

}  // namespace
}  // namespace modelpar::runtime
