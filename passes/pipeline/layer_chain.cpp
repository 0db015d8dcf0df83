// chainFromGraph and LayerChain checks (layer_chain.h).
#include "passes/pipeline/layer_chain.h"

#include <cmath>
#include <set>
#include <unordered_map>
#include <utility>

#include "ir/check.h"
#include "passes/cost/op_family.h"

namespace modelpar::passes {

double LayerChain::time(int l) const {
  const ChainLayer& x = layers.at(static_cast<size_t>(l));
  return x.fwd_us + x.bwd_us;
}

double LayerChain::totalTime() const {
  double t = 0;
  for (const ChainLayer& x : layers) t += x.fwd_us + x.bwd_us;
  return t;
}

void LayerChain::validate() const {
  MP_CHECK(!layers.empty(), ConfigError, "modelpar partition: the layer chain is empty; "
           "a pipeline needs at least one layer");
  MP_CHECK(std::isfinite(weight_copies) && weight_copies >= 0, ConfigError,
           "modelpar partition: weight_copies is {}; use a finite value >= 0 (MadPipe: 3)",
           weight_copies);
  for (const ChainLayer& x : layers) {
    MP_CHECK(std::isfinite(x.fwd_us) && std::isfinite(x.bwd_us) && x.fwd_us >= 0 && x.bwd_us >= 0,
             ConfigError, "modelpar partition: layer '{}' has times fwd {} us, bwd {} us; "
             "times must be finite and >= 0", x.name, x.fwd_us, x.bwd_us);
    MP_CHECK(x.weight_bytes >= 0 && x.stored_bytes >= 0 && x.out_bytes >= 0, ConfigError,
             "modelpar partition: layer '{}' has negative bytes (weights {}, stored {}, out {})",
             x.name, x.weight_bytes, x.stored_bytes, x.out_bytes);
  }
}

namespace {

bool isForward(const ir::Node& n) { return !n.phase || *n.phase == ir::Phase::Forward; }

}  // namespace

ir::Graph withInheritedLayers(const ir::Graph& input, const std::vector<std::string>& layer_order) {
  ir::Graph g = input;
  // Chain order of the named layers: given, else their first forward node.
  std::unordered_map<std::string, int> order;
  std::string first = layer_order.empty() ? std::string() : layer_order.front();
  for (const std::string& l : layer_order) order.emplace(l, static_cast<int>(order.size()));
  for (const ir::Node& n : g.nodes()) {
    if (!layer_order.empty()) break;
    if (n.layer.empty() || !isForward(n) || order.count(n.layer)) continue;
    if (first.empty()) first = n.layer;
    order.emplace(n.layer, static_cast<int>(order.size()));
  }
  // A node without a layer takes the latest (in chain order) layer among the
  // nodes it reads, which keeps the chain topological; else the first.
  for (size_t i = 0; i < g.numNodes(); ++i) {
    ir::Node& n = g.node(static_cast<ir::NodeId>(i));
    if (!n.layer.empty() || (n.phase && *n.phase == ir::Phase::Update)) continue;
    std::string best;
    int best_index = -1;
    for (ir::ValueId v : n.inputs()) {
      ir::NodeId p = g.value(v).producer;
      if (p == ir::kNoId) continue;
      auto it = order.find(g.node(p).layer);
      if (it != order.end() && it->second > best_index) {
        best_index = it->second;
        best = it->first;
      }
    }
    n.layer = best_index >= 0 ? best : first;
  }
  return g;
}

namespace {

constexpr int kNotForward = -2, kBeforeChain = -1;

// 1. Layers in order of their first forward node; check layers and costs.
// Fills chain.layers; returns each layer's index by name.
std::unordered_map<std::string, int> chainLayers(const ir::Graph& g, const ChainOptions& options,
                                                 LayerChain& chain) {
  std::unordered_map<std::string, int> index;
  for (const std::string& l : options.layer_order) {
    MP_CHECK(index.emplace(l, chain.size()).second, ConfigError,
             "modelpar partition: layer '{}' is listed twice in layer_order", l);
    chain.layers.push_back(ChainLayer{l});
  }
  for (size_t i = 0; i < g.numNodes(); ++i) {
    const ir::Node& n = g.node(static_cast<ir::NodeId>(i));
    if (n.phase && *n.phase == ir::Phase::Update) continue;
    MP_CHECK(!n.layer.empty(), ConfigError,
             "modelpar partition: node {} ({}) in graph @{} has no layer; chainFromGraph needs a "
             "layer attribute on every forward and backward node",
             g.nodeRef(static_cast<ir::NodeId>(i)), n.qualifiedName(), g.name());
    MP_CHECK(n.cost.has_value(), ConfigError,
             "modelpar partition: node {} (layer '{}') has no cost; run the cost pass first",
             g.nodeRef(static_cast<ir::NodeId>(i)), n.layer);
    MP_CHECK(options.layer_order.empty() || index.count(n.layer), ConfigError,
             "modelpar partition: node {} has layer '{}', which layer_order does not list",
             g.nodeRef(static_cast<ir::NodeId>(i)), n.layer);
    if (isForward(n) && !index.count(n.layer)) {
      index.emplace(n.layer, chain.size());
      chain.layers.push_back(ChainLayer{n.layer});
    }
  }
  MP_CHECK(!chain.layers.empty(), ConfigError,
           "modelpar partition: graph @{} has no forward node with a layer; a pipeline needs "
           "layers (capture with module names, or set `layer` attributes)", g.name());
  return index;
}

// Where step 2 found each node and value.
struct Positions {
  std::vector<int> layer_of;  // per node; -1: an update node
  std::vector<int> made_at;   // per value: its forward layer, kBeforeChain or kNotForward
  bool has_backward = false;
};

// 2. Times, the layer of each node, the position where each value is made.
Positions layerTimes(const ir::Graph& g, const std::unordered_map<std::string, int>& index,
                     LayerChain& chain) {
  Positions pos;
  pos.layer_of.assign(g.numNodes(), -1);
  pos.made_at.assign(g.numValues(), kNotForward);
  for (const ir::Input& in : g.inputs()) {
    if (in.role == ir::InputRole::Input) pos.made_at[static_cast<size_t>(in.value)] = kBeforeChain;
  }
  for (size_t i = 0; i < g.numNodes(); ++i) {
    const ir::Node& n = g.node(static_cast<ir::NodeId>(i));
    if (n.phase && *n.phase == ir::Phase::Update) continue;
    auto it = index.find(n.layer);
    MP_CHECK(it != index.end(), ConfigError,
             "modelpar partition: node {} is a backward node of layer '{}', which has no forward "
             "node; give it the layer of the forward it differentiates",
             g.nodeRef(static_cast<ir::NodeId>(i)), n.layer);
    int l = it->second;
    pos.layer_of[i] = l;
    ChainLayer& x = chain.layers[static_cast<size_t>(l)];
    if (isForward(n)) {
      x.fwd_us += n.cost->time_us;
      for (ir::ValueId v : n.outputs) pos.made_at[static_cast<size_t>(v)] = l;
    } else {
      x.bwd_us += n.cost->time_us;
      pos.has_backward = true;
    }
  }
  return pos;
}

// 3. Weights (first reader in chain order), stored bytes, cut spans.
void layerBytes(const ir::Graph& g, const Positions& pos, LayerChain& chain) {
  std::vector<int> param_owner(g.numValues(), -1);
  std::vector<int> last_reader(g.numValues(), -1);
  std::set<std::pair<int, ir::ValueId>> stored;  // (layer, value), counted once
  for (size_t i = 0; i < g.numNodes(); ++i) {
    const ir::Node& n = g.node(static_cast<ir::NodeId>(i));
    int l = pos.layer_of[i];
    if (l < 0) continue;
    for (ir::ValueId v : n.inputs()) {
      auto vi = static_cast<size_t>(v);
      auto role = g.inputIndex(v);
      if (role && g.inputs()[*role].role == ir::InputRole::Parameter) {
        if (param_owner[vi] < 0 || l < param_owner[vi]) param_owner[vi] = l;
        continue;
      }
      int at = pos.made_at[vi];
      if (at == kNotForward) continue;  // buffers, backward values
      if (isForward(n)) {
        MP_CHECK(at <= l, ConfigError,
                 "modelpar partition: layer '{}' (node {}) reads %{} made by the later layer '{}'; "
                 "the layers are not in topological order (a module called twice?); merge them "
                 "into one layer", n.layer, g.nodeRef(static_cast<ir::NodeId>(i)), g.value(v).name,
                 chain.layers[static_cast<size_t>(at)].name);
        last_reader[vi] = std::max(last_reader[vi], l);
        if (!pos.has_backward && at != l) stored.insert({l, v});
      } else {
        stored.insert({l, v});
      }
    }
  }
  for (size_t v = 0; v < g.numValues(); ++v) {
    if (param_owner[v] >= 0) {
      chain.layers[static_cast<size_t>(param_owner[v])].weight_bytes +=
          denseBytes(g, static_cast<ir::ValueId>(v));
    }
  }
  for (const auto& [l, v] : stored) {
    chain.layers[static_cast<size_t>(l)].stored_bytes += denseBytes(g, v);
  }
  // The value made at position i and last read at j > i crosses the cuts
  // after positions max(i, 0) .. j-1 (difference array over cuts).
  std::vector<int64_t> delta(chain.layers.size() + 1, 0);
  for (size_t v = 0; v < g.numValues(); ++v) {
    int i = std::max(pos.made_at[v], 0), j = last_reader[v];
    if (pos.made_at[v] == kNotForward || j <= i) continue;
    int64_t b = denseBytes(g, static_cast<ir::ValueId>(v));
    delta[static_cast<size_t>(i)] += b;
    delta[static_cast<size_t>(j)] -= b;
  }
  int64_t run = 0;
  for (size_t l = 0; l < chain.layers.size(); ++l) {
    run += delta[l];
    chain.layers[l].out_bytes = l + 1 < chain.layers.size() ? run : 0;
  }
}

}  // namespace

LayerChain chainFromGraph(const ir::Graph& input, const ChainOptions& options) {
  if (options.inherit_layers) {
    ChainOptions strict = options;
    strict.inherit_layers = false;
    return chainFromGraph(withInheritedLayers(input, options.layer_order), strict);
  }
  const ir::Graph& g = input;
  LayerChain chain;
  chain.weight_copies = options.weight_copies;
  const std::unordered_map<std::string, int> index = chainLayers(g, options, chain);
  const Positions pos = layerTimes(g, index, chain);
  layerBytes(g, pos, chain);
  chain.validate();
  return chain;
}

}  // namespace modelpar::passes
