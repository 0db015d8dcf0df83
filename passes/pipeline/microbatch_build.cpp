// Pass `microbatch` (microbatch.h), step 6: the new graph, built from the
// Decision that steps 1-5 (microbatch.cpp, microbatch_loss.cpp) took. Shared
// nodes, then per micro-batch (slices, seed scale, copies, gradient and loss
// accumulation), then concatenations, then the nodes after the
// micro-batches. Each step below is one method of SplitGraphBuilder.
#include <algorithm>
#include <cmath>
#include <optional>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "ir/check.h"
#include "ir/node_copy.h"
#include "passes/pipeline/microbatch_impl.h"

namespace modelpar::passes::microbatch_detail {
namespace {

// Builds the split graph of `g` as `d` decided. One use: run() once.
class SplitGraphBuilder {
 public:
  SplitGraphBuilder(const ir::Graph& g, const MicrobatchOptions& o, const Decision& d)
      : g_(g), o_(o), d_(d), sym_(d.batch.symbol), out_(g.name()),
        shared_(g.numValues(), ir::kNoId), combined_(g.numValues(), ir::kNoId) {}

  ir::Graph run() {
    addInputs();
    copyNodesWhere(Where::Shared);
    findFirstReaders();
    markSlicedInputs();
    markSeedDependents();
    acc_.assign(g_.numValues(), ir::kNoId);
    parts_.assign(g_.numValues(), {});
    bn_copies_.assign(g_.numNodes(), {});
    int64_t start = 0;
    for (size_t k = 0; k < d_.sizes.size(); ++k) {
      buildMicrobatch(k, start);
      start += d_.sizes[k];
    }
    accumulateInReverse();
    concatenate();
    divideByTotalCount();
    combineDeferredBatchNorms();
    copyNodesWhere(Where::Post);
    setOutputs();
    return std::move(out_);
  }

 private:
  // One micro-batch's copy in the making.
  struct Microbatch {
    size_t k = 0;
    int mb = 0;
    int64_t size = 0, start = 0;
    // One micro-batch: the copies keep the graph's names (its outputs are
    // found by name, and a `.mb0` suffix would rename them).
    std::string suffix;
    double weight = 1.0;
    bool last = false;
    std::vector<ValueId> local;  // per value of g_: its copy in this micro-batch
  };

  bool isDeferredBn(NodeId n) const {
    return n != ir::kNoId && d_.deferred_bn[static_cast<size_t>(n)] != 0;
  }
  std::string ref(NodeId n) const {
    return fmt::format("{} = {}", g_.nodeRef(n), g_.node(n).qualifiedName());
  }
  std::string fresh(const std::string& base) const {
    std::string name = base;
    for (int i = 1; out_.findValue(name); ++i) name = fmt::format("{}_{}", base, i);
    return name;
  }
  void addAttrs(NodeId n, std::string layer, Phase phase, std::optional<int> mb) {
    out_.node(n).layer = std::move(layer);
    out_.node(n).phase = phase;
    out_.node(n).microbatch = mb;
  }
  // Copies node `src_node` reading through `lookup`; returns the new node.
  template <class Lookup>
  NodeId copyNode(size_t src_node, Lookup&& lookup, const std::string& suffix,
                  std::optional<int64_t> b) {
    ir::NodeCopyRules rules;
    rules.arg = [&](ValueId v) { return Arg(lookup(v)); };
    rules.name = [&](const std::string& base) {
      std::string name = base + suffix;
      for (int i = 1; out_.findValue(name) || out_.findLabel(name); ++i) {
        name = fmt::format("{}{}_{}", base, suffix, i);
      }
      return name;
    };
    rules.type = [&](const Type& t) { return instantiate(t, sym_, b.value_or(d_.total)); };
    rules.keep_cost = false;  // a micro-batch's share: the cost pass estimates it again
    return ir::copyNode(g_, static_cast<NodeId>(src_node), out_, rules);
  }
  // A value as the nodes outside the micro-batches read it.
  Arg sharedLookup(ValueId v) const {
    if (d_.batch.isSizeInput(v)) return Arg::integer(d_.total);
    ValueId c = combined_[static_cast<size_t>(v)];
    MP_INTERNAL_ASSERT(c != ir::kNoId || shared_[static_cast<size_t>(v)] != ir::kNoId,
                       "microbatch: %{} has no copy", g_.value(v).name);
    return Arg::value(c != ir::kNoId ? c : shared_[static_cast<size_t>(v)]);
  }

