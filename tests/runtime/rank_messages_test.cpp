// The rank executor's wire format (runtime/rank_messages.h): what pack()
// writes, unpack() reads back exactly, strides included; frame() is the
// header + data form of values whose size the IR does not fix.
#include "runtime/rank_messages.h"

#include <gtest/gtest.h>

#include <ATen/core/Tensor.h>
#include <ATen/ops/arange.h>
#include <ATen/ops/equal.h>
#include <ATen/ops/randn.h>

#include "ir/error.h"
#include "tests/support/expect_error.h"

namespace modelpar::runtime {
namespace {

ir::Type f32(std::vector<int64_t> sizes) { return ir::Type::tensor(ir::ScalarType::Float32, sizes); }

TEST(RankMessages, PackedSizeIsAlignedHeaderPlusData) {
  // f32[3, 5]: 2 strides = 16 bytes of header, 15 * 4 = 60 bytes of data.
  EXPECT_EQ(packedBytes(f32({3, 5})), 16 + 60);
  // f32[2, 3, 4]: 3 strides = 24 bytes, padded to 32; 24 * 4 = 96.
  EXPECT_EQ(packedBytes(f32({2, 3, 4})), 32 + 96);
  EXPECT_EQ(packedBytes(f32({})), 4);  // 0-d: no header
  EXPECT_EQ(packedBytes(ir::Type::scalar(ir::Type::Kind::Int)), 8);
  ir::Type sym = ir::Type::tensor(ir::ScalarType::Float32, {ir::Dim::symbolic("B"), ir::Dim::fixed(4)});
  EXPECT_FALSE(packedBytes(sym).has_value());
}

TEST(RankMessages, RoundTripKeepsValuesAndStridesOfATransposedTensor) {
  at::Tensor x = at::randn({5, 3}).t();  // [3, 5], strides (1, 3)
  at::Tensor msg = pack(x, f32({3, 5}), c10::kCPU);
  ASSERT_EQ(msg.numel(), *packedBytes(f32({3, 5})));
  at::Tensor y = unpack(msg, f32({3, 5})).toTensor();
  EXPECT_TRUE(at::equal(x, y));
  EXPECT_EQ(y.strides(), x.strides());
}

TEST(RankMessages, AnExpandedTensorArrivesContiguous) {
  at::Tensor x = at::arange(4, at::TensorOptions().dtype(c10::kFloat)).expand({3, 4});  // stride 0
  at::Tensor y = unpack(pack(x, f32({3, 4}), c10::kCPU), f32({3, 4})).toTensor();
  EXPECT_TRUE(at::equal(x, y));
  EXPECT_EQ(y.strides(), (std::vector<int64_t>{4, 1}));
}

TEST(RankMessages, ScalarsRoundTrip) {
  using K = ir::Type::Kind;
  EXPECT_EQ(unpack(pack(int64_t{-7}, ir::Type::scalar(K::Int), c10::kCPU), ir::Type::scalar(K::Int)).toInt(), -7);
  EXPECT_EQ(unpack(pack(2.5, ir::Type::scalar(K::Float), c10::kCPU), ir::Type::scalar(K::Float)).toDouble(), 2.5);
  EXPECT_TRUE(unpack(pack(true, ir::Type::scalar(K::Bool), c10::kCPU), ir::Type::scalar(K::Bool)).toBool());
}

TEST(RankMessages, FrameSendsSizesAndStridesThenContiguousData) {
  at::Tensor x = at::randn({4, 2}).t();  // [2, 4], strides (1, 2)
  std::vector<at::Tensor> m = frame(x, f32({2, 4}), c10::kCPU);
  ASSERT_EQ(m.size(), 2u);
  ASSERT_EQ(m[0].numel(), 4);
  const int64_t* h = m[0].data_ptr<int64_t>();
  EXPECT_EQ(std::vector<int64_t>(h, h + 4), (std::vector<int64_t>{2, 4, 1, 2}));
  EXPECT_TRUE(m[1].is_contiguous());
  EXPECT_TRUE(at::equal(m[1], x));
  EXPECT_EQ(frame(at::randn({}), f32({}), c10::kCPU).size(), 1u);  // 0-d: no header
}

TEST(RankMessages, FrameKeepsTheStridesOfASliceWithGapsButNotOfAnExpandedTensor) {
  // Note [Framed tensors keep their layout]: a KV cache's sliding window.
  at::Tensor x = at::randn({2, 2, 8, 8}).narrow(2, 1, 7);  // [2, 2, 7, 8], strides (128, 64, 8, 1)
  std::vector<at::Tensor> m = frame(x, f32({2, 2, 7, 8}), c10::kCPU);
  ASSERT_EQ(m.size(), 2u);
  const int64_t* h = m[0].data_ptr<int64_t>();
  EXPECT_EQ(std::vector<int64_t>(h, h + 8), (std::vector<int64_t>{2, 2, 7, 8, 128, 64, 8, 1}));
  EXPECT_TRUE(at::equal(m[1], x));
  // The holder's own copy: the same layout, not a view (Dynamo traces a view's base).
  at::Tensor mine = asFramed(x).toTensor();
  EXPECT_TRUE(x.is_view());
  EXPECT_FALSE(mine.is_view());
  EXPECT_EQ(mine.strides(), x.strides());
  EXPECT_EQ(mine.storage_offset(), 0);
  EXPECT_TRUE(at::equal(mine, x));
  at::Tensor fresh = at::randn({3, 4});
  EXPECT_TRUE(asFramed(fresh).toTensor().is_same(fresh));  // nothing to copy
  // Overlapping elements (stride 0) cannot be laid out again: contiguous.
  at::Tensor e = at::arange(4, at::TensorOptions().dtype(c10::kFloat)).expand({3, 4});
  at::Tensor he = frame(e, f32({3, 4}), c10::kCPU)[0];
  EXPECT_EQ(std::vector<int64_t>(he.data_ptr<int64_t>(), he.data_ptr<int64_t>() + 4),
            (std::vector<int64_t>{3, 4, 4, 1}));
  // A dim of size 1 overlaps nothing whatever its stride.
  at::Tensor one = at::randn({8}).as_strided({4, 1}, {2, 1});  // every other element
  at::Tensor ho = frame(one, f32({4, 1}), c10::kCPU)[0];
  EXPECT_EQ(std::vector<int64_t>(ho.data_ptr<int64_t>(), ho.data_ptr<int64_t>() + 4),
            (std::vector<int64_t>{4, 1, 2, 1}));
}

// Note [Peer data is checked]: checkFrameHeader decodes a peer's header
// only when it describes a value of the IR type; no process group needed.
std::string headerError(const std::vector<int64_t>& header, const ir::Type& t) {
  try {
    checkFrameHeader(header, t, MessageSource{"modelpar rank 1, instruction 3 (recv %h <- 0)", 0, "h"},
                     /*max_bytes=*/1024);
  } catch (const ExecutionError& e) {
    return e.what();
  }
  return "";
}

TEST(RankMessages, AFrameHeaderOfTheIrTypeDecodesToItsSizesAndStrides) {
  const ir::Type bb = ir::Type::tensor(ir::ScalarType::Float32, {ir::Dim::symbolic("B"), ir::Dim::fixed(4)});
  const FrameLayout l = checkFrameHeader(std::vector<int64_t>{3, 4, 1, 3}, bb, MessageSource{});
  EXPECT_EQ(l.sizes, (std::vector<int64_t>{3, 4}));
  EXPECT_EQ(l.strides, (std::vector<int64_t>{1, 3}));  // transposed: kept
  // A slice with gaps (Note [Framed tensors keep their layout]) is fine.
  EXPECT_EQ(checkFrameHeader(std::vector<int64_t>{2, 4, 16, 1}, bb, MessageSource{}).strides,
            (std::vector<int64_t>{16, 1}));
  // Empty: any strides span nothing.
  EXPECT_EQ(checkFrameHeader(std::vector<int64_t>{0, 4, 4, 1}, bb, MessageSource{}).sizes,
            (std::vector<int64_t>{0, 4}));
}

TEST(RankMessages, AFrameHeaderThatDoesNotFitTheIrTypeIsAnExecutionErrorNamingTheSender) {
  const ir::Type bb = ir::Type::tensor(ir::ScalarType::Float32, {ir::Dim::symbolic("B"), ir::Dim::symbolic("B")});
  EXPECT_HAS(headerError({3, 5, 5, 1}, bb),
             "modelpar rank 1, instruction 3 (recv %h <- 0): rank 0 sent a header for %h (f32[B, B]) "
             "with size 3 in dim 0 and 5 in dim 1, both B in the IR type");
  EXPECT_HAS(headerError({3, 3, 3}, bb), "3 numbers where a value of rank 2 has 4");
  EXPECT_HAS(headerError({17, 17, 17, 1}, bb), "1156 bytes, more than the 1024 bytes");
  EXPECT_HAS(headerError({15, 15, 1000, 1}, bb), "spanning 14015 elements, more than the 1024 bytes");
  EXPECT_HAS(headerError({2, 2, 1, 0}, bb), "strides (1, 0) overlap");
  EXPECT_HAS(headerError({2, 2, 1, 0}, bb), "every rank must run the same compiled program");
}

}  // namespace
}  // namespace modelpar::runtime
