// Output metadata of an operator call without running it on real data: the
// op runs on meta tensors shaped like its arguments. PyTorch has no meta
// kernel in C++ for some ops that training needs (convolution and its
// backward, batch norm, adaptive pooling backward, ...; Python registers
// them in torch/_meta_registrations.py, LibTorch programs lack them): those
// run once on zero-filled CPU tensors of the same shapes. Every answer is
// cached by call signature (op, argument dtypes, shapes, strides, offsets,
// constants), so a repeated step infers nothing anew. Ops whose output shape
// depends on data (nonzero, unique, masked_select, ...) and random ops
// without a rule are refused.
#pragma once

#include <stdexcept>
#include <string>
#include <vector>

#include <ATen/core/dispatch/Dispatcher.h>
#include <ATen/core/ivalue.h>

namespace modelpar::backend {

/// An op the capture cannot record; the kernel falls back to a graph break
/// (or raises UnsupportedOpError in strict mode). what() is the reason.
class CannotCapture : public std::runtime_error {
  using std::runtime_error::runtime_error;
};

/// True for ops whose output shape or value depends on tensor data.
bool isDataDependent(const c10::FunctionSchema& schema);

/// The returns of `op` called with `args` (modelpar tensors, CPU tensors, or
/// constants), as meta tensors (undefined tensors stay undefined). Throws
/// CannotCapture when neither a meta kernel nor the zero-filled CPU run can
/// tell (data-dependent ops, random ops, ops failing on zeros).
std::vector<c10::IValue> inferOutputs(const c10::OperatorHandle& op,
                                      const std::vector<c10::IValue>& args);

}  // namespace modelpar::backend
