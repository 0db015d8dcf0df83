// Graphviz export of Graphs (dataflow) and Programs (per-device schedules
// with send -> recv edges).
#include "ir/dot.h"

#include <fmt/format.h>

#include <array>
#include <map>
#include <tuple>

#include "ir/printer.h"

namespace modelpar::ir {
namespace {

constexpr std::array<std::string_view, 8> kDeviceColors = {
    "#a6cee3", "#b2df8a", "#fb9a99", "#fdbf6f", "#cab2d6", "#ffff99", "#8dd3c7", "#bebada",
};

std::string_view deviceColor(int device) {
  size_t i = static_cast<size_t>(device < 0 ? -device : device) % kDeviceColors.size();
  return kDeviceColors[i];
}

// Escapes text for a double-quoted DOT string; lines are joined with `\n`.
std::string escape(std::string_view s) {
  std::string out;
  for (char c : s) {
    if (c == '"' || c == '\\') {
      out += '\\';
      out += c;
    } else if (c == '\n') {
      out += "\\n";
    } else {
      out += c;
    }
  }
  return out;
}

std::string label(std::initializer_list<std::string> lines) {
  std::string out;
  for (const std::string& l : lines) {
    if (l.empty()) continue;
    if (!out.empty()) out += "\\n";
    out += escape(l);
  }
  return out;
}

std::string valueNode(ValueId v) { return fmt::format("v{}", v); }
std::string opNode(NodeId n) { return fmt::format("n{}", n); }

// Where a value comes from: the node producing it, or its input ellipse.
std::string source(const Graph& g, ValueId v) {
  const Value& val = g.value(v);
  return val.producer == kNoId ? valueNode(v) : opNode(val.producer);
}

}  // namespace

std::string toDot(const Graph& g) {
  std::string out = fmt::format("digraph \"{}\" {{\n", escape(g.name()));
  out += "  rankdir=TB;\n  node [fontname=\"Helvetica\"];\n  edge [fontname=\"Helvetica\"];\n";
  for (const Input& in : g.inputs()) {
    const Value& v = g.value(in.value);
    std::string l = label({"%" + v.name, toString(v.type), std::string(name(in.role)),
                           in.device ? fmt::format("device {}", *in.device) : ""});
    out += fmt::format("  {} [label=\"{}\", shape=ellipse", valueNode(in.value), l);
    if (in.device) out += fmt::format(", style=filled, fillcolor=\"{}\"", deviceColor(*in.device));
    out += "];\n";
  }
  for (size_t i = 0; i < g.numNodes(); ++i) {
    auto id = static_cast<NodeId>(i);
    const Node& n = g.node(id);
    std::string l = label({g.nodeRef(id), n.qualifiedName(), n.layer,
                           n.device ? fmt::format("device {}", *n.device) : ""});
    out += fmt::format("  {} [label=\"{}\", shape=box", opNode(id), l);
    if (n.device) out += fmt::format(", style=filled, fillcolor=\"{}\"", deviceColor(*n.device));
    out += "];\n";
  }
  for (size_t i = 0; i < g.numNodes(); ++i) {
    auto id = static_cast<NodeId>(i);
    for (ValueId v : g.node(id).inputs()) {
      out += fmt::format("  {} -> {} [label=\"{}\"];\n", source(g, v), opNode(id),
                         escape(toString(g.value(v).type)));
    }
  }
  for (size_t i = 0; i < g.outputs().size(); ++i) {
    ValueId v = g.outputs()[i];
    out += fmt::format("  out{} [label=\"{}\", shape=doublecircle];\n", i,
                       escape("%" + g.value(v).name));
    out += fmt::format("  {} -> out{} [label=\"{}\"];\n", source(g, v), i,
                       escape(toString(g.value(v).type)));
  }
  out += "}\n";
  return out;
}

std::string toDot(const Program& p) {
  const Graph& g = p.graph();
  std::string out = fmt::format("digraph \"{}\" {{\n", escape(g.name()));
  out += "  rankdir=TB;\n  node [fontname=\"Helvetica\", shape=box];\n";
  // Sends still waiting for their receive, keyed by (from, to, value), in order.
  std::map<std::tuple<int, int, ValueId>, std::vector<std::string>> sends;
  for (int d = 0; d < p.numDevices(); ++d) {
    out += fmt::format("  subgraph cluster_d{} {{\n    label=\"device {}\";\n", d, d);
    out += fmt::format("    style=filled;\n    color=\"{}\";\n", deviceColor(d));
    const auto& sched = p.schedule(d);
    for (size_t i = 0; i < sched.size(); ++i) {
      out += fmt::format("    d{}_i{} [label=\"{}\"];\n", d, i,
                         escape(printInstruction(g, sched[i])));
    }
    // Program order inside the device.
    for (size_t i = 1; i < sched.size(); ++i) {
      out += fmt::format("    d{}_i{} -> d{}_i{};\n", d, i - 1, d, i);
    }
    out += "  }\n";
    for (size_t i = 0; i < sched.size(); ++i) {
      if (sched[i].kind == Instruction::Kind::Send) {
        sends[{d, sched[i].peer, sched[i].value}].push_back(fmt::format("d{}_i{}", d, i));
      }
    }
  }
  // The k-th send of a value from a to b pairs with the k-th receive of it on b from a.
  for (int d = 0; d < p.numDevices(); ++d) {
    const auto& sched = p.schedule(d);
    for (size_t i = 0; i < sched.size(); ++i) {
      if (sched[i].kind != Instruction::Kind::Recv) continue;
      auto it = sends.find({sched[i].peer, d, sched[i].value});
      if (it == sends.end() || it->second.empty()) continue;
      out += fmt::format("  {} -> d{}_i{} [style=dashed, constraint=false];\n", it->second.front(),
                         d, i);
      it->second.erase(it->second.begin());
    }
  }
  out += "}\n";
  return out;
}

}  // namespace modelpar::ir