  // 6a. The graph inputs, at the full batch.
  void addInputs() {
    for (const ir::Input& in : g_.inputs()) {
      const ir::Value& v = g_.value(in.value);
      shared_[static_cast<size_t>(in.value)] =
          out_.addInput(v.name, instantiate(v.type, sym_, d_.total), in.role, in.device);
    }
  }

  // 6b / 6h. The nodes that run once, before the micro-batches (Shared) or
  // after them (Post), at the full batch.
  void copyNodesWhere(Where where) {
    for (size_t n = 0; n < g_.numNodes(); ++n) {
      if (d_.where[n] != where) continue;
      const ir::Node& nd = g_.nodes()[n];
      NodeId c = copyNode(n, [&](ValueId v) { return sharedLookup(v); }, "", std::nullopt);
      out_.node(c).cost = nd.cost;
      for (size_t i = 0; i < nd.outputs.size(); ++i) {
        shared_[static_cast<size_t>(nd.outputs[i])] = out_.node(c).outputs[i];
      }
    }
  }

  // First per-micro-batch reader of each value (the layer of slices, scales).
  void findFirstReaders() {
    first_reader_.assign(g_.numValues(), ir::kNoId);
    for (size_t n = g_.numNodes(); n-- > 0;) {
      if (d_.where[n] != Where::PerMb) continue;
      for (ValueId v : g_.nodes()[n].inputs()) {
        first_reader_[static_cast<size_t>(v)] = static_cast<NodeId>(n);
      }
    }
  }
  std::string layerOfReader(ValueId v) const {
    NodeId r = first_reader_[static_cast<size_t>(v)];
    return r == ir::kNoId ? std::string() : g_.node(r).layer;
  }
  // A slice runs in its first reader's phase: a tangent input's slices are
  // backward work (split_phases.h keeps them out of the forward part).
  Phase phaseOfReader(ValueId v) const {
    NodeId r = first_reader_[static_cast<size_t>(v)];
    std::optional<Phase> ph = r == ir::kNoId ? std::nullopt : g_.node(r).phase;
    return ph == Phase::Backward ? Phase::Backward : Phase::Forward;
  }

  // Graph inputs sliced per micro-batch: batched and read by a copy.
  void markSlicedInputs() {
    is_sliced_.assign(g_.numValues(), false);
    for (size_t i = 0; i < g_.inputs().size(); ++i) {
      ValueId v = g_.inputs()[i].value;
      is_sliced_[static_cast<size_t>(v)] =
          d_.batch.input_dim[i] >= 0 && first_reader_[static_cast<size_t>(v)] != ir::kNoId;
    }
  }

  // Note [Counted means]: what depends on the seed (the gradients) is
  // divided by the total target count after the micro-batches, as is the
  // loss; those results take their names there.
  void markSeedDependents() {
    from_seed_.assign(g_.numValues(), 0);
    if (d_.counted == ir::kNoId || d_.seed == ir::kNoId) return;
    from_seed_[static_cast<size_t>(d_.seed)] = 1;
    for (const ir::Node& nd : g_.nodes()) {
      bool reads = false;
      for (ValueId v : nd.inputs()) reads |= from_seed_[static_cast<size_t>(v)] != 0;
      if (reads) {
        for (ValueId o : nd.outputs) from_seed_[static_cast<size_t>(o)] = 1;
      }
    }
  }
  bool divided(size_t vi) const {
    return d_.counted != ir::kNoId &&
           (d_.combine[vi] == Combine::Loss ||
            (from_seed_[vi] != 0 &&
             (d_.combine[vi] == Combine::Accumulate || d_.combine[vi] == Combine::Cat)));
  }
  std::string combinedName(size_t vi) const {
    const std::string& name = g_.value(static_cast<ValueId>(vi)).name;
    return divided(vi) ? name + ".sum" : name;
  }

