// Pass `coarsen`: groups the nodes of a graph into placement units, Baechi's
// preprocessing (algorithms.md §1.4) on top of layer attribution.
//
// Terms. A colocation group is a set of nodes that must share a device; a
// unit is a set of nodes of one group that the placers treat as one task.
// Steps:
//   1. Layer groups: nodes with the same non-empty `layer` attribute (every
//      phase: fwd, bwd, recompute, update) form one colocation group; a node
//      without a layer is a group of its own.
//   2. Co-placement: a node whose outputs are read by exactly one other node
//      (and are not graph outputs) joins that consumer's group. Two groups
//      that both carry (different) layer names are only joined when
//      `coplace_across_layers` is set: with layer groups, Baechi's rule would
//      otherwise chain every layer of a sequential inference model into one
//      group and leave nothing to place.
//   3. Fusion: inside a group, a unit u and its successor v merge when u has
//      no other successor or v no other predecessor, which cannot close a
//      cycle; repeated until nothing merges. The unit graph stays acyclic.
// Guarantees: each unit lies inside one group; every node of a group lands
// on one device under any placer. Does not modify the graph.
#pragma once

#include <cstdint>
#include <string_view>
#include <vector>

#include "ir/graph.h"

namespace modelpar::passes {

inline constexpr std::string_view kCoarsenPassId = "coarsen";

struct CoarsenOptions {
  bool group_by_layer = true;  ///< step 1 (off: every node is its own group)
  bool coplace = true;         ///< step 2
  bool coplace_across_layers = false;
  bool fuse = true;            ///< step 3
};

/// The grouping. Ids are dense and numbered by their first node in graph order.
struct Coarsening {
  std::vector<int32_t> unit_of_node;
  std::vector<int32_t> group_of_node;
  int32_t num_units = 0;
  int32_t num_groups = 0;
  int64_t nodes_before = 0;  ///< = number of nodes
  int64_t coplaced = 0;      ///< group merges made by co-placement
  int64_t fused = 0;         ///< unit merges made by fusion
};

Coarsening coarsen(const ir::Graph& g, const CoarsenOptions& options = {});

/// One unit per node, one group per layer (coarsen with steps 2 and 3 off):
/// the placers' default granularity.
Coarsening nodeUnits(const ir::Graph& g);

}  // namespace modelpar::passes
