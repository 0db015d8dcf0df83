// Layer attribution for captured graphs (layers.h).
#include "capture/layers.h"

#include <unordered_map>

namespace modelpar::capture {

std::string ownerOf(std::string_view tensor_path) {
  const size_t dot = tensor_path.rfind('.');
  return dot == std::string_view::npos ? std::string() : std::string(tensor_path.substr(0, dot));
}

void attributeLayers(ir::Graph& g, const std::vector<std::string>& input_owner,
                     const std::vector<int64_t>& node_seq) {
  // Owner of each value that is a graph input with a known module.
  std::vector<const std::string*> owner(g.numValues(), nullptr);
  for (size_t i = 0; i < g.inputs().size() && i < input_owner.size(); ++i) {
    if (!input_owner[i].empty()) owner[static_cast<size_t>(g.inputs()[i].value)] = &input_owner[i];
  }
  auto layerOf = [&](ir::ValueId v) -> const std::string* {
    const ir::Value& val = g.value(v);
    if (val.producer == ir::kNoId) return owner[static_cast<size_t>(v)];
    const std::string& l = g.node(val.producer).layer;
    return l.empty() ? nullptr : &l;
  };
  auto isForward = [&](ir::ValueId v) {
    const ir::Value& val = g.value(v);
    if (val.producer == ir::kNoId) return owner[static_cast<size_t>(v)] != nullptr;
    const auto& phase = g.node(val.producer).phase;
    return !phase || *phase == ir::Phase::Forward;
  };

  // Layer of the last forward node with each sequence number.
  std::unordered_map<int64_t, ir::NodeId> forward_of;
  auto seqOf = [&](size_t n) { return n < node_seq.size() ? node_seq[n] : int64_t{-1}; };

  for (size_t n = 0; n < g.numNodes(); ++n) {
    ir::Node& node = g.node(static_cast<ir::NodeId>(n));
    const bool backward = node.phase == ir::Phase::Backward;
    const int64_t seq = seqOf(n);
    if (!node.layer.empty()) {
      if (seq >= 0 && !backward) forward_of[seq] = static_cast<ir::NodeId>(n);
      continue;
    }
    const std::vector<ir::ValueId> ins = node.inputs();
    const std::string* pick = nullptr;
    // 2. A backward node belongs to the forward op it differentiates.
    if (backward && seq >= 0) {
      auto it = forward_of.find(seq);
      if (it != forward_of.end() && !g.node(it->second).layer.empty()) pick = &g.node(it->second).layer;
    }
    // 3. A parameter or buffer read names its module.
    for (size_t i = 0; !pick && i < ins.size(); ++i) {
      if (g.value(ins[i]).producer == ir::kNoId) pick = owner[static_cast<size_t>(ins[i])];
    }
    // 4. Inherit; backward nodes look at saved forward values first.
    if (!pick && backward) {
      for (ir::ValueId v : ins) {
        if (isForward(v) && (pick = layerOf(v))) break;
      }
    }
    if (!pick) {
      for (ir::ValueId v : ins) {
        if ((pick = layerOf(v))) break;
      }
    }
    if (pick) node.layer = *pick;
    if (seq >= 0 && !backward) forward_of[seq] = static_cast<ir::NodeId>(n);
  }
}

}  // namespace modelpar::capture
