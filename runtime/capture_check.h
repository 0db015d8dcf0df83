// Capturability analysis for CUDA Graph replay: the reasons a Program on a
// device map cannot be captured, each naming the instruction at fault, and
// the graph inputs a step writes in place. Pure: reads the Program, the map
// and operator schemas (c10 dispatcher), runs nothing and needs no GPU, so the
// CUDA answer is tested on CPU by passing a CUDA map (DeviceMap::parse works
// without CUDA). The Executor asks it before capturing (Replay::Graphs) and
// falls back to stream replay when the list is not empty.
//
// What cannot be captured (a CUDA graph replays fixed kernels on fixed
// addresses; PyTorch's capture rules, pytorch-internals.md §5.4):
//  - CPU worker devices: graph replay is CUDA-only (the twin runs the same
//    static-buffer protocol on the stream path).
//  - operators PyTorch tags `data_dependent_output` (they read device data on
//    the host: _local_scalar_dense, item, equal, is_nonzero, ...) or
//    `dynamic_output_shape` (the output size depends on the data: nonzero,
//    unique, masked_select, repeat_interleave.Tensor, ...). The tags are the
//    ones Dynamo and FakeTensor use for the same question, so the list follows
//    PyTorch instead of being kept here. Also aten::index.Tensor with a bool
//    index (a mask: the output size is the number of true elements).
//  - symbolic shapes (a graph input or an op output with a named dimension):
//    a replay has the capture's sizes baked in.
//  - CPU tensors in a CUDA program: an op with a `device("cpu")` argument
//    (factories, _to_copy); a capture records device work only, and copies
//    between CPU and CUDA are refused during capture.
//  - sends between logical devices on different GPUs: at::cuda::CUDAGraph
//    captures one GPU (CUDAGraph.h, capture_dev_).
#pragma once

#include <string>
#include <vector>

#include "ir/program.h"
#include "runtime/device.h"

namespace modelpar::runtime {

/// One reason a program cannot be captured.
struct CaptureIssue {
  int device = -1;        // the logical device; -1: the whole map or program
  int64_t instruction = -1;  // index in the device's list; -1: none (an input, the map)
  /// `device 1, instruction 3 (run %n, aten::nonzero): its output shape depends
  /// on the data (tag dynamic_output_shape)`.
  std::string what;
};

/// Every reason `p` on `map` cannot be captured into CUDA graphs, in device
/// then instruction order; empty when it can. Operators the dispatcher does
/// not know are skipped (the Executor reports them when it resolves them).
std::vector<CaptureIssue> captureIssues(const ir::Program& p, const DeviceMap& map);

/// The first `limit` issues joined with "; " and "(+N more)".
std::string describe(const std::vector<CaptureIssue>& issues, size_t limit = 3);

/// Indices of the graph inputs some instruction writes in place, directly or
/// through a view (alias analysis on the schemas' alias annotations: a
/// `Tensor(a)` output of a `Tensor(a)` argument aliases it, a `Tensor(a!)`
/// argument is written). Graph replay copies these back to the caller's
/// tensors after each step, since the step wrote its static copies.
std::vector<size_t> inputsWrittenInPlace(const ir::Program& p);

}  // namespace modelpar::runtime