  // 6c. One micro-batch: its per-micro-batch nodes copied in order at its
  // size, with their inputs sliced and the seed scaled where first read,
  // and its outputs gathered or accumulated.
  void buildMicrobatch(size_t k, int64_t start) {
    Microbatch m;
    m.k = k;
    m.mb = static_cast<int>(k);
    m.size = d_.sizes[k];
    m.start = start;
    m.suffix = d_.sizes.size() == 1 ? std::string() : fmt::format(".mb{}", k);
    m.weight = d_.weight(k);
    m.last = k + 1 == d_.sizes.size();
    m.local.assign(g_.numValues(), ir::kNoId);
    if (d_.seed_is_root && d_.counted == ir::kNoId) seedRoot(m);
    for (size_t n = 0; n < g_.numNodes(); ++n) {
      if (d_.where[n] != Where::PerMb) continue;
      const ir::Node& nd = g_.nodes()[n];
      NodeId c = copyNode(n, [&](ValueId v) { return lookup(m, v); }, m.suffix, m.size);
      out_.node(c).microbatch = m.mb;
      if (isDeferredBn(static_cast<NodeId>(n))) bn_copies_[n].push_back(c);
      if (nd.cost) out_.node(c).cost = shareOfCost(*nd.cost, m);
      // Every output first: a counted mean's loss (output 0) is weighted by
      // its count (output 1).
      for (size_t i = 0; i < nd.outputs.size(); ++i) {
        m.local[static_cast<size_t>(nd.outputs[i])] = out_.node(c).outputs[i];
      }
      if (static_cast<NodeId>(n) == d_.counted) addToTotalCount(nd, m);
      for (size_t i = 0; i < nd.outputs.size(); ++i) combineOutput(nd, i, out_.node(c).outputs[i], m);
    }
  }

  // A value as micro-batch m's copies read it: the micro-batch's own copy,
  // else a slice or the scaled seed made now, else the shared one.
  Arg lookup(Microbatch& m, ValueId v) {
    if (d_.batch.isSizeInput(v)) return Arg::integer(m.size);
    if (d_.seed_is_root && v == d_.seed && m.local[static_cast<size_t>(v)] == ir::kNoId) seedRoot(m);
    if (m.local[static_cast<size_t>(v)] == ir::kNoId && is_sliced_[static_cast<size_t>(v)]) slice(m, v);
    ValueId l = m.local[static_cast<size_t>(v)];
    return l != ir::kNoId ? Arg::value(l) : sharedLookup(v);
  }

  // A micro-batch does b_k/B of the work; weights count once.
  ir::Cost shareOfCost(ir::Cost cost, const Microbatch& m) const {
    double f = static_cast<double>(m.size) / static_cast<double>(d_.total);
    double launch = std::clamp(o_.launch_overhead_us, 0.0, cost.time_us);
    cost.time_us = launch + (cost.time_us - launch) * f;
    cost.output_bytes = static_cast<int64_t>(std::llround(static_cast<double>(cost.output_bytes) * f));
    cost.temp_bytes = static_cast<int64_t>(std::llround(static_cast<double>(cost.temp_bytes) * f));
    if (m.k > 0) cost.persistent_bytes = 0;
    return cost;
  }

