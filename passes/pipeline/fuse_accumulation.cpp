// Pass `fuse-accumulation` (fuse_accumulation.h).
#include "passes/pipeline/fuse_accumulation.h"

#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "ir/node_copy.h"

namespace modelpar::passes {
namespace {

using ir::Arg;
using ir::NodeId;
using ir::ValueId;

// The product an add operand comes from: mm(a, b), seen through `transposes`
// aten::t nodes (the operand is (a @ b)^T when odd).
struct Product {
  NodeId mm = ir::kNoId;
  std::vector<NodeId> chain;  // the t nodes, then the mm: what the fold removes
  bool transposed = false;
};

bool hasUnitAlpha(const ir::Node& n) {
  for (const Arg& a : n.args) {
    if (a.keyword() != "alpha") continue;
    if (a.kind() == Arg::Kind::Int) return a.toInt() == 1;
    if (a.kind() == Arg::Kind::Float) return a.toDouble() == 1.0;
    return false;
  }
  return true;
}

bool isOp(const ir::Node& n, std::string_view qualified) { return n.qualifiedName() == qualified; }

class Fuser {
 public:
  explicit Fuser(const ir::Graph& g) : g_(g), users_(g.users()), output_(g.numValues(), false) {
    for (ValueId v : g.outputs()) output_[static_cast<size_t>(v)] = true;
  }

  // v is read by one node and is no graph output: folding its producer away
  // loses nothing.
  bool readOnce(ValueId v) const {
    auto vi = static_cast<size_t>(v);
    return !output_[vi] && users_[vi].size() == 1;
  }

  std::optional<Product> productOf(ValueId v) const {
    Product p;
    for (;;) {
      NodeId n = g_.value(v).producer;
      if (n == ir::kNoId || !readOnce(v)) return std::nullopt;
      const ir::Node& nd = g_.node(n);
      p.chain.push_back(n);
      if (isOp(nd, "aten::t") && nd.args.size() == 1 && nd.args[0].isValue()) {
        p.transposed = !p.transposed;
        v = nd.args[0].toValue();
        continue;
      }
      if (isOp(nd, "aten::mm") && nd.args.size() == 2 && nd.args[0].isValue() &&
          nd.args[1].isValue()) {
        p.mm = n;
        return p;
      }
      return std::nullopt;
    }
  }

  // Every node of the product's chain is the add's task: same layer, phase,
  // device and micro-batch, so the fold moves no work to another stage or
  // step of the schedule (a backward add of two layers' gradients, such as
  // a skip connection's, stays an add).
  bool sameTask(const Product& p, const ir::Node& add) const {
    for (NodeId c : p.chain) {
      const ir::Node& n = g_.node(c);
      if (n.layer != add.layer || n.phase != add.phase || n.device != add.device ||
          n.microbatch != add.microbatch) {
        return false;
      }
    }
    return true;
  }

  // The fold of add node n: the operand kept as the sum and the product.
  std::optional<std::pair<ValueId, Product>> foldOf(NodeId n) const {
    const ir::Node& nd = g_.node(n);
    if (!isOp(nd, "aten::add.Tensor") || nd.outputs.size() != 1 || !hasUnitAlpha(nd)) {
      return std::nullopt;
    }
    std::vector<ValueId> operands;
    for (const Arg& a : nd.args) {
      if (a.keyword().empty() && a.isValue()) operands.push_back(a.toValue());
    }
    if (operands.size() != 2 || operands[0] == operands[1]) return std::nullopt;
    const ir::Type& out = g_.value(nd.outputs[0]).type;
    if (!out.isTensor() || out.shape.size() != 2) return std::nullopt;
    for (int k : {1, 0}) {  // the running sum is the first operand; try its partner first
      ValueId sum = operands[static_cast<size_t>(1 - k)];
      std::optional<Product> p = productOf(operands[static_cast<size_t>(k)]);
      if (!p || g_.value(sum).type != out || g_.value(operands[static_cast<size_t>(k)]).type != out) {
        continue;
      }
      if (!sameTask(*p, nd)) continue;
      const ir::Node& mm = g_.node(p->mm);
      if (g_.value(mm.outputs[0]).type.dtype != out.dtype) continue;
      bool same_dtype = true;
      for (const Arg& a : mm.args) same_dtype &= g_.value(a.toValue()).type.dtype == out.dtype;
      if (!same_dtype) continue;
      return std::make_pair(sum, std::move(*p));
    }
    return std::nullopt;
  }

