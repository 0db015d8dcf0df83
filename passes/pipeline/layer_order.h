// Pass `layer-order`: turns the module names a captured graph carries into a
// chain of layers the pipeline partitioners can cut (layer_chain.h), and gives
// every node a layer so that cutting the chain into stages yields a valid
// pipeline schedule (pipeline/schedule.h: stages never decrease along forward
// edges nor increase along backward edges).
//
// Why. torch.compile tags each ATen node with the innermost module that made
// it (`blocks.0.attn.qkv`), and functional ops (F.relu, a residual `x + h`)
// with the module whose forward() called them, or nothing at the top level.
// As captured, these names are not a chain:
//   * nested names interleave: GPT's `blocks.0` (the residual adds) runs
//     before and after `blocks.0.fc`, so neither can come first. A layer
//     that is the dotted prefix of another (a container module) is not a
//     layer of its own: its nodes are treated as unlayered (Note [Container
//     modules] in the .cpp), so blocks and their submodules stay separate
//     layers instead of merging (a whole GPT-2 body into one layer);
//   * first appearance is not topological: AOTAutograd hoists weight-only
//     nodes (`t(fc.weight)`), so a late layer can appear early;
//   * unlayered nodes (F.relu, flatten, detach of a saved value) must still
//     go to some stage, consistently with both edge directions.
// MadPipe (seed 004 §3) and torchgpipe (seed 002 §3.1) take the model as a
// sequence of layers; this pass derives that sequence from the graph.
//
// Algorithm. Over the forward nodes (phase fwd or none):
//   1. units: one per layer name, one per unlayered node; an edge per value a
//      forward node reads from another unit's forward node. An unlayered
//      in-place write into a graph input (AOTAutograd's `copy_` of a buffer's
//      new running stats) joins the layer of the input's first layered
//      reader, so it runs on the stage, hence the device, the input lives on;
//   2. the unit graph's strongly connected components are condensed (a cycle
//      of layers, as nested names make, becomes one layer) and sorted
//      topologically, ties by the first node of each in graph order;
//   3. in that order, a component holding a named layer starts a new layer;
//      one made only of unlayered nodes joins the layer before it (the first
//      layer, if none is before). Every forward edge then goes forward in the
//      order or stays within a layer.
// A merged layer is named by its members' longest common dotted prefix
// (`blocks.0`), else `a+b` (`a+...+z` for more than three), unless taken.
// Backward nodes (bwd, recompute) of a named layer go with that layer, or
// with an earlier one if they read a gradient from it (AOTAutograd tags some
// gradient sums with an unrelated module's name). An
// unlayered backward node that reads a gradient (a backward node that is
// layered or itself reads a gradient) takes the earliest layer among those
// it reads, so gradients never flow to a later stage; any other unlayered
// backward node (a `detach` or seed made from forward values only) takes the
// latest layer among its backward readers (the last layer if it has none).
// Update nodes are renamed with their layer but keep no constraint.
//
// Preconditions: g verifies; at least one forward node has a layer
// (ConfigError otherwise: there is no module structure to pipeline).
// Guarantees: the caller's graph is not modified; every non-update node of
// the result has a layer in `layers`; forward edges never go to an earlier
// layer, backward edges between gradient-carrying nodes never to a later one;
// a graph that already is a chain keeps its layers and names.
//
// Example:
//   LayerOrder lo = orderLayers(step);
//   ChainOptions co;  co.layer_order = lo.layers;
//   LayerChain chain = chainFromGraph(lo.graph, co);
#pragma once

#include <string>
#include <string_view>
#include <vector>

#include "ir/graph.h"

namespace modelpar::passes {

inline constexpr std::string_view kLayerOrderPassId = "layer-order";

struct LayerOrder {
  /// The input graph with every node's layer replaced (see above).
  ir::Graph graph{"layer_order"};
  /// The layers in chain order.
  std::vector<std::string> layers;
  /// Per layer, the names it was made from (the layer itself when unmerged;
  /// empty for a layer made of unlayered nodes only, which cannot happen).
  std::vector<std::vector<std::string>> members;
  /// Named layers merged into another (a cycle), and unlayered forward nodes
  /// given a layer.
  int merged_layers = 0;
  int unlayered_nodes = 0;
};

/// Orders g's layers into a chain (see the file comment).
LayerOrder orderLayers(const ir::Graph& g);

}  // namespace modelpar::passes