  // Note [Counted means]: a value times this micro-batch's target count.
  ValueId timesCount(const Microbatch& m, ValueId v, const std::string& name,
                     const std::string& layer, Phase ph) {
    ValueId t = m.local[static_cast<size_t>(d_.count)];
    MP_INTERNAL_ASSERT(t != ir::kNoId,
                       "{}: graph @{}: %{} is scaled by the target count before %{} is computed", kWho,
                       g_.name(), out_.value(v).name, g_.value(d_.count).name);
    NodeId s = out_.addNode("aten::mul.Tensor", {Arg::value(v), Arg::value(t)},
                            {{fresh(name), out_.value(v).type}});
    addAttrs(s, layer, ph, m.mb);
    return out_.node(s).outputs[0];
  }
  ValueId scaleSeed(const Microbatch& m, ValueId v, const std::string& name, const std::string& layer) {
    if (d_.counted != ir::kNoId) return timesCount(m, v, name, layer, Phase::Backward);
    if (m.weight == 1.0) return v;
    NodeId s = out_.addNode("aten::mul.Scalar", {Arg::value(v), Arg::floating(m.weight)},
                            {{fresh(name), out_.value(v).type}});
    addAttrs(s, layer, Phase::Backward, m.mb);
    return out_.node(s).outputs[0];
  }
  // Slices of the batched inputs, made right before their first reader in
  // this micro-batch (so a layer's slice sits with the layer, which keeps
  // layers in order for chainFromGraph).
  void slice(Microbatch& m, ValueId v) {
    auto i = static_cast<size_t>(*g_.inputIndex(v));
    const ir::Value& val = g_.value(v);
    NodeId s = out_.addNode("aten::narrow",
                            {Arg::value(shared_[static_cast<size_t>(v)]),
                             Arg::integer(d_.batch.input_dim[i]), Arg::integer(m.start),
                             Arg::integer(m.size)},
                            {{fresh(val.name + m.suffix), instantiate(val.type, sym_, m.size)}});
    addAttrs(s, layerOfReader(v), phaseOfReader(v), m.mb);
    m.local[static_cast<size_t>(v)] = out_.node(s).outputs[0];
  }
  // A root seed is scaled where the micro-batch first reads it; with a
  // counted mean that is in its backward, after its count exists.
  void seedRoot(Microbatch& m) {
    ValueId s = shared_[static_cast<size_t>(d_.seed)];
    m.local[static_cast<size_t>(d_.seed)] =
        scaleSeed(m, s, g_.value(d_.seed).name + m.suffix, layerOfReader(d_.seed));
  }

  // T = Σ T_k, beside each micro-batch's loss (Note [Counted means]).
  void addToTotalCount(const ir::Node& nd, const Microbatch& m) {
    ValueId t = m.local[static_cast<size_t>(d_.count)];
    if (total_count_ != ir::kNoId) {
      NodeId a = out_.addNode("aten::add.Tensor", {Arg::value(total_count_), Arg::value(t)},
                              {{fresh(fmt::format("{}.total{}", g_.value(d_.count).name, m.k)),
                                out_.value(t).type}});
      addAttrs(a, nd.layer, Phase::Forward, m.mb);
      t = out_.node(a).outputs[0];
    }
    total_count_ = t;
  }

