// flatten and the flat form of inPlaceOrderEdges.
#include "passes/place/flat_graph.h"

#include <algorithm>
#include <limits>

#include "passes/cost/op_family.h"

namespace modelpar::passes {

FlatGraph flatten(const ir::Graph& g) {
  FlatGraph f;
  size_t nv = g.numValues(), nn = g.numNodes();
  f.dense_bytes.resize(nv);
  f.storage_bytes.resize(nv);
  for (size_t v = 0; v < nv; ++v) {
    f.dense_bytes[v] = g.values()[v].type.bytes().value_or(0);
    f.storage_bytes[v] = storageBytes(g, static_cast<ir::ValueId>(v));
  }
  f.alias_base = aliasBases(g);
  f.storage_root = f.alias_base;
  for (size_t v = 0; v < nv; ++v) {  // bases precede their aliases
    ir::ValueId b = f.storage_root[v];
    f.storage_root[v] = b == ir::kNoId ? static_cast<ir::ValueId>(v) : f.storage_root[static_cast<size_t>(b)];
  }
  f.arg_begin.reserve(nn + 1);
  f.out_begin.reserve(nn + 1);
  f.aliases.resize(nn);
  f.in_place.resize(nn);
  f.time_us.resize(nn);
  f.temp_bytes.resize(nn);
  f.persistent_bytes.resize(nn);
  for (size_t i = 0; i < nn; ++i) {
    const ir::Node& n = g.nodes()[i];
    f.arg_begin.push_back(static_cast<int32_t>(f.args.size()));
    for (const ir::Arg& a : n.args) a.forEachValue([&](ir::ValueId v) { f.args.push_back(v); });
    f.out_begin.push_back(static_cast<int32_t>(f.outs.size()));
    f.outs.insert(f.outs.end(), n.outputs.begin(), n.outputs.end());
    f.in_place[i] = isInPlaceOp(n.op);
    f.mut_begin.push_back(static_cast<int32_t>(f.muts.size()));
    if (f.in_place[i]) {
      size_t before = f.muts.size();
      for (const ir::Arg& a : n.args) {
        a.forEachValue([&](ir::ValueId v) {
          if (g.value(v).type.isTensor()) f.muts.push_back(v);
        });
        if (f.muts.size() > before) break;
      }
    }
    f.aliases[i] = f.in_place[i] || classifyOp(n.op) == OpFamily::View;
    f.time_us[i] = n.cost ? n.cost->time_us : std::numeric_limits<double>::quiet_NaN();
    f.temp_bytes[i] = n.cost ? n.cost->temp_bytes : 0;
    f.persistent_bytes[i] = n.cost ? n.cost->persistent_bytes : 0;
  }
  f.arg_begin.push_back(static_cast<int32_t>(f.args.size()));
  f.out_begin.push_back(static_cast<int32_t>(f.outs.size()));
  f.mut_begin.push_back(static_cast<int32_t>(f.muts.size()));
  return f;
}

std::vector<std::pair<ir::NodeId, ir::NodeId>> inPlaceOrderEdges(const FlatGraph& f) {
  std::vector<std::pair<ir::NodeId, ir::NodeId>> edges;
  if (std::find(f.in_place.begin(), f.in_place.end(), 1) == f.in_place.end()) return edges;
  // Readers of each storage since its last in-place writer.
  std::vector<std::vector<ir::NodeId>> readers(f.dense_bytes.size());
  for (size_t i = 0; i < f.numNodes(); ++i) {
    auto id = static_cast<ir::NodeId>(i);
    auto b = static_cast<size_t>(f.arg_begin[i]), e = static_cast<size_t>(f.arg_begin[i + 1]);
    for (int32_t k = f.mut_begin[i]; k < f.mut_begin[i + 1]; ++k) {
      auto& rs = readers[static_cast<size_t>(f.storage_root[static_cast<size_t>(f.muts[static_cast<size_t>(k)])])];
      for (ir::NodeId m : rs) {
        if (m != id) edges.emplace_back(m, id);
      }
      rs.clear();  // earlier readers are ordered through this writer from now on
    }
    for (size_t k = b; k < e; ++k) {
      auto& rs = readers[static_cast<size_t>(f.storage_root[static_cast<size_t>(f.args[k])])];
      if (rs.empty() || rs.back() != id) rs.push_back(id);
    }
  }
  std::sort(edges.begin(), edges.end());
  edges.erase(std::unique(edges.begin(), edges.end()), edges.end());
  return edges;
}

}  // namespace modelpar::passes
