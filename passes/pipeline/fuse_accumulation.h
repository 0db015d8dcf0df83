// Pass `fuse-accumulation`: a micro-batched step sums each weight's gradient
// over the micro-batches (`microbatch`: acc_k = add(acc_{k-1}, g_k)), and a
// Linear's weight gradient g_k is a matrix product, as AOTAutograd writes it
// t(t(mm(t(dy_k), x_k))). This pass folds the product into the sum:
//
//   %g.mbk = aten::mm(%a, %b)                     (through any aten::t chain)
//   %acc.k = aten::add.Tensor(%acc.k-1, %g.mbk)
//     ->
//   %acc.k = aten::addmm(%acc.k-1, %a, %b)        (an odd chain: t(b), t(a))
//
// Why: on CPU the product then writes into the sum's own output (BLAS with
// beta = 1) instead of a temporary that the add reads back: one 1 MiB
// allocation and one pass over it fewer per weight and micro-batch (measured
// on 2 vCPUs, 8 micro-batches of a 512x512 weight, 64 rows each: 4.3-4.9 ms
// of products and adds -> 3.4-3.6 ms, the sums equal to the last bit).
// torch's own pipelines accumulate into `.grad` in place, so without this a
// modelpar pipeline paid more for its sums than theirs.
//
// Which adds. `aten::add.Tensor(x, y)` with no alpha (or alpha 1) where
// one operand (the second tried first) is the output of `aten::mm(a, b)`,
// possibly through `aten::t` nodes, every value of that chain read by this
// add alone and not a graph output; the other operand, the add's output and
// the product all of one type (dtype and shape: no broadcasting, no type
// promotion); the chain's nodes of the add's own layer, phase, device and
// micro-batch, so no work moves to another stage or slot of the schedule
// (the sum of two layers' gradients at a skip connection stays an add). The
// add's annotations go to the addmm; its cost, when the product and the add both have one, is their sum
// (the same GEMM plus one read of the sum). Any graph, not only a
// micro-batched one: planPipeline runs it after `microbatch`.
//
// Guarantees: a new graph computing the same values up to the rounding of
// one sum (the caller's is unchanged); the folded mm and t nodes are gone;
// names of surviving values unchanged; new t nodes named `<operand>.t`.
// Example: in the golden file tests/passes/golden/fuse_accumulation_mlp.txt.
#pragma once

#include <cstdint>
#include <string_view>

#include "ir/graph.h"

namespace modelpar::passes {

inline constexpr std::string_view kFuseAccumulationPassId = "fuse-accumulation";

struct FusedAccumulation {
  ir::Graph graph;
  int64_t num_fused = 0;  ///< adds that became addmm
};

FusedAccumulation fuseAccumulation(const ir::Graph& g);

}  // namespace modelpar::passes
