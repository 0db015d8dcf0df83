// Capturability analysis (capture_check.h).
#include "runtime/capture_check.h"

#include <algorithm>
#include <map>
#include <set>

#include <ATen/core/dispatch/Dispatcher.h>
#include <ATen/core/enum_tag.h>

#include "ir/printer.h"
#include "runtime/check.h"

namespace modelpar::runtime {
namespace {

using Kind = ir::Instruction::Kind;

std::optional<c10::OperatorHandle> schemaOf(const ir::Node& n) {
  return c10::Dispatcher::singleton().findSchema({n.op, n.overload});
}

/// The schema argument each node argument binds to (positional over the
/// non-kwarg-only parameters, keywords by name); -1 when it fits none.
std::vector<int> bindArgs(const ir::Node& n, const c10::FunctionSchema& s) {
  const std::vector<c10::Argument>& params = s.arguments();
  std::vector<int> positional;
  for (size_t i = 0; i < params.size(); ++i) {
    if (!params[i].kwarg_only()) positional.push_back(static_cast<int>(i));
  }
  std::vector<int> out;
  size_t next = 0;
  for (const ir::Arg& a : n.args) {
    if (a.keyword().empty()) {
      out.push_back(next < positional.size() ? positional[next++] : -1);
      continue;
    }
    auto it = std::find_if(params.begin(), params.end(),
                           [&](const c10::Argument& p) { return p.name() == a.keyword(); });
    out.push_back(it == params.end() ? -1 : static_cast<int>(it - params.begin()));
  }
  return out;
}

bool boolTensorValue(const ir::Graph& g, const ir::Arg& a) {
  if (a.isValue()) {
    const ir::Type& t = g.value(a.toValue()).type;
    return t.isTensor() && (t.dtype == ir::ScalarType::Bool || t.dtype == ir::ScalarType::UInt8);
  }
  return std::any_of(a.items().begin(), a.items().end(),
                     [&](const ir::Arg& x) { return boolTensorValue(g, x); });
}

std::string at(const ir::Program& p, int d, size_t i) {
  const ir::Instruction& inst = p.schedule(d)[i];
  std::string s = c10::str("device ", d, ", instruction ", i, " (", ir::printInstruction(p.graph(), inst));
  if (inst.kind == Kind::Run) s += ", " + p.graph().node(inst.node).qualifiedName();
  return s + ")";
}

/// Ops whose CUDA kernels read device data on the host (an .item() inside:
/// a comparison's result, a histogram's range, bincount's size) without the
/// data_dependent_output tag. A capture that met one would fail, so it is
/// refused up front instead of through the abandon path.
bool syncsWithoutTheTag(std::string_view qualified) {
  for (std::string_view op : {"aten::is_nonzero", "aten::equal", "aten::allclose", "aten::histc",
                              "aten::bincount", "aten::_assert_scalar"}) {
    if (qualified == op) return true;
  }
  return false;
}

/// Why node `n` cannot be captured, or "".
std::string nodeIssue(const ir::Graph& g, const ir::Node& n) {
  if (syncsWithoutTheTag(n.op)) {
    return "reads device data on the host (its CUDA kernel does), which synchronises; a capture "
           "cannot";
  }
  if (std::optional<c10::OperatorHandle> op = schemaOf(n)) {
    if (op->hasTag(at::Tag::data_dependent_output)) {
      return "reads device data on the host (tag data_dependent_output), which synchronises; a "
             "capture cannot";
    }
    const bool index = n.op == "aten::index" && n.overload == "Tensor";
    if (index ? n.args.size() > 1 && boolTensorValue(g, n.args[1])
              : op->hasTag(at::Tag::dynamic_output_shape)) {
      return index ? "indexes with a bool mask: the output size depends on the data"
                   : "its output shape depends on the data (tag dynamic_output_shape)";
    }
  }
  for (ir::ValueId v : n.outputs) {
    if (g.value(v).type.isTensor() && !g.value(v).type.hasStaticShape()) {
      return c10::str("%", g.value(v).name, " has the symbolic shape ", ir::toString(g.value(v).type),
                      "; a captured graph replays fixed sizes");
    }
  }
  return "";
}

}  // namespace

std::vector<CaptureIssue> captureIssues(const ir::Program& p, const DeviceMap& map) {
  const ir::Graph& g = p.graph();
  std::vector<CaptureIssue> out;
  if (map.kind() == DeviceKind::CpuWorker) {
    out.push_back(CaptureIssue{-1, -1, "CPU worker devices run the stream path (graph replay is "
                                       "CUDA-only; the static input buffers are used as a graph would)"});
  }
  for (const ir::Input& in : g.inputs()) {
    const ir::Value& v = g.value(in.value);
    if (v.type.isTensor() && !v.type.hasStaticShape()) {
      out.push_back(CaptureIssue{in.device.value_or(0), -1,
                                 c10::str("input %", v.name, " has the symbolic shape ",
                                          ir::toString(v.type), "; a captured graph replays fixed sizes")});
    }
  }
  const bool cuda = map.kind() == DeviceKind::Cuda;
  for (int d = 0; d < p.numDevices(); ++d) {
    const std::vector<ir::Instruction>& sched = p.schedule(d);
    for (size_t i = 0; i < sched.size(); ++i) {
      const ir::Instruction& inst = sched[i];
      std::string why;
      if (inst.kind == Kind::Run && inst.node >= 0 && static_cast<size_t>(inst.node) < g.numNodes()) {
        why = nodeIssue(g, g.node(inst.node));
      } else if (inst.kind == Kind::Send && cuda && inst.peer >= 0 &&
                 static_cast<size_t>(inst.peer) < map.devices.size() &&
                 static_cast<size_t>(d) < map.devices.size() &&
                 map.devices[static_cast<size_t>(d)] != map.devices[static_cast<size_t>(inst.peer)]) {
        why = c10::str("sends from ", map.devices[static_cast<size_t>(d)].str(), " to ",
                       map.devices[static_cast<size_t>(inst.peer)].str(),
                       "; a CUDA graph is captured on one GPU");
      }
      if (!why.empty()) out.push_back(CaptureIssue{d, static_cast<int64_t>(i), at(p, d, i) + ": " + why});
    }
  }
  return out;
}

std::string describe(const std::vector<CaptureIssue>& issues, size_t limit) {
  std::string s;
  for (size_t i = 0; i < issues.size() && i < limit; ++i) s += (i == 0 ? "" : "; ") + issues[i].what;
  if (issues.size() > limit) s += c10::str(" (+", issues.size() - limit, " more)");
  return s;
}

std::vector<size_t> inputsWrittenInPlace(const ir::Program& p) {
  const ir::Graph& g = p.graph();
  std::vector<std::set<size_t>> aliases(g.numValues());  // graph inputs a value may alias
  for (size_t k = 0; k < g.inputs().size(); ++k) aliases[static_cast<size_t>(g.inputs()[k].value)].insert(k);
  std::set<size_t> written;
  for (const ir::Node& n : g.nodes()) {
    std::optional<c10::OperatorHandle> op = schemaOf(n);
    if (!op) continue;
    const c10::FunctionSchema& s = op->schema();
    const std::vector<int> bound = bindArgs(n, s);
    // Inputs reachable from each alias set of the schema (`a` in Tensor(a!)).
    std::map<c10::Symbol, std::set<size_t>> by_set;
    for (size_t j = 0; j < n.args.size(); ++j) {
      if (bound[j] < 0) continue;
      const c10::AliasInfo* info = s.arguments()[static_cast<size_t>(bound[j])].alias_info();
      if (info == nullptr) continue;
      std::set<size_t> reach;
      n.args[j].forEachValue([&](ir::ValueId v) {
        const std::set<size_t>& a = aliases[static_cast<size_t>(v)];
        reach.insert(a.begin(), a.end());
      });
      if (info->isWrite()) written.insert(reach.begin(), reach.end());
      for (const c10::Symbol& sym : info->beforeSets()) by_set[sym].insert(reach.begin(), reach.end());
    }
    const std::vector<c10::Argument>& returns = s.returns();
    for (size_t r = 0; r < returns.size(); ++r) {
      const c10::AliasInfo* info = returns[r].alias_info();
      if (info == nullptr) continue;
      std::set<size_t> reach;
      for (const c10::Symbol& sym : info->beforeSets()) {
        auto it = by_set.find(sym);
        if (it != by_set.end()) reach.insert(it->second.begin(), it->second.end());
      }
      // One output per return, or a single list return spread over all outputs.
      for (size_t o = 0; o < n.outputs.size(); ++o) {
        if (returns.size() == n.outputs.size() ? o == r : returns.size() == 1) {
          aliases[static_cast<size_t>(n.outputs[o])].insert(reach.begin(), reach.end());
        }
      }
    }
  }
  return {written.begin(), written.end()};
}

}  // namespace modelpar::runtime
