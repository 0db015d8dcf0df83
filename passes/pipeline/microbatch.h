// Pass `microbatch`: splits a training step into micro-batches whose
// combined result is the full-batch step (GPipe / torchgpipe, seed 002 §2:
// x = (x_1, ..., x_m), forward F_{i,j} and backward B_{i,j} per micro-batch,
// parameter gradients summed over i).
//
// Terms. The batch symbol S is the symbolic size the user inputs share at
// their batch dimension (`%x: f32[B, 16] input` -> S = B, dim 0). A value is
// *batched* when it depends on a batched input, on the int input named S
// (torch.compile's `%s0: int input`), or on the backward seed. Per
// micro-batch k of size b_k:
//   * every batched node that is not an update node is copied once with
//     `mb=k`: S becomes the constant b_k in its types and in every argument
//     that reads an S int input (named S, or S_<k>: torch.compile passes the
//     size once per input that has it); dimension expressions torch.compile writes
//     (`e_16xs0`) are evaluated when they are products/sums of S and ints;
//   * a batched input is sliced by `aten::narrow(x, dim, start_k, b_k)`
//     (mb=k, the layer of its first reader, phase bwd if that reader is a
//     backward node, as for a tangent input, else fwd);
//   * nodes that read no batched value (weight transposes, ...) stay once,
//     without `mb`; update-phase nodes come after every micro-batch.
// Values leaving the micro-batches (read by update nodes or returned):
//   * with the batch dimension (predictions, input gradients): `aten::cat`
//     of the copies along it (no mb);
//   * the loss: Σ_k w_k·loss_k, and the backward seed of micro-batch k (the
//     `ones_like(loss)` node, or a tangent input) is multiplied by w_k, with
//     w_k = b_k/B for a mean-reduced loss and 1 for a sum. The backward is
//     linear in its seed, so every gradient then equals the full batch's;
//   * a parameter gradient (a backward value without the batch dimension):
//     accumulated in micro-batch order, acc_k = acc_{k-1} + g_k by
//     `aten::add.Tensor` with mb=k, phase bwd and g's layer (it can run on the
//     stage as soon as micro-batch k's backward there is done).
// The combined values keep their original names; copies are `<name>.mb<k>`.
//
// Split rule (torch.chunk's, as torchgpipe scatters): every micro-batch has
// ceil(B/m) samples but the last, which has the rest; so B=10, m=3 gives
// 4,4,2 and B=10, m=4 gives 3,3,3,1. Like torch.chunk this may give fewer
// than m micro-batches (B=10, m=6: five of 2); microbatchSizes() says.
//
// Preconditions: the batch dimension is symbolic (a static size is baked into
// view sizes and the numel mean's backward divides by, so it cannot be
// rewritten exactly); nodes carry `phase` (a graph without phases is treated
// as a forward: its batched outputs are concatenated). Refuses
// (UnsupportedOpError naming the node) what cannot be exact: a value without
// the batch dimension computed from batched data in the forward that is not
// the loss (batch-norm statistics, unless batch_norm = Deferred, below;
// not a mixture-of-experts layer's expert counts that only mark a grouped
// matmul's row groups: Note [Row-group offsets] in microbatch.cpp),
// a loss that is not a weighted sum of its micro-batches' losses, random ops
// (unless allow_random), in-place ops on shared values, sizes derived from
// the batch leaving the micro-batches. Guarantees: the caller's graph is not
// modified; the result verifies; every dimension that is S, or an
// expression of S and integers, is static in it.
//
// Deferred batch norm (batch_norm = BatchNormMode::Deferred): batch norm is
// the exception to micro-batch independence (seed 002 §2, footnote 1);
// torchgpipe's DeferredBatchNorm keeps the running statistics exact.
// A training-mode `aten::_native_batch_norm_legit_functional(x, w, b, rm, rv,
// true, momentum, eps)` (AOTAutograd's form; the backend rewrites
// native_batch_norm into it) is copied per micro-batch: each micro-batch is
// normalised with its own statistics (its out / save_mean / save_rstd are
// per micro-batch, as in torchgpipe). Its new_running_mean / new_running_var
// are instead computed once from the whole batch: with n_k the elements per
// channel of micro-batch k (b_k times the spatial size), N = Σ n_k,
// mean_k = save_mean_k and var_k = save_rstd_k^-2 - eps (the biased variance),
//   M = Σ n_k·mean_k / N,  V = Σ n_k·(var_k + (mean_k - M)^2) / N,
//   new_rm = (1-momentum)·rm + momentum·M,
//   new_rv = (1-momentum)·rv + momentum·V·N/(N-1),
// PyTorch's update for the full batch (unbiased variance in the running
// var). These nodes (`<new_rm>.mb<k>.var`, `<new_rm>.batch_mean`, ...;
// phase fwd, the BN node's layer, no mb) follow the micro-batches; with one
// micro-batch the copy's own outputs are used. Requires x at [S, C, ...]
// with static C and spatial dims, constant training/momentum/eps, shared
// rm/rv, and the new running stats read only after the micro-batches (by
// update nodes, or returned; a node reading them and nothing else per
// micro-batch, such as AOTAutograd's `copy_` back into the buffer, is moved
// after the micro-batches with its readers); save_mean/save_rstd must stay
// inside them.
// Example: microbatch(g, {.microbatches = 4, .batch_size = 32,
//                         .batch_norm = BatchNormMode::Deferred}).
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "ir/graph.h"

