// How the rank executor puts a value on the wire (Note [Rank transfers] in
// rank_executor.cpp): one packed message when the IR type fixes its size,
// else a header (sizes, strides) and the data.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include <ATen/core/Tensor.h>
#include <ATen/core/ivalue.h>
#include <c10/core/Device.h>

#include "ir/types.h"

namespace modelpar::runtime {

/// Who sent a message and which value it carries: what the checks of peer
/// data name in their errors (Note [Peer data is checked]).
struct MessageSource {
  /// The instruction receiving it: `modelpar rank 1, instruction 4 (recv %h <- 0)`.
  std::string where;
  int sender = -1;
  /// The IR value, without its '%'.
  std::string value;
};

/// Sizes and strides a frame header announces.
struct FrameLayout {
  std::vector<int64_t> sizes;
  std::vector<int64_t> strides;
};

/// The bytes one received value may take unless RankExecutorOptions says
/// otherwise: 64 GiB.
constexpr int64_t kDefaultMaxMessageBytes = int64_t{1} << 36;

/// Checks a peer's frame header (`2 * rank` int64: sizes, then strides)
/// against the IR type `t` it should describe, before anything is allocated
/// from it: sizes >= 0, equal to the type's fixed sizes, equal where the
/// type names one symbol twice, an element count that neither overflows nor
/// takes more than `max_bytes`; strides >= 0, elements not overlapping, a
/// span of at most `max_bytes`. Throws ExecutionError naming `from` and the
/// fault (Note [Peer data is checked]).
FrameLayout checkFrameHeader(c10::ArrayRef<int64_t> header, const ir::Type& t,
                             const MessageSource& from, int64_t max_bytes = kDefaultMaxMessageBytes);

/// Bytes of the one message carrying a value of `t` (the strides, padded to
/// 16 bytes, then the data), or nullopt when a dimension is symbolic.
/// Scalars (int, float, bool): 8.
std::optional<int64_t> packedBytes(const ir::Type& t);

/// The packed message of `v` (of type `t`, with packedBytes(t)): a uint8
/// tensor on `device`. A dense tensor keeps its strides; an overlapping one
/// (expanded) is packed contiguous.
at::Tensor pack(const c10::IValue& v, const ir::Type& t, c10::Device device);

/// The value a packed message holds; a tensor is a view into `message`.
/// The strides the message carries are checked first (>= 0, elements not
/// overlapping, within the message): ExecutionError naming `from`
/// otherwise (Note [Peer data is checked]).
c10::IValue unpack(const at::Tensor& message, const ir::Type& t, const MessageSource& from = {});

/// The messages of `v` when its size is not fixed, or when it is broadcast:
/// an int64 header (sizes, then strides: its own when its elements do not
/// overlap, gaps included, else contiguous; Note [Framed tensors keep their
/// layout]; none for a 0-d tensor) and the data, contiguous. Scalars: one
/// 1-element int64 (int, bool) or float64 tensor.
std::vector<at::Tensor> frame(const c10::IValue& v, const ir::Type& t, c10::Device device);

/// `v` as the ranks that receive its frame() hold it: a tensor that is a
/// view, starts inside its storage, or has other strides than its frame's
/// is copied into one of its own with the frame's strides; anything else is
/// `v` (Note [Framed tensors keep their layout]).
c10::IValue asFramed(const c10::IValue& v);

/// The strides of a contiguous tensor of these sizes.
std::vector<int64_t> contiguousStrides(c10::IntArrayRef sizes);

}  // namespace modelpar::runtime