  // Output i of per-micro-batch node nd, copied as `copy`: the seed scaled;
  // a part of a concatenation, or a term of a loss or gradient sum.
  void combineOutput(const ir::Node& nd, size_t i, ValueId copy, Microbatch& m) {
    ValueId o = nd.outputs[i];
    auto oi = static_cast<size_t>(o);
    const std::string& name = g_.value(o).name;
    if (o == d_.seed) m.local[oi] = scaleSeed(m, copy, name + m.suffix + ".scaled", nd.layer);
    switch (d_.combine[oi]) {
      case Combine::None:
      case Combine::RunningStat: break;  // after the micro-batches, from bn_copies_
      case Combine::Cat: parts_[oi].push_back(copy); break;
      case Combine::Accumulate:
        if (o_.accumulate_in_reverse) {  // chained after the loop, last micro-batch first
          parts_[oi].push_back(copy);
          break;
        }
        [[fallthrough]];
      case Combine::Loss: accumulate(nd, oi, copy, m); break;
    }
  }
  void accumulate(const ir::Node& nd, size_t oi, ValueId copy, const Microbatch& m) {
    const std::string& name = g_.value(static_cast<ValueId>(oi)).name;
    double wk = d_.combine[oi] == Combine::Loss ? m.weight : 1.0;
    // Counted means: the loss is Σ T_k·L_k, divided by Σ T_k after the
    // loop, which also divides what depends on the seed.
    if (d_.counted != ir::kNoId && d_.combine[oi] == Combine::Loss) {
      copy = timesCount(m, copy, name + m.suffix + ".counted", nd.layer,
                        nd.phase.value_or(Phase::Forward));
    }
    std::string acc_name = m.last ? combinedName(oi) : fmt::format("{}.acc{}", name, m.k);
    NodeId a = ir::kNoId;
    if (m.k == 0 && wk != 1.0) {
      a = out_.addNode("aten::mul.Scalar", {Arg::value(copy), Arg::floating(wk)},
                       {{fresh(acc_name), out_.value(copy).type}});
    } else if (m.k > 0) {
      std::vector<Arg> args{Arg::value(acc_[oi]), Arg::value(copy)};
      if (wk != 1.0) args.push_back(Arg::floating(wk).withKeyword("alpha"));
      a = out_.addNode("aten::add.Tensor", std::move(args), {{fresh(acc_name), out_.value(copy).type}});
    }
    if (a != ir::kNoId) addAttrs(a, nd.layer, nd.phase.value_or(Phase::Forward), m.mb);
    acc_[oi] = a == ir::kNoId ? copy : out_.node(a).outputs[0];
    if (m.last) combined_[oi] = acc_[oi];
  }

  // 6d. Gradients accumulated in reverse micro-batch order (GPipe's
  // backward order): acc = g_{m-1}; acc += g_k for k = m-2 .. 0, each add
  // with mb=k.
  void accumulateInReverse() {
    for (size_t vi = 0; vi < g_.numValues(); ++vi) {
      if (d_.combine[vi] != Combine::Accumulate || !o_.accumulate_in_reverse) continue;
      const ir::Value& val = g_.value(static_cast<ValueId>(vi));
      const ir::Node& prod = g_.node(val.producer);
      ValueId a = parts_[vi].back();
      for (size_t k = parts_[vi].size() - 1; k-- > 0;) {
        std::string acc_name = k == 0 ? combinedName(vi) : fmt::format("{}.acc{}", val.name, k);
        NodeId n = out_.addNode("aten::add.Tensor", {Arg::value(a), Arg::value(parts_[vi][k])},
                                {{fresh(acc_name), out_.value(a).type}});
        addAttrs(n, prod.layer, prod.phase.value_or(Phase::Backward), static_cast<int>(k));
        a = out_.node(n).outputs[0];
      }
      combined_[vi] = a;
    }
  }

  // 6e. The concatenations of what leaves the micro-batches along the batch.
  void concatenate() {
    for (size_t vi = 0; vi < g_.numValues(); ++vi) {
      if (d_.combine[vi] != Combine::Cat) continue;
      if (parts_[vi].size() == 1) {
        combined_[vi] = parts_[vi][0];
        continue;
      }
      const ir::Value& val = g_.value(static_cast<ValueId>(vi));
      std::vector<Arg> items;
      for (ValueId p : parts_[vi]) items.push_back(Arg::value(p));
      NodeId c = out_.addNode("aten::cat", {Arg::list(std::move(items)), Arg::integer(d_.cat_dim[vi])},
                              {{fresh(combinedName(vi)), instantiate(val.type, sym_, d_.total)}});
      const ir::Node& prod = g_.node(val.producer);
      addAttrs(c, prod.layer, prod.phase.value_or(Phase::Forward), std::nullopt);
      combined_[vi] = out_.node(c).outputs[0];
    }
  }

