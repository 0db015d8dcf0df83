// Deterministic text printer for Graphs and Programs (grammar in
// ir/README.md). The parser reads back exactly what this writes.
#include "ir/printer.h"

#include <fmt/format.h>

#include <cmath>

#include "ir/check.h"

namespace modelpar::ir {
namespace {

std::string quote(std::string_view s) {
  std::string out = "\"";
  for (char c : s) {
    auto u = static_cast<unsigned char>(c);
    if (c == '"') {
      out += "\\\"";
    } else if (c == '\\') {
      out += "\\\\";
    } else if (c == '\n') {
      out += "\\n";
    } else if (c == '\t') {
      out += "\\t";
    } else if (u < 0x20 || u == 0x7f) {
      out += fmt::format("\\x{:02x}", u);
    } else {
      out += c;  // printable ASCII and UTF-8 bytes pass through
    }
  }
  out += '"';
  return out;
}

std::string valueRef(const Graph& g, ValueId v) {
  MP_INTERNAL_ASSERT(v >= 0 && static_cast<size_t>(v) < g.numValues(),
                     "printing graph @{}: value id {} does not exist", g.name(), v);
  return "%" + g.value(v).name;
}

std::string typed(const Graph& g, ValueId v) {
  return fmt::format("{}: {}", valueRef(g, v), toString(g.value(v).type));
}

// Attributes in the fixed order layer, phase, device, mb, random, cost; unset
// ones omitted.
std::string attrs(const Node& n) {
  std::vector<std::string> parts;
  if (!n.layer.empty()) parts.push_back("layer=" + quote(n.layer));
  if (n.phase) parts.push_back(fmt::format("phase={}", name(*n.phase)));
  if (n.device) parts.push_back(fmt::format("device={}", *n.device));
  if (n.microbatch) parts.push_back(fmt::format("mb={}", *n.microbatch));
  if (n.random) parts.push_back("random=true");
  if (n.cost) {
    parts.push_back(fmt::format("cost={{time_us={}, out={}, temp={}, persist={}}}",
                                printFloat(n.cost->time_us), n.cost->output_bytes,
                                n.cost->temp_bytes, n.cost->persistent_bytes));
  }
  if (parts.empty()) return "";
  return fmt::format(" {{{}}}", fmt::join(parts, ", "));
}

std::string printInput(const Graph& g, const Input& in) {
  std::string s = fmt::format("{} {}", typed(g, in.value), name(in.role));
  if (in.device) s += fmt::format(" {{device={}}}", *in.device);
  return s;
}

void printGraphTo(const Graph& g, std::string& out) {
  out += fmt::format("graph @{}(", g.name());
  // Short signatures stay on one line; longer ones get one input per line.
  const auto& ins = g.inputs();
  if (ins.size() > 2) {
    out += '\n';
    for (size_t i = 0; i < ins.size(); ++i) {
      out += "    " + printInput(g, ins[i]) + (i + 1 < ins.size() ? ",\n" : "\n");
    }
  } else {
    for (size_t i = 0; i < ins.size(); ++i) {
      if (i) out += ", ";
      out += printInput(g, ins[i]);
    }
  }
  out += ") {\n";
  for (size_t n = 0; n < g.numNodes(); ++n) {
    out += "  " + printNode(g, static_cast<NodeId>(n)) + "\n";
  }
  out += "  return";
  for (size_t i = 0; i < g.outputs().size(); ++i) {
    out += (i ? ", " : " ") + valueRef(g, g.outputs()[i]);
  }
  out += "\n}\n";
}

}  // namespace

std::string printFloat(double v) {
  // NaN sign and payload are not kept: every NaN prints as `nan` and reads
  // back as the quiet NaN (the grammar has no `-nan`, and ATen does not
  // distinguish NaNs either).
  if (std::isnan(v)) return "nan";
  if (std::isinf(v)) return v > 0 ? "inf" : "-inf";
  std::string s = fmt::format("{}", v);  // shortest text that reads back to the same bits
  if (s.find_first_of(".e") == std::string::npos) s += ".0";
  return s;
}

std::string printArg(const Graph& g, const Arg& a) {
  std::string s = a.keyword().empty() ? "" : a.keyword() + "=";
  switch (a.kind()) {
    case Arg::Kind::None:
      return s + "None";
    case Arg::Kind::Bool:
      return s + (a.toBool() ? "true" : "false");
    case Arg::Kind::Int:
      return s + std::to_string(a.toInt());
    case Arg::Kind::Float:
      return s + printFloat(a.toDouble());
    case Arg::Kind::String:
      return s + quote(a.toStringRef());
    case Arg::Kind::Dtype:
      return s + "dtype." + std::string(name(a.toDtype()));
    case Arg::Kind::Layout:
      return s + "layout." + std::string(name(a.toLayout()));
    case Arg::Kind::MemoryFormat:
      return s + "memory_format." + std::string(name(a.toMemoryFormat()));
    case Arg::Kind::Device:
      return s + "device(" + quote(a.toStringRef()) + ")";
    case Arg::Kind::Value:
      return s + valueRef(g, a.toValue());
    case Arg::Kind::List: {
      s += '[';
      for (size_t i = 0; i < a.items().size(); ++i) {
        if (i) s += ", ";
        s += printArg(g, a.items()[i]);
      }
      return s + ']';
    }
  }
  MP_INTERNAL_ASSERT(false, "printing graph @{}: argument of unknown kind {}",
                     g.name(), static_cast<int>(a.kind()));
}

std::string printNode(const Graph& g, NodeId id) {
  const Node& n = g.node(id);
  std::string s;
  if (n.outputs.empty()) {
    s = "^" + n.label;
  } else {
    for (size_t i = 0; i < n.outputs.size(); ++i) {
      if (i) s += ", ";
      s += typed(g, n.outputs[i]);
    }
  }
  s += " = " + n.qualifiedName() + "(";
  for (size_t i = 0; i < n.args.size(); ++i) {
    if (i) s += ", ";
    s += printArg(g, n.args[i]);
  }
  return s + ")" + attrs(n);
}

std::string printInstruction(const Graph& g, const Instruction& inst) {
  switch (inst.kind) {
    case Instruction::Kind::Run:
      return "run " + g.nodeRef(inst.node);
    case Instruction::Kind::Send:
      return fmt::format("send {} -> {}", valueRef(g, inst.value), inst.peer);
    case Instruction::Kind::Recv:
      return fmt::format("recv {} <- {}", valueRef(g, inst.value), inst.peer);
    case Instruction::Kind::Free:
      return "free " + valueRef(g, inst.value);
  }
  MP_INTERNAL_ASSERT(false, "printing graph @{}: instruction of unknown kind {}", g.name(),
                     static_cast<int>(inst.kind));
}

std::string print(const Graph& g) {
  std::string out;
  printGraphTo(g, out);
  return out;
}

std::string print(const Program& p) {
  std::string out = fmt::format("program devices={}\n", p.numDevices());
  printGraphTo(p.graph(), out);
  for (int d = 0; d < p.numDevices(); ++d) {
    out += fmt::format("device {} {{\n", d);
    for (const Instruction& inst : p.schedule(d)) {
      out += "  " + printInstruction(p.graph(), inst) + "\n";
    }
    out += "}\n";
  }
  return out;
}

}  // namespace modelpar::ir