 private:
  const ir::Graph& g_;
  std::vector<std::vector<NodeId>> users_;
  std::vector<bool> output_;
};

// A fresh name in both graphs, from `base`.
std::string freshName(const ir::Graph& a, const ir::Graph& b, std::string base) {
  while (a.findValue(base) || b.findValue(base)) base += "_";
  return base;
}

}  // namespace

FusedAccumulation fuseAccumulation(const ir::Graph& g) {
  Fuser fuser(g);
  const size_t nn = g.numNodes();
  std::vector<bool> removed(nn, false);
  std::vector<std::optional<std::pair<ValueId, Product>>> fold(nn);
  for (size_t n = 0; n < nn; ++n) {
    fold[n] = fuser.foldOf(static_cast<NodeId>(n));
    if (!fold[n]) continue;
    for (NodeId c : fold[n]->second.chain) removed[static_cast<size_t>(c)] = true;
  }

  FusedAccumulation out{ir::Graph(g.name()), 0};
  ir::Graph& ng = out.graph;
  std::vector<ValueId> map(g.numValues(), ir::kNoId);
  auto mapped = [&](ValueId v) { return map[static_cast<size_t>(v)]; };
  ir::NodeCopyRules keep;
  keep.value = mapped;
  for (const ir::Input& in : g.inputs()) {
    const ir::Value& val = g.value(in.value);
    map[static_cast<size_t>(in.value)] = ng.addInput(val.name, val.type, in.role, in.device);
  }
  for (size_t n = 0; n < nn; ++n) {
    if (removed[n]) continue;
    const ir::Node& nd = g.node(static_cast<NodeId>(n));
    if (!fold[n]) {
      ir::copyNode(g, static_cast<NodeId>(n), ng, keep, &map);
      continue;
    }
    const auto& [sum, product] = *fold[n];
    const ir::Node& mm = g.node(product.mm);
    ValueId a = mapped(mm.args[0].toValue());
    ValueId b = mapped(mm.args[1].toValue());
    auto annotate = [&](NodeId id) {
      ir::Node& made = ng.node(id);
      made.layer = nd.layer;
      made.phase = nd.phase;
      made.device = nd.device;
      made.microbatch = nd.microbatch;
      return made.outputs[0];
    };
    if (product.transposed) {  // (a @ b)^T = b^T @ a^T
      auto transpose = [&](ValueId v) {
        ir::Type t = ng.value(v).type;
        std::swap(t.shape[0], t.shape[1]);
        std::string name = freshName(g, ng, ng.value(v).name + ".t");
        return annotate(ng.addNode("aten::t", {Arg::value(v)}, {{name, t}}));
      };
      ValueId bt = transpose(b);
      ValueId at = transpose(a);
      a = bt;
      b = at;
    }
    const ir::Value& res = g.value(nd.outputs[0]);
    NodeId id = ng.addNode("aten::addmm", {Arg::value(mapped(sum)), Arg::value(a), Arg::value(b)},
                           {{res.name, res.type}});
    map[static_cast<size_t>(nd.outputs[0])] = annotate(id);
    if (nd.cost && mm.cost) {
      ir::Cost c = *mm.cost;
      c.time_us += nd.cost->time_us;
      c.output_bytes = nd.cost->output_bytes;
      ng.node(id).cost = c;
    }
    ++out.num_fused;
  }
  std::vector<ValueId> outputs;
  for (ValueId v : g.outputs()) outputs.push_back(mapped(v));
  ng.setOutputs(std::move(outputs));
  return out;
}

}  // namespace modelpar::passes