  // 6f. Note [Counted means]: the loss and the gradients over the total count.
  void divideByTotalCount() {
    for (size_t vi = 0; vi < g_.numValues(); ++vi) {
      if (!divided(vi) || combined_[vi] == ir::kNoId) continue;
      const ir::Value& val = g_.value(static_cast<ValueId>(vi));
      const ir::Node& prod = g_.node(val.producer);
      NodeId q = out_.addNode("aten::div.Tensor", {Arg::value(combined_[vi]), Arg::value(total_count_)},
                              {{fresh(val.name), out_.value(combined_[vi]).type}});
      addAttrs(q, prod.layer, prod.phase.value_or(Phase::Forward), std::nullopt);
      combined_[vi] = out_.node(q).outputs[0];
    }
  }

  // 6g. Deferred batch norms: the running statistics from the whole batch's
  // mean and unbiased variance, combined from the micro-batches' statistics.
  void combineDeferredBatchNorms() {
    for (size_t n = 0; n < g_.numNodes(); ++n) {
      if (isDeferredBn(static_cast<NodeId>(n))) combineBatchNorm(n);
    }
  }
  void combineBatchNorm(size_t n) {
    const ir::Node& nd = g_.nodes()[n];
    ValueId rm_out = nd.outputs[3], rv_out = nd.outputs[4];
    if (d_.combine[static_cast<size_t>(rm_out)] != Combine::RunningStat &&
        d_.combine[static_cast<size_t>(rv_out)] != Combine::RunningStat) {
      return;  // the running statistics are not used
    }
    const std::vector<NodeId>& copies = bn_copies_[n];
    if (copies.size() == 1) {  // one micro-batch: the copy's own update is the batch's
      combined_[static_cast<size_t>(rm_out)] = out_.node(copies[0]).outputs[3];
      combined_[static_cast<size_t>(rv_out)] = out_.node(copies[0]).outputs[4];
      return;
    }
    const ir::Type& xt = g_.value(nd.args[0].toValue()).type;
    int64_t inner = 1;  // elements per channel and sample
    for (size_t i = 2; i < xt.shape.size(); ++i) inner *= xt.shape[i].size;
    const double total_n = static_cast<double>(d_.total * inner);
    MP_CHECK(total_n > 1, UnsupportedOpError,
             "{}: graph @{}: {} has {} value per channel in the batch; batch norm needs more",
             kWho, g_.name(), ref(static_cast<NodeId>(n)), total_n);
    const double momentum = nd.args[6].kind() == Arg::Kind::Int
                                ? static_cast<double>(nd.args[6].toInt()) : nd.args[6].toDouble();
    const double eps = nd.args[7].kind() == Arg::Kind::Int
                           ? static_cast<double>(nd.args[7].toInt()) : nd.args[7].toDouble();
    const Type stat_type = out_.value(out_.node(copies[0]).outputs[1]).type;
    const std::string& base = g_.value(rm_out).name;
    auto add = [&](std::string_view op, std::vector<Arg> args, const std::string& name) {
      NodeId a = out_.addNode(op, std::move(args), {{fresh(name), stat_type}});
      addAttrs(a, nd.layer, Phase::Forward, std::nullopt);
      return out_.node(a).outputs[0];
    };
    auto weighted = [&](ValueId acc_v, ValueId term, double w, const std::string& name) {
      if (acc_v == ir::kNoId) return add("aten::mul.Scalar", {Arg::value(term), Arg::floating(w)}, name);
      return add("aten::add.Tensor",
                 {Arg::value(acc_v), Arg::value(term), Arg::floating(w).withKeyword("alpha")}, name);
    };
    // M = Σ n_k·mean_k / N; V = Σ n_k·(var_k + (mean_k - M)^2) / N.
    ValueId mean = ir::kNoId, var = ir::kNoId;
    for (size_t k = 0; k < copies.size(); ++k) {
      const double wk = static_cast<double>(d_.sizes[k] * inner) / total_n;
      mean = weighted(mean, out_.node(copies[k]).outputs[1], wk,
                      fmt::format("{}.batch_mean{}", base, k + 1 == copies.size() ? "" : fmt::format(".acc{}", k)));
    }
    for (size_t k = 0; k < copies.size(); ++k) {
      const ValueId mean_k = out_.node(copies[k]).outputs[1];  // no reference: add() grows out_
      const ValueId rstd_k = out_.node(copies[k]).outputs[2];
      const std::string pre = fmt::format("{}.mb{}", base, k);
      ValueId r2 = add("aten::pow.Tensor_Scalar", {Arg::value(rstd_k), Arg::integer(-2)}, pre + ".rstd_m2");
      ValueId vk = add("aten::sub.Scalar", {Arg::value(r2), Arg::floating(eps)}, pre + ".var");
      ValueId dk = add("aten::sub.Tensor", {Arg::value(mean_k), Arg::value(mean)}, pre + ".dev");
      ValueId d2 = add("aten::mul.Tensor", {Arg::value(dk), Arg::value(dk)}, pre + ".dev2");
      ValueId tk = add("aten::add.Tensor", {Arg::value(vk), Arg::value(d2)}, pre + ".spread");
      const double wk = static_cast<double>(d_.sizes[k] * inner) / total_n;
      var = weighted(var, tk, wk,
                     fmt::format("{}.batch_var{}", base, k + 1 == copies.size() ? "" : fmt::format(".acc{}", k)));
    }
    ValueId unbiased = add("aten::mul.Scalar", {Arg::value(var), Arg::floating(total_n / (total_n - 1))},
                           base + ".batch_var_unbiased");
    auto update = [&](ValueId running, ValueId stat, ValueId orig) {
      ValueId kept = add("aten::mul.Scalar", {sharedLookup(running), Arg::floating(1.0 - momentum)},
                         g_.value(orig).name + ".kept");
      combined_[static_cast<size_t>(orig)] =
          add("aten::add.Tensor",
              {Arg::value(kept), Arg::value(stat), Arg::floating(momentum).withKeyword("alpha")},
              g_.value(orig).name);
    };
    update(nd.args[3].toValue(), mean, rm_out);
    update(nd.args[4].toValue(), unbiased, rv_out);
  }

