// How the rank executor puts a value on the wire (Note [Rank transfers] in
// rank_executor.cpp): one packed message when the IR type fixes its size,
// else a header (sizes, strides) and the data.
#pragma once

#include <cstdint>
#include <optional>
#include <vector>

#include <ATen/core/Tensor.h>
#include <ATen/core/ivalue.h>
#include <c10/core/Device.h>

#include "ir/types.h"

namespace modelpar::runtime {

/// Bytes of the one message carrying a value of `t` (the strides, padded to
/// 16 bytes, then the data), or nullopt when a dimension is symbolic.
/// Scalars (int, float, bool): 8.
std::optional<int64_t> packedBytes(const ir::Type& t);

/// The packed message of `v` (of type `t`, with packedBytes(t)): a uint8
/// tensor on `device`. A dense tensor keeps its strides; an overlapping one
/// (expanded) is packed contiguous.
at::Tensor pack(const c10::IValue& v, const ir::Type& t, c10::Device device);

/// The value a packed message holds; a tensor is a view into `message`.
c10::IValue unpack(const at::Tensor& message, const ir::Type& t);

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
