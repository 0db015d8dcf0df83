// LayerChain: a model seen as a chain of layers with per-layer times and
// bytes — the input of the pipeline partitioners (partition.h), in the terms
// of MadPipe's model (seed 004 §3).
//
// Terms. Layers 0..L-1 in a topological order. For layer l:
//   fwd_us, bwd_us   u_F, u_B: forward / backward time of one micro-batch (µs)
//   weight_bytes     W: parameter bytes. A stage holding the layer keeps
//                    `weight_copies` x W (MadPipe: 3 = two weight versions +
//                    one gradient, PipeDream-2BW; also params + grad +
//                    momentum for SGD-momentum; Adam with one version: 4)
//   stored_bytes     a_store: bytes the layer keeps from its forward until its
//                    backward, per micro-batch (MadPipe's a_{l-1})
//   out_bytes        a_out: bytes crossing the cut after position l. For a
//                    DAG this counts every value produced at or before l and
//                    read after l, so a skip edge that jumps stages adds to
//                    every cut it spans (the gradient back has the same size)
//
// chainFromGraph builds one from an ir::Graph carrying layers and costs:
//   * layers: distinct `layer` attributes, ordered by ChainOptions::layer_order
//     (orderLayers, layer_order.h, makes one from captured module names), else
//     by the first forward node of each in graph order (nodes without a phase
//     count as forward);
//   * fwd_us: forward node times; bwd_us: backward and recompute node times;
//     update nodes are not counted (they run once per step, outside the
//     steady-state period the partitioners balance);
//   * weight_bytes: dense bytes of each `param` input read by the layer's
//     nodes, charged to the first layer (in chain order) that reads it;
//   * stored_bytes: dense bytes of the forward values (and `input` graph
//     inputs) read by the layer's backward nodes; in a graph without backward
//     nodes, the bytes of the values its forward nodes read from outside the
//     layer (its input, what MadPipe stores);
//   * out_bytes: as above over forward reads; graph inputs of role `input`
//     count as produced before layer 0; out_bytes of the last layer is 0.
// Preconditions: a cost on every forward / backward / recompute node and a
// layer on each (ConfigError names the node otherwise); every layer that has
// backward nodes also has forward ones. Symbolic shapes count 0 bytes.
//
// Example:
//   LayerChain c = chainFromGraph(ir::parseGraph(text));
//   c.layers[0].fwd_us;  c.totalTime();
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "ir/graph.h"

namespace modelpar::passes {

struct ChainLayer {
  std::string name;
  double fwd_us = 0;
  double bwd_us = 0;
  int64_t weight_bytes = 0;
  int64_t stored_bytes = 0;
  int64_t out_bytes = 0;
  bool operator==(const ChainLayer&) const = default;
};

struct LayerChain {
  std::vector<ChainLayer> layers;
  /// Memory per weight byte held by a stage (weights, gradient, optimizer
  /// state or stashed versions). MadPipe's 3 by default.
  double weight_copies = 3.0;

  int size() const { return static_cast<int>(layers.size()); }
  /// u_F + u_B of layer l.
  double time(int l) const;
  /// Sum of time(l) over all layers: U(1, L).
  double totalTime() const;
  /// Throws ConfigError naming the layer for a negative or non-finite time,
  /// negative bytes, or a weight_copies below 0; and for an empty chain.
  void validate() const;
};

struct ChainOptions {
  double weight_copies = 3.0;
  /// Give a node without a layer (a functional op such as F.relu in a
  /// torch.compile graph) the latest layer, in chain order, among the nodes
  /// it reads, else the first layer; false: such a node is a ConfigError.
  bool inherit_layers = false;
  /// The layers in chain order (orderLayers' `layers`); empty: the order of
  /// each layer's first forward node in the graph. Every layer of the graph
  /// must be listed (ConfigError naming the missing one otherwise).
  std::vector<std::string> layer_order;
};

/// g with every non-update node's empty layer filled as inherit_layers says
/// (chain order: `layer_order`, or first appearance when empty).
ir::Graph withInheritedLayers(const ir::Graph& g, const std::vector<std::string>& layer_order = {});

/// Builds the chain of g's layers (see the file comment).
LayerChain chainFromGraph(const ir::Graph& g, const ChainOptions& options = {});

}  // namespace modelpar::passes
