// Pass `cost`: analytic roofline per op family (cost_model.h).
#include "passes/cost/cost_model.h"

#include <algorithm>
#include <cmath>
#include <vector>

#include "ir/check.h"

namespace modelpar::passes {
namespace {

class ShapeReader {
 public:
  ShapeReader(const ir::Graph& g, const CostOptions& o) : g_(g), o_(o) {}

  int64_t dim(const ir::Dim& d) const {
    if (d.isStatic()) return d.size;
    auto it = o_.symbol_sizes.find(d.symbol);
    return it == o_.symbol_sizes.end() ? o_.default_symbol_size : it->second;
  }
  double numel(ir::ValueId v) const {
    const ir::Type& t = g_.value(v).type;
    if (!t.isTensor()) return 1.0;
    double n = 1.0;
    for (const ir::Dim& d : t.shape) n *= static_cast<double>(dim(d));
    return n;
  }
  double bytes(ir::ValueId v) const {
    const ir::Type& t = g_.value(v).type;
    if (!t.isTensor()) return 0.0;
    return numel(v) * static_cast<double>(ir::elementSize(t.dtype));
  }
  /// Size of dimension i (negative counts from the end); 1 if out of range.
  double size(ir::ValueId v, int i) const {
    const ir::Type& t = g_.value(v).type;
    int r = static_cast<int>(t.shape.size());
    if (i < 0) i += r;
    if (!t.isTensor() || i < 0 || i >= r) return 1.0;
    return static_cast<double>(dim(t.shape[static_cast<size_t>(i)]));
  }

