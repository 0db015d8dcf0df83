// Pass `coarsen`: layer groups, co-placement and cycle-safe fusion.
#include "passes/place/coarsen.h"

#include <numeric>
#include <string>
#include <unordered_map>
#include <unordered_set>

#include "passes/cost/op_family.h"

namespace modelpar::passes {
namespace {

struct UnionFind {
  explicit UnionFind(size_t n) : parent(n) { std::iota(parent.begin(), parent.end(), 0); }
  int32_t find(int32_t x) {
    while (parent[static_cast<size_t>(x)] != x) {
      parent[static_cast<size_t>(x)] = parent[static_cast<size_t>(parent[static_cast<size_t>(x)])];
      x = parent[static_cast<size_t>(x)];
    }
    return x;
  }
  std::vector<int32_t> parent;
};

// Dense ids numbered by first appearance.
int32_t densify(UnionFind& uf, std::vector<int32_t>& out) {
  std::unordered_map<int32_t, int32_t> ids;
  for (size_t i = 0; i < out.size(); ++i) {
    int32_t r = uf.find(static_cast<int32_t>(i));
    auto [it, inserted] = ids.emplace(r, static_cast<int32_t>(ids.size()));
    out[i] = it->second;
  }
  return static_cast<int32_t>(ids.size());
}

// Step 3 state: the unit graph over union-find roots.
class Fuser {
 public:
  Fuser(const ir::Graph& g, const std::vector<int32_t>& group)
      : uf_(g.numNodes()), succ_(g.numNodes()), pred_(g.numNodes()), group_(group) {
    for (size_t v = 0; v < g.numNodes(); ++v) {
      for (ir::ValueId in : g.nodes()[v].inputs()) {
        ir::NodeId u = g.value(in).producer;
        if (u == ir::kNoId || static_cast<size_t>(u) == v) continue;
        succ_[static_cast<size_t>(u)].insert(static_cast<int32_t>(v));
        pred_[v].insert(u);
      }
    }
    for (auto [u, v] : inPlaceOrderEdges(g)) {
      succ_[static_cast<size_t>(u)].insert(v);
      pred_[static_cast<size_t>(v)].insert(u);
    }
  }

  int64_t run() {
    int64_t merges = 0;
    for (bool changed = true; changed;) {
      changed = false;
      for (int32_t u = 0; u < static_cast<int32_t>(succ_.size()); ++u) {
        if (uf_.find(u) != u) continue;
        // Absorb successors while one qualifies; the set changes as we merge.
        for (bool again = true; again;) {
          again = false;
          for (int32_t v : succ_[static_cast<size_t>(u)]) {
            if (group_[static_cast<size_t>(u)] != group_[static_cast<size_t>(v)]) continue;
            if (succ_[static_cast<size_t>(u)].size() > 1 && pred_[static_cast<size_t>(v)].size() > 1) {
              continue;  // another u -> ... -> v path may exist: fusing could close a cycle
            }
            merge(u, v);
            ++merges;
            again = changed = true;
            break;
          }
        }
      }
    }
    return merges;
  }

  UnionFind& unionFind() { return uf_; }

 private:
  // Folds v into u (u stays the root).
  void merge(int32_t u, int32_t v) {
    auto& su = succ_[static_cast<size_t>(u)];
    auto& pu = pred_[static_cast<size_t>(u)];
    auto& sv = succ_[static_cast<size_t>(v)];
    auto& pv = pred_[static_cast<size_t>(v)];
    su.erase(v);
    pv.erase(u);
    for (int32_t x : sv) {
      auto& px = pred_[static_cast<size_t>(x)];
      px.erase(v);
      px.insert(u);
      su.insert(x);
    }
    for (int32_t x : pv) {
      auto& sx = succ_[static_cast<size_t>(x)];
      sx.erase(v);
      sx.insert(u);
      pu.insert(x);
    }
    sv.clear();
    pv.clear();
    uf_.parent[static_cast<size_t>(v)] = u;
  }

  UnionFind uf_;
  std::vector<std::unordered_set<int32_t>> succ_, pred_;
  const std::vector<int32_t>& group_;
};

}  // namespace

Coarsening coarsen(const ir::Graph& g, const CoarsenOptions& options) {
  size_t n = g.numNodes();
  Coarsening c;
  c.nodes_before = static_cast<int64_t>(n);

  // 1. Layer groups.
  UnionFind groups(n);
  std::vector<std::string> layer_of_root(n);  // non-empty: the group carries a layer
  std::unordered_map<std::string, int32_t> first_of_layer;
  for (size_t i = 0; i < n; ++i) {
    const std::string& layer = g.nodes()[i].layer;
    layer_of_root[i] = layer;
    if (!options.group_by_layer || layer.empty()) continue;
    auto [it, inserted] = first_of_layer.emplace(layer, static_cast<int32_t>(i));
    if (!inserted) groups.parent[i] = it->second;
  }

  // 2. Co-placement: merge a node into its only consumer.
  if (options.coplace) {
    auto users = g.users();
    std::vector<char> is_output(g.numValues(), 0);
    for (ir::ValueId v : g.outputs()) is_output[static_cast<size_t>(v)] = 1;
    for (size_t i = 0; i < n; ++i) {
      const ir::Node& nd = g.nodes()[i];
      ir::NodeId only = ir::kNoId;
      bool single = !nd.outputs.empty();
      for (ir::ValueId v : nd.outputs) {
        if (is_output[static_cast<size_t>(v)]) single = false;
        for (ir::NodeId u : users[static_cast<size_t>(v)]) {
          if (only == ir::kNoId) only = u;
          else if (only != u) single = false;
        }
      }
      if (!single || only == ir::kNoId) continue;
      int32_t a = groups.find(static_cast<int32_t>(i)), b = groups.find(only);
      if (a == b) continue;
      const std::string& la = layer_of_root[static_cast<size_t>(a)];
      const std::string& lb = layer_of_root[static_cast<size_t>(b)];
      if (!la.empty() && !lb.empty() && la != lb && !options.coplace_across_layers) continue;
      groups.parent[static_cast<size_t>(a)] = b;
      if (lb.empty()) layer_of_root[static_cast<size_t>(b)] = la;
      ++c.coplaced;
    }
  }
  c.group_of_node.resize(n);
  c.num_groups = densify(groups, c.group_of_node);

  // 3. Fusion inside groups.
  c.unit_of_node.resize(n);
  if (!options.fuse) {
    std::iota(c.unit_of_node.begin(), c.unit_of_node.end(), 0);
    c.num_units = static_cast<int32_t>(n);
    return c;
  }
  Fuser fuser(g, c.group_of_node);
  c.fused = fuser.run();
  c.num_units = densify(fuser.unionFind(), c.unit_of_node);
  return c;
}

Coarsening nodeUnits(const ir::Graph& g) {
  CoarsenOptions o;
  o.coplace = false;
  o.fuse = false;
  return coarsen(g, o);
}

}  // namespace modelpar::passes
