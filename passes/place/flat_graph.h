// A Graph's adjacency and costs in flat arrays, for passes that walk large
// graphs or programs step by step (Nodes and Args are too heavy to chase in
// inner loops).
#pragma once

#include <cstdint>
#include <utility>
#include <vector>

#include "ir/graph.h"

namespace modelpar::passes {

/// Per-node spans are CSR: `x_begin[n] .. x_begin[n+1]` indexes `x`.
struct FlatGraph {
  std::vector<int64_t> dense_bytes;        ///< per value (0 when symbolic)
  /// Per value: what its own storage holds when it allocates one
  /// (op_family.h storageBytes; dense_bytes but for reduced losses).
  std::vector<int64_t> storage_bytes;
  std::vector<ir::ValueId> alias_base;     ///< per value, op_family.h aliasBases
  std::vector<ir::ValueId> storage_root;   ///< per value, op_family.h storageRoots
  std::vector<int32_t> arg_begin, args;    ///< per node: values read, argument order
  std::vector<int32_t> out_begin, outs;    ///< per node: outputs
  std::vector<uint8_t> aliases;            ///< per node: outputs alias the first input
  std::vector<uint8_t> in_place;           ///< per node: op_family.h isInPlaceOp
  /// Per node: the tensors an in-place node writes (its first tensor
  /// argument, or every tensor of a first list argument); empty otherwise.
  std::vector<int32_t> mut_begin, muts;
  std::vector<double> time_us;             ///< per node; NaN without a cost
  std::vector<int64_t> temp_bytes, persistent_bytes;  ///< per node; 0 without a cost

  size_t numNodes() const { return aliases.size(); }
};

FlatGraph flatten(const ir::Graph& g);

/// inPlaceOrderEdges (op_family.h) on a flattened graph.
std::vector<std::pair<ir::NodeId, ir::NodeId>> inPlaceOrderEdges(const FlatGraph& f);

}  // namespace modelpar::passes