 private:
  const ir::Graph& g_;
  const CostOptions& o_;
};

// Tensor inputs in argument order, each value once.
std::vector<ir::ValueId> tensorInputs(const ir::Graph& g, const ir::Node& n) {
  std::vector<ir::ValueId> ins;
  for (const ir::Arg& a : n.args) {
    a.forEachValue([&](ir::ValueId v) {
      if (g.value(v).type.isTensor() && std::find(ins.begin(), ins.end(), v) == ins.end()) {
        ins.push_back(v);
      }
    });
  }
  return ins;
}

std::string_view baseName(std::string_view op) {
  size_t p = op.rfind("::");
  return p == std::string_view::npos ? op : op.substr(p + 2);
}

bool positionalBool(const ir::Node& n, size_t index, std::string_view keyword) {
  size_t pos = 0;
  for (const ir::Arg& a : n.args) {
    if (!a.keyword().empty()) {
      if (a.keyword() == keyword && a.kind() == ir::Arg::Kind::Bool) return a.toBool();
      continue;
    }
    if (pos++ == index && a.kind() == ir::Arg::Kind::Bool) return a.toBool();
  }
  return false;
}

double matmulFlops(const ShapeReader& s, std::string_view op, const std::vector<ir::ValueId>& in,
                   double out_numel) {
  // Operand A is the first tensor, after the added `self` for the add* forms.
  bool has_self = op.substr(0, 3) == "add" || op == "baddbmm" || op == "_addmm_activation";
  size_t a = has_self ? 1 : 0;
  if (in.size() < a + 1) return 0.0;
  double k = s.size(in[a], -1);
  if (op == "addbmm" && in.size() > a + 1) {  // the batch dimension is summed away
    return 2.0 * s.numel(in[a]) * s.size(in[a + 1], -1) + out_numel;
  }
  return 2.0 * out_numel * k + (has_self ? out_numel : 0.0);
}

double convFlops(const ShapeReader& s, std::string_view op, const ir::Node& n,
                 const std::vector<ir::ValueId>& in, double out_numel) {
  bool backward = op == "convolution_backward";
  // convolution_backward(grad_output, input, weight, ...); others (input, weight, ...).
  size_t x = backward ? 1 : 0, w = x + 1;
  if (in.size() <= w) return 0.0;
  double per_out = s.numel(in[w]) / std::max(1.0, s.size(in[w], 0));
  bool transposed = op.substr(0, 14) == "conv_transpose" ||
                    ((op == "convolution" || op == "_convolution") &&
                     positionalBool(n, 6, "transposed")) ||
                    (backward && positionalBool(n, 7, "transposed"));
  double anchor = backward ? s.numel(in[0]) : out_numel;  // grad_output ~ forward output
  if (transposed) anchor = s.numel(in[x]);
  double fwd = 2.0 * anchor * per_out;
  return backward ? 2.0 * fwd : fwd;
}

double attentionFlops(const ShapeReader& s, std::string_view op,
                      const std::vector<ir::ValueId>& in) {
  bool backward = op.find("backward") != std::string_view::npos;
  size_t q = backward ? 1 : 0;  // backward kernels take grad_out first
  if (in.size() < q + 3) return 0.0;
  double l = s.size(in[q], -2), e = s.size(in[q], -1);
  double sk = s.size(in[q + 1], -2), ev = s.size(in[q + 2], -1);
  double batch = s.numel(in[q]) / std::max(1.0, l * e);
  double fwd = 2.0 * batch * l * sk * (e + ev);
  return backward ? 2.5 * fwd : fwd;
}

}  // namespace

NodeCostEstimate estimateNodeCost(const ir::Graph& g, ir::NodeId id, const DeviceSpec& device,
                                  const CostOptions& options) {
  const ir::Node& n = g.node(id);
  ShapeReader s(g, options);
  std::vector<ir::ValueId> in = tensorInputs(g, n);
  double in_bytes = 0, out_bytes = 0, in_numel = 0, out_numel = 0;
  for (ir::ValueId v : in) {
    in_bytes += s.bytes(v);
    in_numel += s.numel(v);
  }
  for (ir::ValueId v : n.outputs) {
    out_bytes += s.bytes(v);
    if (g.value(v).type.isTensor()) out_numel += s.numel(v);
  }
  NodeCostEstimate est;
  est.family = classifyOp(n.op);
  std::string_view op = baseName(n.op);
  if (op.size() > 1 && op.back() == '_' && op != "copy_") op.remove_suffix(1);
  est.bytes_moved = in_bytes + out_bytes;
  switch (est.family) {
    case OpFamily::MatMul: est.flops = matmulFlops(s, op, in, out_numel); break;
    case OpFamily::Convolution: est.flops = convFlops(s, op, n, in, out_numel); break;
    case OpFamily::Attention: est.flops = attentionFlops(s, op, in); break;
    case OpFamily::Elementwise: est.flops = std::max(out_numel, in.empty() ? 0.0 : s.numel(in[0])); break;
    case OpFamily::Reduction: est.flops = in_numel; break;
    case OpFamily::Copy: est.flops = 0; break;
    case OpFamily::View: est.flops = 0; est.bytes_moved = 0; break;
    case OpFamily::Other: est.flops = 0; break;
  }
  double compute_us = est.flops / device.peak_flops * 1e6;
  double memory_us = est.bytes_moved / device.memory_bandwidth * 1e6;
  est.cost.time_us = std::max(compute_us, memory_us) + device.launch_overhead_us;
  for (ir::ValueId v : n.outputs) {
    if (allocBytes(g, v) > 0 || !g.value(v).type.hasStaticShape()) {
      est.cost.output_bytes += est.family == OpFamily::View || isInPlaceOp(n.op)
                                   ? 0
                                   : static_cast<int64_t>(s.bytes(v));
    }
  }
  return est;
}

CostStats estimateCosts(ir::Graph& g, const DeviceModel& machine, const CostOptions& options) {
  MP_CHECK(options.reference_device >= 0 && options.reference_device < machine.numDevices(),
           ConfigError,
           "modelpar cost: reference device {} is out of range (the machine has {} devices)",
           options.reference_device, machine.numDevices());
  MP_CHECK(options.optimizer_state_factor >= 0 && options.default_symbol_size >= 0, ConfigError,
           "modelpar cost: optimizer_state_factor ({}) and default_symbol_size ({}) must be >= 0",
           options.optimizer_state_factor, options.default_symbol_size);
  const DeviceSpec& device = machine.device(options.reference_device);
  ShapeReader s(g, options);

  // 1. Charge every parameter and buffer to its first user.
  std::vector<int64_t> persistent(g.numNodes(), 0);
  // charged: 0 = not a parameter or buffer, 1 = not yet charged, 2 = charged.
  std::vector<char> charged(g.numValues(), 0);
  std::vector<char> is_param(g.numValues(), 0);
  for (const ir::Input& in : g.inputs()) {
    if (in.role != ir::InputRole::Input) charged[static_cast<size_t>(in.value)] = 1;
    if (in.role == ir::InputRole::Parameter) is_param[static_cast<size_t>(in.value)] = 1;
  }
  double param_factor = 1.0 + (options.count_gradients ? 1.0 : 0.0) + options.optimizer_state_factor;
  for (size_t i = 0; i < g.numNodes(); ++i) {
    for (ir::ValueId v : g.nodes()[i].inputs()) {
      if (charged[static_cast<size_t>(v)] != 1) continue;
      charged[static_cast<size_t>(v)] = 2;
      double factor = is_param[static_cast<size_t>(v)] ? param_factor : 1.0;
      persistent[i] += static_cast<int64_t>(s.bytes(v) * factor);
    }
  }
  // 2. Estimate every node without a cost; write only after all succeeded.
  CostStats stats;
  std::vector<std::optional<ir::Cost>> costs(g.numNodes());
  for (size_t i = 0; i < g.numNodes(); ++i) {
    if (g.nodes()[i].cost) {
      ++stats.profiled;
      continue;
    }
    NodeCostEstimate est = estimateNodeCost(g, static_cast<ir::NodeId>(i), device, options);
    est.cost.persistent_bytes = persistent[i];
    ++(est.family == OpFamily::Other ? stats.defaulted : stats.analytic);
    costs[i] = est.cost;
  }
  for (size_t i = 0; i < g.numNodes(); ++i) {
    if (costs[i]) g.node(static_cast<ir::NodeId>(i)).cost = costs[i];
  }
  return stats;
}

void applyProfile(ir::Graph& g, const std::vector<double>& time_us, const DeviceModel& machine,
                  const CostOptions& options) {
  MP_CHECK(time_us.size() == g.numNodes(), ConfigError,
           "modelpar {}: a profile of {} node times for the {} nodes of graph @{}", kCostPassId,
           time_us.size(), g.numNodes(), g.name());
  for (size_t i = 0; i < time_us.size(); ++i) {
    MP_CHECK(std::isfinite(time_us[i]), ConfigError, "modelpar {}: profiled time of node {} is {}",
             kCostPassId, g.nodeRef(static_cast<ir::NodeId>(i)), time_us[i]);
  }
  ir::Graph costed = g;
  estimateCosts(costed, machine, options);
  for (size_t i = 0; i < time_us.size(); ++i) {
    if (time_us[i] < 0) continue;
    auto n = static_cast<ir::NodeId>(i);
    ir::Cost c = *costed.node(n).cost;
    c.time_us = time_us[i];
    g.node(n).cost = c;
  }
}

}  // namespace modelpar::passes
