// orderLayers (layer_order.h): units -> condensed components -> chain.
#include "passes/pipeline/layer_order.h"

#include <algorithm>
#include <functional>
#include <limits>
#include <queue>
#include <set>
#include <unordered_map>
#include <unordered_set>

#include <fmt/format.h>
#include <fmt/ranges.h>

#include "ir/check.h"
#include "ir/verifier.h"

namespace modelpar::passes {
namespace {

bool isForward(const ir::Node& n) { return !n.phase || *n.phase == ir::Phase::Forward; }
bool isUpdate(const ir::Node& n) { return n.phase && *n.phase == ir::Phase::Update; }

// An in-place op (`aten::copy_`) whose first argument is a graph input.
bool writesInput(const ir::Graph& g, const ir::Node& n) {
  return !n.op.empty() && n.op.back() == '_' && !n.args.empty() && n.args[0].isValue() &&
         g.inputIndex(n.args[0].toValue()).has_value();
}

// Strongly connected components of a digraph (iterative Tarjan); returns the
// component of each vertex.
std::vector<int> components(const std::vector<std::vector<int>>& adj) {
  const int n = static_cast<int>(adj.size());
  std::vector<int> index(static_cast<size_t>(n), -1), low(static_cast<size_t>(n), 0),
      comp(static_cast<size_t>(n), -1);
  std::vector<bool> on_stack(static_cast<size_t>(n), false);
  std::vector<int> stack;
  int next_index = 0, next_comp = 0;
  struct Frame { int v; size_t edge; };
  for (int root = 0; root < n; ++root) {
    if (index[static_cast<size_t>(root)] >= 0) continue;
    std::vector<Frame> frames{{root, 0}};
    index[static_cast<size_t>(root)] = low[static_cast<size_t>(root)] = next_index++;
    stack.push_back(root);
    on_stack[static_cast<size_t>(root)] = true;
    while (!frames.empty()) {
      Frame& f = frames.back();
      auto v = static_cast<size_t>(f.v);
      if (f.edge < adj[v].size()) {
        int w = adj[v][f.edge++];
        auto wi = static_cast<size_t>(w);
        if (index[wi] < 0) {
          index[wi] = low[wi] = next_index++;
          stack.push_back(w);
          on_stack[wi] = true;
          frames.push_back({w, 0});
        } else if (on_stack[wi]) {
          low[v] = std::min(low[v], index[wi]);
        }
        continue;
      }
      if (low[v] == index[v]) {
        int w;
        do {
          w = stack.back();
          stack.pop_back();
          on_stack[static_cast<size_t>(w)] = false;
          comp[static_cast<size_t>(w)] = next_comp;
        } while (w != f.v);
        ++next_comp;
      }
      int done = f.v;
      frames.pop_back();
      if (!frames.empty()) {
        auto p = static_cast<size_t>(frames.back().v);
        low[p] = std::min(low[p], low[static_cast<size_t>(done)]);
      }
    }
  }
  return comp;
}

// The longest common prefix of names, ending at a '.' boundary (or a whole
// name that is a prefix of all others).
std::string commonDottedPrefix(const std::vector<std::string>& names) {
  std::string prefix = names.front();
  for (const std::string& s : names) {
    size_t k = 0;
    while (k < prefix.size() && k < s.size() && prefix[k] == s[k]) ++k;
    prefix.resize(k);
  }
  auto boundary = [&](const std::string& s) {
    return s.size() == prefix.size() || s[prefix.size()] == '.';
  };
  while (!prefix.empty() &&
         !std::all_of(names.begin(), names.end(), boundary)) {
    size_t dot = prefix.rfind('.');
    prefix.resize(dot == std::string::npos ? 0 : dot);
  }
  return prefix;
}

// Note [Container modules]: a module's own nodes (a block's residual adds, a
// transformer's embedding sum and output view) run before and after its
// submodules', so as a layer of its own it would make a cycle with them and
// merge a whole block, or the whole body, into one layer. A forward layer
// that is a dotted prefix of another forward layer is a container: its nodes
// are treated as unlayered (step 3 puts them with the layer before them), and
// the submodules stay layers of their own. Returns the containers.
std::unordered_set<std::string> containerLayers(const ir::Graph& g) {
  std::set<std::string, std::less<>> forward_layers;
  for (const ir::Node& n : g.nodes()) {
    if (isForward(n) && !n.layer.empty()) forward_layers.insert(n.layer);
  }
  std::unordered_set<std::string> containers;
  for (const std::string& l : forward_layers) {
    const std::string child = l + ".";
    auto next = forward_layers.lower_bound(child);  // the first name >= "l."
    if (next != forward_layers.end() && next->compare(0, child.size(), child) == 0) {
      containers.insert(l);
    }
  }
  return containers;
}

// Note [Reused modules]: a module called at several places (T5's stack
// dropout before and after the blocks, an embedding shared by encoder and
// decoder) is one name over separate calls; as one unit it would make a cycle
// with everything between its calls. A layer's forward nodes are one unit per
// weakly connected group of them (a call's nodes read each other, or the same
// buffer or input; a shared parameter does not join calls); the groups after
// the first become units named `<layer>#2`, `#3`, ...
void splitReusedModules(const ir::Graph& g, std::vector<int>& unit_of_node,
                        std::vector<std::string>& unit_name, std::vector<size_t>& unit_first,
                        std::unordered_map<std::string, int>& unit_of_layer) {
  const size_t nn = g.numNodes();
  const size_t named = unit_name.size();
  std::vector<int> parent(nn);
  for (size_t i = 0; i < nn; ++i) parent[i] = static_cast<int>(i);
  auto find = [&](int x) {
    while (parent[static_cast<size_t>(x)] != x) {
      parent[static_cast<size_t>(x)] = parent[static_cast<size_t>(parent[static_cast<size_t>(x)])];
      x = parent[static_cast<size_t>(x)];
    }
    return x;
  };
  std::unordered_map<int64_t, int> reader_of_input;  // (unit, input value) -> a node
  for (size_t i = 0; i < nn; ++i) {
    int u = unit_of_node[i];
    if (u < 0 || unit_name[static_cast<size_t>(u)].empty()) continue;
    for (ir::ValueId x : g.nodes()[i].inputs()) {
      ir::NodeId p = g.value(x).producer;
      if (p != ir::kNoId && unit_of_node[static_cast<size_t>(p)] == u) {
        parent[static_cast<size_t>(find(static_cast<int>(i)))] = find(static_cast<int>(p));
      }
      std::optional<size_t> in = g.inputIndex(x);
      if (p == ir::kNoId && in && g.inputs()[*in].role != ir::InputRole::Parameter) {
        int64_t key = static_cast<int64_t>(u) * static_cast<int64_t>(g.numValues()) + x;
        auto [it, fresh] = reader_of_input.emplace(key, static_cast<int>(i));
        if (!fresh) parent[static_cast<size_t>(find(static_cast<int>(i)))] = find(it->second);
      }
    }
  }
  std::unordered_map<int, int> unit_of_group;  // group root -> unit
  std::vector<int> groups_of_unit(named, 0);
  for (size_t i = 0; i < nn; ++i) {
    int u = unit_of_node[i];
    if (u < 0 || static_cast<size_t>(u) >= named || unit_name[static_cast<size_t>(u)].empty()) continue;
    int root = find(static_cast<int>(i));
    auto it = unit_of_group.find(root);
    if (it == unit_of_group.end()) {
      int k = ++groups_of_unit[static_cast<size_t>(u)];
      int v = u;
      if (k > 1) {  // a later call of the same module
        std::string name = fmt::format("{}#{}", unit_name[static_cast<size_t>(u)], k);
        v = static_cast<int>(unit_name.size());
        unit_name.push_back(name);
        unit_first.push_back(i);
        unit_of_layer.emplace(name, v);
      }
      it = unit_of_group.emplace(root, v).first;
    }
    unit_of_node[i] = it->second;
  }
}

// The graph's layers with Note [Container modules] dropped: a node of a
// container module counts as unlayered.
struct Layering {
  const ir::Graph& g;
  std::unordered_set<std::string> containers;
  const std::string& layerOf(const ir::Node& n) const {
    static const std::string kNone;
    return containers.count(n.layer) ? kNone : n.layer;
  }
};

// The units step 1 finds and the edges between them.
struct Units {
  std::unordered_map<std::string, int> unit_of_layer;
  std::vector<std::string> unit_name;  // empty for an unlayered node's unit
  std::vector<size_t> unit_first;      // first node in graph order
  std::vector<int> unit_of_node;       // -1: not a forward node
  std::vector<std::vector<int>> adj;   // unit -> units reading it, sorted
  size_t size() const { return unit_name.size(); }
};

// 1. Units: layers first (by first forward node), then unlayered forward nodes.
Units findUnits(const Layering& l, const std::vector<std::vector<ir::NodeId>>& users) {
  const ir::Graph& g = l.g;
  const size_t nn = g.numNodes();
  Units un;
  un.unit_of_node.assign(nn, -1);
  for (size_t i = 0; i < nn; ++i) {
    const ir::Node& n = g.nodes()[i];
    if (!isForward(n)) continue;
    const std::string& layer = l.layerOf(n);
    if (layer.empty() && writesInput(g, n)) {
      // An in-place write back into a graph input (AOTAutograd's copy_ of a
      // buffer's new value) runs where the input lives: with the first
      // layered forward node that reads it (a cycle this makes merges).
      for (ir::NodeId r : users[static_cast<size_t>(n.args[0].toValue())]) {
        const ir::Node& rn = g.node(r);
        const std::string& rl = l.layerOf(rn);
        if (static_cast<size_t>(r) == i || rl.empty() || !isForward(rn)) continue;
        auto [it, fresh] = un.unit_of_layer.emplace(rl, static_cast<int>(un.unit_name.size()));
        if (fresh) {
          un.unit_name.push_back(rl);
          un.unit_first.push_back(static_cast<size_t>(r));
        }
        un.unit_of_node[i] = it->second;
        break;
      }
      if (un.unit_of_node[i] >= 0) continue;
    }
    if (layer.empty()) {
      un.unit_of_node[i] = static_cast<int>(un.unit_name.size());
      un.unit_name.emplace_back();
      un.unit_first.push_back(i);
      continue;
    }
    auto [it, fresh] = un.unit_of_layer.emplace(layer, static_cast<int>(un.unit_name.size()));
    if (fresh) {
      un.unit_name.push_back(layer);
      un.unit_first.push_back(i);
    }
    un.unit_of_node[i] = it->second;
  }
  splitReusedModules(g, un.unit_of_node, un.unit_name, un.unit_first, un.unit_of_layer);
  MP_CHECK(!un.unit_of_layer.empty(), ConfigError,
           "modelpar {}: graph @{} has no forward node with a layer; a pipeline cuts the model "
           "between layers (capture it from an nn.Module, or set `layer` attributes)",
           kLayerOrderPassId, g.name());
  un.adj.assign(un.size(), {});
  for (size_t i = 0; i < nn; ++i) {
    int v = un.unit_of_node[i];
    if (v < 0) continue;
    for (ir::ValueId x : g.nodes()[i].inputs()) {
      ir::NodeId p = g.value(x).producer;
      if (p == ir::kNoId) continue;
      int u = un.unit_of_node[static_cast<size_t>(p)];
      if (u >= 0 && u != v) un.adj[static_cast<size_t>(u)].push_back(v);
    }
  }
  for (auto& a : un.adj) {
    std::sort(a.begin(), a.end());
    a.erase(std::unique(a.begin(), a.end()), a.end());
  }
  return un;
}

// The strongly connected components of the unit graph, in step 2's order.
struct Condensed {
  std::vector<int> comp;  // per unit
  int nc = 0;
  std::vector<bool> comp_named;
  std::vector<std::vector<int>> comp_units;
  std::vector<int> comp_order;
};

// 2. Condense and sort components topologically, ties by first node.
Condensed condense(const Units& un) {
  const size_t nu = un.size();
  Condensed c;
  c.comp = components(un.adj);
  c.nc = nu ? 1 + *std::max_element(c.comp.begin(), c.comp.end()) : 0;
  const auto nc = static_cast<size_t>(c.nc);
  std::vector<size_t> comp_first(nc, std::numeric_limits<size_t>::max());
  c.comp_named.assign(nc, false);
  c.comp_units.assign(nc, {});
  for (size_t u = 0; u < nu; ++u) {
    auto k = static_cast<size_t>(c.comp[u]);
    comp_first[k] = std::min(comp_first[k], un.unit_first[u]);
    c.comp_named[k] = c.comp_named[k] || !un.unit_name[u].empty();
    c.comp_units[k].push_back(static_cast<int>(u));
  }
  std::vector<std::vector<int>> cadj(nc);
  std::vector<int> indegree(nc, 0);
  for (size_t u = 0; u < nu; ++u) {
    for (int w : un.adj[u]) {
      int a = c.comp[u], b = c.comp[static_cast<size_t>(w)];
      if (a == b) continue;
      cadj[static_cast<size_t>(a)].push_back(b);
      ++indegree[static_cast<size_t>(b)];
    }
  }
  using Item = std::pair<size_t, int>;  // (first node, component)
  std::priority_queue<Item, std::vector<Item>, std::greater<>> ready;
  for (int k = 0; k < c.nc; ++k) {
    if (indegree[static_cast<size_t>(k)] == 0) ready.push({comp_first[static_cast<size_t>(k)], k});
  }
  while (!ready.empty()) {
    int k = ready.top().second;
    ready.pop();
    c.comp_order.push_back(k);
    for (int d : cadj[static_cast<size_t>(k)]) {
      if (--indegree[static_cast<size_t>(d)] == 0) ready.push({comp_first[static_cast<size_t>(d)], d});
    }
  }
  MP_INTERNAL_ASSERT(static_cast<int>(c.comp_order.size()) == c.nc, "condensed unit graph is cyclic");
  return c;
}

// 3. Layers: a named component starts one; unlayered ones join the one
// before. Fills out.members; returns each component's layer.
std::vector<int> layersOfComponents(const Units& un, const Condensed& c, LayerOrder& out) {
  std::vector<int> layer_of_comp(static_cast<size_t>(c.nc), -1);
  std::vector<int> pending;  // unlayered components before the first layer
  for (int k : c.comp_order) {
    if (c.comp_named[static_cast<size_t>(k)]) {
      out.members.emplace_back();
      for (int u : c.comp_units[static_cast<size_t>(k)]) {
        if (!un.unit_name[static_cast<size_t>(u)].empty()) {
          out.members.back().push_back(un.unit_name[static_cast<size_t>(u)]);
        }
      }
      layer_of_comp[static_cast<size_t>(k)] = static_cast<int>(out.members.size()) - 1;
      for (int p : pending) layer_of_comp[static_cast<size_t>(p)] = 0;
      pending.clear();
    } else if (out.members.empty()) {
      pending.push_back(k);
    } else {
      layer_of_comp[static_cast<size_t>(k)] = static_cast<int>(out.members.size()) - 1;
    }
  }
  return layer_of_comp;
}

// 3b. Names: a member's own name, else the common prefix, else a join; a
// name already used, or an original layer's outside this one, gets `#k`.
void nameLayers(const Units& un, LayerOrder& out) {
  std::unordered_set<std::string> used;
  for (const auto& m : out.members) {
    std::string name = m.front();
    if (m.size() > 1) {
      std::vector<std::string> sorted = m;  // first-appearance order, for reading
      std::sort(sorted.begin(), sorted.end(), [&](const std::string& a, const std::string& b) {
        return un.unit_first[static_cast<size_t>(un.unit_of_layer.at(a))] <
               un.unit_first[static_cast<size_t>(un.unit_of_layer.at(b))];
      });
      name = commonDottedPrefix(sorted);
      if (name.empty()) {
        name = sorted.size() <= 3 ? fmt::format("{}", fmt::join(sorted, "+"))
                                  : sorted.front() + "+...+" + sorted.back();
      }
      out.merged_layers += static_cast<int>(m.size()) - 1;
    }
    auto clash = [&](const std::string& s) {
      return used.count(s) ||
             (un.unit_of_layer.count(s) && std::find(m.begin(), m.end(), s) == m.end());
    };
    std::string base = name;
    for (int k = 2; clash(name); ++k) name = fmt::format("{}#{}", base, k);
    used.insert(name);
    out.layers.push_back(name);
  }
}

// 4. Per node: its layer position. Forward nodes: their unit's component's
// layer. Backward nodes: named -> their layer; unlayered gradient readers ->
// the earliest layer they read a gradient from; the rest -> the latest layer
// of their backward readers. Update nodes: -1 (relabel keeps their layer's).
std::vector<int> layerPositions(const Layering& l, const Units& un, const Condensed& c,
                                const std::vector<int>& layer_of_comp,
                                const std::unordered_map<std::string, int>& pos_of_name,
                                const std::vector<std::vector<ir::NodeId>>& users, LayerOrder& out) {
  const ir::Graph& g = l.g;
  const size_t nn = g.numNodes();
  std::vector<int> pos(nn, -1);
  for (size_t i = 0; i < nn; ++i) {
    int u = un.unit_of_node[i];
    if (u < 0) continue;
    pos[i] = layer_of_comp[static_cast<size_t>(c.comp[static_cast<size_t>(u)])];
    if (l.layerOf(g.nodes()[i]).empty()) ++out.unlayered_nodes;
  }
  std::vector<bool> backward(nn, false), gradient(nn, false);
  for (size_t i = 0; i < nn; ++i) {
    const ir::Node& n = g.nodes()[i];
    if (isForward(n) || isUpdate(n)) continue;
    backward[i] = true;
    int earliest = std::numeric_limits<int>::max();
    for (ir::ValueId x : n.inputs()) {
      ir::NodeId p = g.value(x).producer;
      if (p == ir::kNoId || !gradient[static_cast<size_t>(p)]) continue;
      earliest = std::min(earliest, pos[static_cast<size_t>(p)]);
    }
    auto it = l.layerOf(n).empty() ? pos_of_name.end() : pos_of_name.find(n.layer);
    if (it != pos_of_name.end()) {
      // Its layer, unless a gradient it reads comes from an earlier one
      // (AOTAutograd tags some gradient sums with an unrelated module).
      pos[i] = std::min(it->second, earliest);
      gradient[i] = true;
    } else if (earliest != std::numeric_limits<int>::max()) {
      pos[i] = earliest;
      gradient[i] = true;
    }
  }
  const int last = static_cast<int>(out.layers.size()) - 1;
  for (size_t r = nn; r-- > 0;) {
    if (!backward[r] || pos[r] >= 0) continue;
    int latest = -1;
    for (ir::ValueId x : g.nodes()[r].outputs) {
      for (ir::NodeId w : users[static_cast<size_t>(x)]) {
        if (backward[static_cast<size_t>(w)]) latest = std::max(latest, pos[static_cast<size_t>(w)]);
      }
    }
    pos[r] = latest >= 0 ? latest : last;
  }
  return pos;
}

// 5. The graph with every node's layer the chain's name for its position;
// an update node of a known layer takes its layer's new name.
void relabel(const ir::Graph& g, const std::vector<int>& pos,
             const std::unordered_map<std::string, int>& pos_of_name, LayerOrder& out) {
  out.graph = g;
  for (size_t i = 0; i < g.numNodes(); ++i) {
    ir::Node& n = out.graph.node(static_cast<ir::NodeId>(i));
    if (pos[i] >= 0) {
      n.layer = out.layers[static_cast<size_t>(pos[i])];
    } else if (!n.layer.empty()) {  // an update node of a known layer
      auto it = pos_of_name.find(n.layer);
      if (it != pos_of_name.end()) n.layer = out.layers[static_cast<size_t>(it->second)];
    }
  }
}

}  // namespace

LayerOrder orderLayers(const ir::Graph& g) {
  ir::verify(g);
  // 0. Note [Container modules] (containerLayers).
  const Layering l{g, containerLayers(g)};
  const std::vector<std::vector<ir::NodeId>> users = g.users();
  const Units un = findUnits(l, users);
  const Condensed c = condense(un);
  LayerOrder out;
  const std::vector<int> layer_of_comp = layersOfComponents(un, c, out);
  nameLayers(un, out);
  std::unordered_map<std::string, int> pos_of_name;
  for (size_t u = 0; u < un.size(); ++u) {
    if (!un.unit_name[u].empty()) {
      pos_of_name[un.unit_name[u]] = layer_of_comp[static_cast<size_t>(c.comp[u])];
    }
  }
  const std::vector<int> pos = layerPositions(l, un, c, layer_of_comp, pos_of_name, users, out);
  relabel(g, pos, pos_of_name, out);
  return out;
}

}  // namespace modelpar::passes
