// The batch dimension of a graph with symbolic shapes: which symbol is the
// batch size, where each input carries it, and types with that symbol bound
// to a number. Used by the `microbatch` pass (microbatch.h).
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "ir/graph.h"

namespace modelpar::passes {

/// Where a graph's batch dimension is.
struct BatchSymbol {
  std::string symbol;           ///< e.g. "B" or torch.compile's "s0"
  std::vector<int> input_dim;   ///< per Graph::inputs() index: batch dim, -1 if not batched
  /// The `int` inputs that carry the symbol's value: named after it (`s0`),
  /// or `s0_<k>` (torch.compile passes a size once per input that has it).
  std::vector<ir::ValueId> size_inputs;
  bool isSizeInput(ir::ValueId v) const;
};

/// Finds the batch symbol: `symbol` if given, else the symbol the `input`
/// tensors share at their batch dimension (dim 0, or the one `dims` names).
/// `dims` maps input names to a batch dim, -1 for "not batched". Throws
/// ConfigError when the inputs' batch sizes are static (the message says to
/// write `f32[B, 16]` or capture with dynamic=True), when inputs disagree on
/// the symbol, or when `dims` names an unknown input or a static dim.
BatchSymbol findBatchSymbol(const ir::Graph& g, const std::string& symbol,
                            const std::vector<std::pair<std::string, int>>& dims);

/// Whether a dimension's size involves `symbol`: it is the symbol, or a size
/// expression torch.compile names after it (`e_16xs0` is 16*s0; fx_import.py).
bool dimMentions(const ir::Dim& d, const std::string& symbol);

/// The size of d when `symbol` is `value`: d's static size, `value` for the
/// symbol, the value of an expression of `symbol` and integers joined by
/// + - * (`e_16xs0`, `e_s0p1`); nullopt otherwise. Throws InvalidIrError when a
/// number in d or the result does not fit in int64.
std::optional<int64_t> evalDim(const ir::Dim& d, const std::string& symbol, int64_t value);

/// The first dimension of a tensor type that mentions `symbol`; -1 if none.
int batchDimOf(const ir::Type& t, const std::string& symbol);

/// t with every dimension that evalDim can compute made static.
ir::Type instantiate(const ir::Type& t, const std::string& symbol, int64_t value);

}  // namespace modelpar::passes