  // 6i. The graph's outputs.
  void setOutputs() {
    std::vector<ValueId> outputs;
    for (ValueId v : g_.outputs()) {
      // The batch size returned as it is (a decode step with a static KV
      // cache returns it): the input that carries it, which the nodes read
      // as a number.
      if (d_.batch.isSizeInput(v)) {
        outputs.push_back(shared_[static_cast<size_t>(v)]);
        continue;
      }
      Arg a = sharedLookup(v);
      MP_INTERNAL_ASSERT(a.isValue(), "microbatch: output %{} is not a value", g_.value(v).name);
      outputs.push_back(a.toValue());
    }
    out_.setOutputs(std::move(outputs));
  }

  const ir::Graph& g_;
  const MicrobatchOptions& o_;
  const Decision& d_;
  const std::string& sym_;
  ir::Graph out_;
  // Per value of g_: its copy outside the micro-batches, and what the
  // micro-batches' copies combine into.
  std::vector<ValueId> shared_, combined_;
  std::vector<NodeId> first_reader_;
  std::vector<bool> is_sliced_;
  std::vector<char> from_seed_;
  ValueId total_count_ = ir::kNoId;
  std::vector<ValueId> acc_;                   // per value: the running sum
  std::vector<std::vector<ValueId>> parts_;    // per value: the micro-batches' copies
  std::vector<std::vector<NodeId>> bn_copies_; // per deferred batch norm: its copies
};

}  // namespace

// 6. The new graph (SplitGraphBuilder above).
ir::Graph Microbatcher::build() { return SplitGraphBuilder(g_, o_, d_).run(); }

}  // namespace modelpar::passes::microbatch_detail