namespace modelpar::passes {

inline constexpr std::string_view kMicrobatchPassId = "microbatch";

/// How the loss reduces over the batch: the weight of micro-batch k's loss.
enum class LossReduction : uint8_t {
  Auto,  ///< from the op that reduces over the batch (mean, sum, *_loss reduction=)
  Mean,  ///< w_k = b_k / B
  Sum,   ///< w_k = 1
};

/// What to do with training-mode batch norm (its batch statistics).
enum class BatchNormMode : uint8_t {
  Refuse,    ///< UnsupportedOpError: per-micro-batch statistics are not the batch's
  Deferred,  ///< torchgpipe's DeferredBatchNorm: see the file comment
};

struct MicrobatchOptions {
  /// m >= 1: the number of micro-batches asked for (see the split rule).
  int microbatches = 1;
  /// B, the full batch size (required): the value of the batch symbol.
  std::optional<int64_t> batch_size;
  /// The batch symbol; empty: the symbol the `input` tensors share at their
  /// batch dimension (dim 0 unless batch_dims says otherwise).
  std::string batch_symbol;
  /// Per input name (without '%'): its batch dimension, or -1 for "not
  /// batched". Inputs not listed are batched at their first dimension whose
  /// size is the batch symbol.
  std::vector<std::pair<std::string, int>> batch_dims;
  /// The loss output's value name; empty: the scalar forward output read by
  /// the backward seed (or the only one, with a tangent-input seed).
  std::string loss;
  /// The backward seed's value name (a node output or a graph input); empty:
  /// the `ones_like(loss)` node, else the one scalar input read only by
  /// backward nodes.
  std::string seed;
  LossReduction loss_reduction = LossReduction::Auto;
  /// Allow random ops in the micro-batches (the default, as the pipeline
  /// option's): they then draw per micro-batch, so the result is a valid
  /// step with the full batch's distribution but not its bits (Note [Random
  /// ops per micro-batch] in microbatch.cpp); false refuses them. A
  /// permutation (randperm) per micro-batch is refused either way.
  bool allow_random = true;
  /// Accumulate gradients from the last micro-batch to the first (each add
  /// carries the mb of the gradient it adds), the order GPipe's backwards
  /// run in; false: first to last (1F1B). A schedule needs the order its
  /// backwards run in, or the adds would wait on a later task.
  bool accumulate_in_reverse = false;
  /// Training-mode batch norm: refused (default), or deferred (each
  /// micro-batch normalised with its own statistics, running statistics
  /// updated once from the whole batch's; see the file comment).
  BatchNormMode batch_norm = BatchNormMode::Refuse;
  /// The per-op overhead inside a node's profiled time (a time measured on
  /// the device, applyProfile), which every micro-batch's copy pays whole:
  /// a copy of a batched node gets launch + (time - launch) * b_k / B
  /// (0: time * b_k / B).
  double launch_overhead_us = 0.0;
};

/// The micro-batch sizes the split rule gives for batch b and m micro-batches
/// (torch.chunk's). Throws ConfigError when m < 1, b < 1 or m > b.
std::vector<int64_t> microbatchSizes(int64_t batch, int microbatches);

/// Returns the micro-batched copy of g (see the file comment). Throws
/// ConfigError for bad options or a static batch dimension, and
/// UnsupportedOpError where the split cannot equal the full batch.
ir::Graph microbatch(const ir::Graph& g, const MicrobatchOptions& options);

/// Parses "auto" | "mean" | "sum"; ConfigError otherwise.
LossReduction parseLossReduction(std::string_view s);

/// Parses "refuse" | "deferred"; ConfigError otherwise.
BatchNormMode parseBatchNormMode(std::string_view s);

}  // namespace modelpar::passes
