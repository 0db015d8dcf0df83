// Pass `microbatch` (microbatch.h). Steps: 1. options and the batch symbol;
// 2. which nodes run per micro-batch, once before, or after; 3. the loss,
// its reduction and the backward seed; 4. what leaves the micro-batches and
// how it is combined; 5. the checks that make the split exact; 6. the new
// graph. Everything is decided before the new graph is built.
#include "passes/microbatch.h"

#include <algorithm>
#include <cmath>

#include "ir/check.h"
#include "passes/batch_symbol.h"
#include "passes/op_family.h"

namespace modelpar::passes {
namespace {

using ir::Arg;
using ir::NodeId;
using ir::Phase;
using ir::Type;
using ir::ValueId;

constexpr std::string_view kWho = "modelpar microbatch";

bool isRandomOp(std::string_view op) {
  static constexpr std::string_view kRandom[] = {
      "aten::native_dropout", "aten::dropout", "aten::feature_dropout", "aten::alpha_dropout",
      "aten::feature_alpha_dropout", "aten::bernoulli", "aten::bernoulli_", "aten::rand",
      "aten::rand_like", "aten::randn", "aten::randn_like", "aten::randint", "aten::randint_like",
      "aten::randperm", "aten::multinomial", "aten::normal", "aten::normal_", "aten::uniform_",
      "aten::exponential_", "aten::geometric_", "aten::cauchy_", "aten::log_normal_",
      "aten::random_", "aten::rrelu", "aten::rrelu_with_noise", "aten::poisson"};
  return std::find(std::begin(kRandom), std::end(kRandom), op) != std::end(kRandom);
}

/// Rewrites the value references of `a` (lists included) through `lookup`,
/// which may turn one into a constant (the batch size input -> b_k).
template <typename F>
void rewriteArgs(Arg& a, F&& lookup) {
  if (a.isValue()) {
    std::string keyword = a.keyword();
    a = lookup(a.toValue());
    if (!keyword.empty()) a.withKeyword(std::move(keyword));
  }
  for (Arg& item : a.items()) rewriteArgs(item, lookup);
}

/// What to say when a batch-norm op's statistics stop the split.
std::string_view batchNormHint(std::string_view op) {
  if (op.find("batch_norm") == std::string_view::npos) return "";
  return " (batch norm computes its statistics per micro-batch; deferred batch norm is not "
         "supported yet: use eval-mode batch norm, group or layer norm, or one micro-batch)";
}

bool isSeedOp(std::string_view op) {
  return op == "aten::ones_like" || op == "aten::full_like" || op == "aten::new_ones" ||
         op == "aten::new_full";
}

/// Index of the `reduction` argument of the loss ops that have one.
std::optional<size_t> reductionArgIndex(std::string_view op) {
  static const std::pair<std::string_view, size_t> kLosses[] = {
      {"aten::mse_loss", 2}, {"aten::l1_loss", 2}, {"aten::smooth_l1_loss", 2},
      {"aten::huber_loss", 2}, {"aten::kl_div", 2}, {"aten::soft_margin_loss", 2},
      {"aten::nll_loss", 3}, {"aten::nll_loss_forward", 3}, {"aten::nll_loss2d", 3},
      {"aten::nll_loss2d_forward", 3}, {"aten::nll_loss_nd", 3}, {"aten::cross_entropy_loss", 3},
      {"aten::binary_cross_entropy", 3}, {"aten::binary_cross_entropy_with_logits", 4},
      {"aten::multilabel_margin_loss", 2}, {"aten::multi_margin_loss", 5},
      {"aten::hinge_embedding_loss", 3}, {"aten::poisson_nll_loss", 5}};
  for (auto [name, idx] : kLosses) {
    if (op == name) return idx;
  }
  return std::nullopt;
}

/// Ops that keep the loss a weighted sum of its micro-batch parts: x -> c·x
/// and sums of such terms (checked further in checkLossPath).
bool isLinearOp(std::string_view op) {
  static constexpr std::string_view kLinear[] = {
      "aten::add", "aten::sub", "aten::mul", "aten::div", "aten::neg", "aten::clone",
      "aten::alias", "aten::view", "aten::reshape", "aten::squeeze", "aten::unsqueeze",
      "aten::_to_copy", "aten::to", "aten::detach", "aten::sum", "aten::mean", "aten::_unsafe_view",
      "aten::lift_fresh_copy"};
  return std::find(std::begin(kLinear), std::end(kLinear), op) != std::end(kLinear);
}

enum class Where : uint8_t { Shared, PerMb, Post };
enum class Combine : uint8_t { None, Cat, Loss, Accumulate };

struct Decision {
  BatchSymbol batch;
  std::vector<int64_t> sizes;
  int64_t total = 0;
  std::vector<Where> where;          // per node
  std::vector<char> per_mb_value;    // per value: produced per micro-batch
  std::vector<Combine> combine;      // per value
  std::vector<int> cat_dim;          // per value
  ValueId loss = ir::kNoId, seed = ir::kNoId;
  bool seed_is_root = false;         // an input or shared value, scaled per micro-batch
  bool mean = false;
  double weight(size_t k) const {
    return mean ? static_cast<double>(sizes[k]) / static_cast<double>(total) : 1.0;
  }
};

class Microbatcher {
 public:
  Microbatcher(const ir::Graph& g, const MicrobatchOptions& o)
      : g_(g), o_(o), users_(g.users()), is_output_(g.numValues(), 0) {
    for (ValueId v : g.outputs()) is_output_[static_cast<size_t>(v)] = 1;
  }

  ir::Graph run() {
    // 1. Options and the batch symbol.
    MP_CHECK(o_.batch_size.has_value(), ConfigError,
             "{}: graph @{}: batch_size is required (the full batch B the graph is split from)",
             kWho, g_.name());
    d_.total = *o_.batch_size;
    d_.sizes = microbatchSizes(d_.total, o_.microbatches);
    d_.batch = findBatchSymbol(g_, o_.batch_symbol, o_.batch_dims);
    // 2. - 5.
    classify(/*seed_root=*/ir::kNoId);
    findLossAndSeed();
    if (d_.seed_is_root) classify(d_.seed);
    decideCombinations();
    checkExactness();
    // 6.
    return build();
  }

 private:
  const ir::Node& producerOf(ValueId v) const { return g_.node(g_.value(v).producer); }
  bool producedPerMb(ValueId v) const { return d_.per_mb_value[static_cast<size_t>(v)] != 0; }
  bool hasBatchDim(ValueId v) const { return batchDimOf(g_.value(v).type, d_.batch.symbol) >= 0; }
  Phase phaseOf(ValueId v) const {
    const ir::Value& val = g_.value(v);
    if (val.producer == ir::kNoId) return Phase::Forward;
    return g_.node(val.producer).phase.value_or(Phase::Forward);
  }
  std::string ref(NodeId n) const {
    const ir::Node& nd = g_.node(n);
    return fmt::format("{} = {}", g_.nodeRef(n), nd.qualifiedName());
  }

  // 2. Per micro-batch: not an update node and reads a batched input, the size
  // input, the seed root, or a per-micro-batch value. After: update nodes and
  // what reads their results. Shared: the rest.
  void classify(ValueId seed_root) {
    d_.where.assign(g_.numNodes(), Where::Shared);
    d_.per_mb_value.assign(g_.numValues(), 0);
    std::vector<char> root(g_.numValues(), 0), post_value(g_.numValues(), 0);
    for (size_t i = 0; i < g_.inputs().size(); ++i) {
      if (d_.batch.input_dim[i] >= 0) root[static_cast<size_t>(g_.inputs()[i].value)] = 1;
    }
    if (d_.batch.size_input != ir::kNoId) root[static_cast<size_t>(d_.batch.size_input)] = 1;
    if (seed_root != ir::kNoId) root[static_cast<size_t>(seed_root)] = 1;
    for (size_t n = 0; n < g_.numNodes(); ++n) {
      const ir::Node& nd = g_.nodes()[n];
      bool batched = false, after = nd.phase == Phase::Update;
      for (ValueId v : nd.inputs()) {
        auto vi = static_cast<size_t>(v);
        batched |= root[vi] || d_.per_mb_value[vi];
        after |= post_value[vi] != 0;
      }
      Where w = after ? Where::Post : batched ? Where::PerMb : Where::Shared;
      if (after && batched) {
        for (ValueId v : nd.inputs()) {
          MP_CHECK(!post_value[static_cast<size_t>(v)] || nd.phase == Phase::Update,
                   UnsupportedOpError,
                   "{}: graph @{}: node {} reads batched data and %{}, which is only known after "
                   "the gradients of all micro-batches are combined (an update-phase result); "
                   "mark the node phase=update or move it out of the step",
                   kWho, g_.name(), ref(static_cast<NodeId>(n)), g_.value(v).name);
        }
      }
      d_.where[n] = w;
      for (ValueId o : nd.outputs) {
        d_.per_mb_value[static_cast<size_t>(o)] = w == Where::PerMb;
        post_value[static_cast<size_t>(o)] = w == Where::Post;
      }
    }
  }

  // 3. The loss: a scalar forward output computed per micro-batch.
  void findLossAndSeed() {
    std::vector<ValueId> candidates;
    for (ValueId v : g_.outputs()) {
      const ir::Value& val = g_.value(v);
      if (val.producer == ir::kNoId || !producedPerMb(v) || !val.type.isTensor()) continue;
      if (phaseOf(v) != Phase::Forward || val.type.numel() != std::optional<int64_t>(1)) continue;
      if (std::find(candidates.begin(), candidates.end(), v) == candidates.end()) {
        candidates.push_back(v);
      }
    }
    auto seedNodeOf = [&](ValueId loss) -> ValueId {
      for (NodeId u : users_[static_cast<size_t>(loss)]) {
        const ir::Node& nd = g_.node(u);
        if (nd.phase == Phase::Backward && isSeedOp(nd.op) && nd.outputs.size() == 1) {
          return nd.outputs[0];
        }
      }
      return ir::kNoId;
    };
    if (!o_.loss.empty()) {
      std::optional<ValueId> v = g_.findValue(o_.loss);
      MP_CHECK(v && is_output_[static_cast<size_t>(*v)], ConfigError,
               "{}: graph @{}: loss '{}' is not a graph output", kWho, g_.name(), o_.loss);
      MP_CHECK(producedPerMb(*v), ConfigError,
               "{}: graph @{}: loss %{} does not depend on the batched inputs", kWho, g_.name(),
               o_.loss);
      d_.loss = *v;
    } else {
      std::vector<ValueId> seeded;
      for (ValueId v : candidates) {
        if (seedNodeOf(v) != ir::kNoId) seeded.push_back(v);
      }
      if (seeded.size() == 1) {
        d_.loss = seeded[0];
      } else if (seeded.empty() && candidates.size() == 1) {
        d_.loss = candidates[0];
      } else if (!candidates.empty()) {
        std::string names;
        for (ValueId v : candidates) names += (names.empty() ? "%" : ", %") + g_.value(v).name;
        MP_THROW(ConfigError,
                 "{}: graph @{}: cannot tell which output is the loss among {}; set the loss "
                 "option to its name",
                 kWho, g_.name(), names);
      } else {
        // A loss that is not returned: the one scalar a seed op reads.
        std::vector<ValueId> read;
        for (size_t vi = 0; vi < g_.numValues(); ++vi) {
          auto v = static_cast<ValueId>(vi);
          const Type& t = g_.value(v).type;
          if (producedPerMb(v) && t.isTensor() && t.numel() == std::optional<int64_t>(1) &&
              phaseOf(v) == Phase::Forward && seedNodeOf(v) != ir::kNoId) {
            read.push_back(v);
          }
        }
        if (read.size() == 1) d_.loss = read[0];
      }
    }
    // The seed: the ones_like(loss) node, a named value, or a tangent input.
    if (!o_.seed.empty()) {
      std::optional<ValueId> v = g_.findValue(o_.seed);
      MP_CHECK(v.has_value(), ConfigError, "{}: graph @{}: seed '{}' is not a value", kWho,
               g_.name(), o_.seed);
      d_.seed = *v;
    } else if (d_.loss != ir::kNoId && seedNodeOf(d_.loss) != ir::kNoId) {
      d_.seed = seedNodeOf(d_.loss);
    } else {
      std::vector<ValueId> tangents;
      for (size_t i = 0; i < g_.inputs().size(); ++i) {
        const ir::Input& in = g_.inputs()[i];
        const Type& t = g_.value(in.value).type;
        const auto& us = users_[static_cast<size_t>(in.value)];
        if (in.role != ir::InputRole::Input || d_.batch.input_dim[i] >= 0 || !t.isTensor() ||
            t.numel() != std::optional<int64_t>(1) || us.empty()) {
          continue;
        }
        bool bwd_only = std::all_of(us.begin(), us.end(), [&](NodeId u) {
          return g_.node(u).phase == Phase::Backward;
        });
        if (bwd_only) tangents.push_back(in.value);
      }
      MP_CHECK(tangents.size() <= 1, ConfigError,
               "{}: graph @{}: {} scalar inputs read only by the backward (%{}, %{}, ...) could "
               "each be the backward seed; set the seed option to the loss's",
               kWho, g_.name(), tangents.size(), g_.value(tangents[0]).name,
               g_.value(tangents[1]).name);
      if (!tangents.empty()) d_.seed = tangents[0];
    }
    if (d_.seed != ir::kNoId) {
      const ir::Value& s = g_.value(d_.seed);
      d_.seed_is_root = !producedPerMb(d_.seed);
      MP_CHECK(s.type.isTensor() && !hasBatchDim(d_.seed), ConfigError,
               "{}: graph @{}: seed %{} of type {} is not an unbatched tensor", kWho, g_.name(),
               s.name, ir::toString(s.type));
    }
    MP_CHECK(d_.seed == ir::kNoId || d_.loss != ir::kNoId ||
                 o_.loss_reduction != LossReduction::Auto || d_.sizes.size() == 1,
             ConfigError,
             "{}: graph @{}: found the backward seed %{} but not the loss, so its reduction over "
             "the batch (the seed's weight per micro-batch) is unknown; set loss or "
             "loss_reduction",
             kWho, g_.name(), g_.value(d_.seed).name);
    d_.mean = o_.loss_reduction == LossReduction::Mean;
    if (d_.loss != ir::kNoId && o_.loss_reduction == LossReduction::Auto) {
      d_.mean = detectMean();
    }
  }

  // The forward values the loss is a linear function of, back to the ops that
  // reduce over the batch (their inputs carry the batch dimension).
  std::vector<char> lossPath() const {
    std::vector<char> on(g_.numValues(), 0);
    if (d_.loss == ir::kNoId) return on;
    on[static_cast<size_t>(d_.loss)] = 1;
    for (size_t n = g_.numNodes(); n-- > 0;) {
      const ir::Node& nd = g_.nodes()[n];
      bool produces = std::any_of(nd.outputs.begin(), nd.outputs.end(),
                                  [&](ValueId o) { return on[static_cast<size_t>(o)] != 0; });
      if (!produces || isReducer(static_cast<NodeId>(n))) continue;
      for (ValueId v : nd.inputs()) {
        const Type& t = g_.value(v).type;
        if (producedPerMb(v) && t.isTensor() && !hasBatchDim(v) && phaseOf(v) == Phase::Forward) {
          on[static_cast<size_t>(v)] = 1;
        }
      }
    }
    return on;
  }
  bool isReducer(NodeId n) const {
    for (ValueId v : g_.node(n).inputs()) {
      if (g_.value(v).type.isTensor() && hasBatchDim(v)) return true;
    }
    return false;
  }

  bool detectMean() const {
    std::vector<char> on = lossPath();
    std::optional<bool> mean;
    NodeId first = ir::kNoId;
    for (size_t n = 0; n < g_.numNodes(); ++n) {
      const ir::Node& nd = g_.nodes()[n];
      bool produces = std::any_of(nd.outputs.begin(), nd.outputs.end(),
                                  [&](ValueId o) { return on[static_cast<size_t>(o)] != 0; });
      if (!produces || !isReducer(static_cast<NodeId>(n))) continue;
      bool m = reducerIsMean(static_cast<NodeId>(n));
      MP_CHECK(!mean || *mean == m, UnsupportedOpError,
               "{}: graph @{}: the loss %{} mixes a mean ({}) and a sum ({}) over the batch; "
               "micro-batch losses then have no common weight. Use one reduction",
               kWho, g_.name(), g_.value(d_.loss).name, ref(m ? static_cast<NodeId>(n) : first),
               ref(m ? first : static_cast<NodeId>(n)));
      mean = m;
      first = static_cast<NodeId>(n);
    }
    MP_CHECK(mean.has_value(), ConfigError,
             "{}: graph @{}: found no op reducing the batch into the loss %{}; set loss_reduction "
             "to mean or sum",
             kWho, g_.name(), g_.value(d_.loss).name);
    return *mean;
  }

  bool reducerIsMean(NodeId n) const {
    const ir::Node& nd = g_.node(n);
    if (nd.op == "aten::mean") return true;
    if (nd.op == "aten::sum") return false;
    std::optional<size_t> idx = reductionArgIndex(nd.op);
    MP_CHECK(idx.has_value(), UnsupportedOpError,
             "{}: graph @{}: cannot tell how {} reduces the batch into the loss %{}; set "
             "loss_reduction to mean or sum",
             kWho, g_.name(), ref(n), g_.value(d_.loss).name);
    int64_t reduction = 1;  // every loss op's default is mean
    size_t positional = 0;
    for (const Arg& a : nd.args) {
      bool hit = a.keyword().empty() ? positional++ == *idx : a.keyword() == "reduction";
      if (hit && a.kind() == Arg::Kind::Int) reduction = a.toInt();
    }
    MP_CHECK(reduction == 1 || reduction == 2, UnsupportedOpError,
             "{}: graph @{}: {} has reduction={} (none) but its result is the loss %{}",
             kWho, g_.name(), ref(n), reduction, g_.value(d_.loss).name);
    if (reduction == 1 && nd.op.find("nll_loss") != std::string::npos && nd.args.size() > 2) {
      MP_CHECK(nd.args[2].isNone(), UnsupportedOpError,
               "{}: graph @{}: {} averages with class weights, a weighted mean that is not "
               "b_k/B times the micro-batch means; use reduction=sum and divide by the weights",
               kWho, g_.name(), ref(n));
    }
    return reduction == 1;
  }

  // 4. Values leaving the micro-batches: read by a node after them, or returned.
  void decideCombinations() {
    d_.combine.assign(g_.numValues(), Combine::None);
    d_.cat_dim.assign(g_.numValues(), -1);
    for (size_t vi = 0; vi < g_.numValues(); ++vi) {
      auto v = static_cast<ValueId>(vi);
      if (!producedPerMb(v)) continue;
      NodeId reader = ir::kNoId;
      for (NodeId u : users_[vi]) {
        if (d_.where[static_cast<size_t>(u)] == Where::Post) reader = u;
      }
      if (reader == ir::kNoId && !is_output_[vi]) continue;
      const ir::Value& val = g_.value(v);
      std::string who = reader == ir::kNoId ? std::string("returned")
                                            : fmt::format("read by {}", ref(reader));
      MP_CHECK(val.type.isTensor(), UnsupportedOpError,
               "{}: graph @{}: %{} ({}), computed from the batch size, is {} after the "
               "micro-batches; its value differs per micro-batch",
               kWho, g_.name(), val.name, ir::toString(val.type), who);
      int dim = batchDimOf(val.type, d_.batch.symbol);
      if (dim >= 0) {
        d_.combine[vi] = Combine::Cat;
        d_.cat_dim[vi] = dim;
      } else if (v == d_.loss) {
        d_.combine[vi] = Combine::Loss;
      } else if (phaseOf(v) == Phase::Backward) {
        d_.combine[vi] = Combine::Accumulate;
      } else {
        MP_THROW(UnsupportedOpError,
                 "{}: graph @{}: %{} = {} has no batch dimension but is computed from batched "
                 "data in the forward and {} after the micro-batches, and it is not the loss{}; "
                 "its micro-batch values do not combine into the full batch's{}",
                 kWho, g_.name(), val.name, producerOf(v).qualifiedName(), who,
                 d_.loss == ir::kNoId ? " (no loss found: set the loss option)" : "",
                 batchNormHint(producerOf(v).op));
      }
    }
    bool gradients = std::any_of(d_.combine.begin(), d_.combine.end(),
                                 [](Combine c) { return c == Combine::Accumulate; });
    MP_CHECK(!gradients || d_.seed != ir::kNoId || d_.sizes.size() == 1 || !d_.mean, ConfigError,
             "{}: graph @{}: gradients are accumulated over micro-batches of a mean loss, but no "
             "backward seed was found (a bwd ones_like(loss) node or a scalar tangent input); set "
             "the seed option",
             kWho, g_.name());
  }

  // 5. Random ops, in-place ops on shared values, batch statistics, the loss path.
  void checkExactness() const {
    std::vector<char> on = lossPath();
    for (size_t n = 0; n < g_.numNodes(); ++n) {
      if (d_.where[n] != Where::PerMb) continue;
      const ir::Node& nd = g_.nodes()[n];
      auto id = static_cast<NodeId>(n);
      MP_CHECK(o_.allow_random || !isRandomOp(nd.op), UnsupportedOpError,
               "{}: graph @{}: {} draws random numbers per micro-batch, so its mask / samples "
               "differ from the full batch's; set allow_random to accept that",
               kWho, g_.name(), ref(id));
      if (isInPlaceOp(nd.op) && !nd.args.empty()) {
        nd.args[0].forEachValue([&](ValueId v) {
          bool per_mb = producedPerMb(v) || (g_.inputIndex(v) &&
                                             d_.batch.input_dim[*g_.inputIndex(v)] >= 0);
          MP_CHECK(per_mb, UnsupportedOpError,
                   "{}: graph @{}: in-place {} in the micro-batches mutates %{}, which all "
                   "micro-batches share; write it out of place",
                   kWho, g_.name(), ref(id), g_.value(v).name);
        });
      }
      bool on_path = std::any_of(nd.outputs.begin(), nd.outputs.end(),
                                 [&](ValueId o) { return on[static_cast<size_t>(o)] != 0; });
      if (on_path && !isReducer(id)) checkLinear(id, on);
      if (on_path || nd.phase.value_or(Phase::Forward) != Phase::Forward) continue;
      for (ValueId o : nd.outputs) {
        const Type& t = g_.value(o).type;
        if (!t.isTensor() || hasBatchDim(o)) continue;
        MP_THROW(UnsupportedOpError,
                 "{}: graph @{}: %{} = {} reduces over the batch in the forward and is not the "
                 "loss: per micro-batch it would differ from the full batch's{}",
                 kWho, g_.name(), g_.value(o).name, nd.qualifiedName(), batchNormHint(nd.op));
      }
    }
  }

  // A node between the batch reduction and the loss must keep the loss a
  // weighted sum: an add/sub of loss terms (a constant term only when the
  // weights sum to 1, i.e. a mean), a product with one loss factor, ...
  void checkLinear(NodeId n, const std::vector<char>& on) const {
    const ir::Node& nd = g_.node(n);
    int loss_operands = 0, other_batched = 0;
    for (ValueId v : nd.inputs()) {
      if (on[static_cast<size_t>(v)]) {
        ++loss_operands;
      } else if (producedPerMb(v)) {
        ++other_batched;
      }
    }
    bool additive = nd.op == "aten::add" || nd.op == "aten::sub";
    bool ok = isLinearOp(nd.op) && other_batched == 0 &&
              (additive ? (nd.overload == "Tensor" && loss_operands == 2) || d_.mean
                        : loss_operands == 1);
    MP_CHECK(ok, UnsupportedOpError,
             "{}: graph @{}: the loss %{} is not a weighted sum of micro-batch losses: {} lies "
             "between the batch reduction and the loss; reduce the batch last",
             kWho, g_.name(), g_.value(d_.loss).name, ref(n));
  }

  ir::Graph build();

  const ir::Graph& g_;
  const MicrobatchOptions& o_;
  std::vector<std::vector<NodeId>> users_;
  std::vector<char> is_output_;
  Decision d_;
};

// 6. The new graph: shared nodes, then per micro-batch (slices, seed scale,
// copies, gradient and loss accumulation), then concatenations, then the
// nodes after the micro-batches.
ir::Graph Microbatcher::build() {
  const std::string& sym = d_.batch.symbol;
  const size_t nmb = d_.sizes.size();
  ir::Graph out(g_.name());
  auto fresh = [&](const std::string& base) {
    std::string name = base;
    for (int i = 1; out.findValue(name); ++i) name = fmt::format("{}_{}", base, i);
    return name;
  };
  std::vector<ValueId> shared(g_.numValues(), ir::kNoId), combined(g_.numValues(), ir::kNoId);
  for (const ir::Input& in : g_.inputs()) {
    const ir::Value& v = g_.value(in.value);
    shared[static_cast<size_t>(in.value)] =
        out.addInput(v.name, instantiate(v.type, sym, d_.total), in.role, in.device);
  }
  // Copies node n reading through `lookup`; returns the new node.
  auto copyNode = [&](const ir::Node& nd, auto&& lookup, const std::string& suffix,
                      std::optional<int64_t> b) {
    std::vector<Arg> args = nd.args;
    for (Arg& a : args) rewriteArgs(a, lookup);
    std::vector<std::pair<std::string, Type>> outs;
    for (ValueId o : nd.outputs) {
      const ir::Value& v = g_.value(o);
      outs.emplace_back(fresh(v.name + suffix), instantiate(v.type, sym, b.value_or(d_.total)));
    }
    NodeId n = out.addNode(nd.qualifiedName(), std::move(args), std::move(outs));
    ir::Node& c = out.node(n);
    c.layer = nd.layer;
    c.phase = nd.phase;
    c.device = nd.device;
    if (!nd.label.empty()) {
      std::string label = nd.label + suffix;
      for (int i = 1; out.findLabel(label); ++i) label = fmt::format("{}{}_{}", nd.label, suffix, i);
      out.setLabel(n, label);
    }
    return n;
  };
  auto addAttrs = [&](NodeId n, std::string layer, Phase phase, std::optional<int> mb) {
    out.node(n).layer = std::move(layer);
    out.node(n).phase = phase;
    out.node(n).microbatch = mb;
  };
  auto sharedLookup = [&](ValueId v) -> Arg {
    if (v == d_.batch.size_input) return Arg::integer(d_.total);
    ValueId c = combined[static_cast<size_t>(v)];
    MP_INTERNAL_ASSERT(c != ir::kNoId || shared[static_cast<size_t>(v)] != ir::kNoId,
                       "microbatch: %{} has no copy", g_.value(v).name);
    return Arg::value(c != ir::kNoId ? c : shared[static_cast<size_t>(v)]);
  };

  for (size_t n = 0; n < g_.numNodes(); ++n) {
    if (d_.where[n] != Where::Shared) continue;
    const ir::Node& nd = g_.nodes()[n];
    NodeId c = copyNode(nd, sharedLookup, "", std::nullopt);
    out.node(c).cost = nd.cost;
    for (size_t i = 0; i < nd.outputs.size(); ++i) {
      shared[static_cast<size_t>(nd.outputs[i])] = out.node(c).outputs[i];
    }
  }

  // First per-micro-batch reader of each value (the layer of slices, scales).
  std::vector<NodeId> first_reader(g_.numValues(), ir::kNoId);
  for (size_t n = g_.numNodes(); n-- > 0;) {
    if (d_.where[n] != Where::PerMb) continue;
    for (ValueId v : g_.nodes()[n].inputs()) first_reader[static_cast<size_t>(v)] = static_cast<NodeId>(n);
  }
  auto layerOfReader = [&](ValueId v) {
    NodeId r = first_reader[static_cast<size_t>(v)];
    return r == ir::kNoId ? std::string() : g_.node(r).layer;
  };

  std::vector<ValueId> acc(g_.numValues(), ir::kNoId);
  std::vector<std::vector<ValueId>> parts(g_.numValues());
  int64_t start = 0;
  for (size_t k = 0; k < nmb; ++k) {
    const int64_t bk = d_.sizes[k];
    const auto mb = static_cast<int>(k);
    const std::string suffix = fmt::format(".mb{}", k);
    const double w = d_.weight(k);
    const bool last = k + 1 == nmb;
    std::vector<ValueId> local(g_.numValues(), ir::kNoId);
    auto scaleSeed = [&](ValueId v, const std::string& name, const std::string& layer) {
      if (w == 1.0) return v;
      NodeId s = out.addNode("aten::mul.Scalar", {Arg::value(v), Arg::floating(w)},
                             {{fresh(name), out.value(v).type}});
      addAttrs(s, layer, Phase::Backward, mb);
      return out.node(s).outputs[0];
    };
    // Slices of the batched inputs, the scaled seed root.
    for (size_t i = 0; i < g_.inputs().size(); ++i) {
      ValueId v = g_.inputs()[i].value;
      int dim = d_.batch.input_dim[i];
      if (dim < 0 || first_reader[static_cast<size_t>(v)] == ir::kNoId) continue;
      const ir::Value& val = g_.value(v);
      NodeId s = out.addNode("aten::narrow",
                             {Arg::value(shared[static_cast<size_t>(v)]), Arg::integer(dim),
                              Arg::integer(start), Arg::integer(bk)},
                             {{fresh(val.name + suffix), instantiate(val.type, sym, bk)}});
      addAttrs(s, layerOfReader(v), Phase::Forward, mb);
      local[static_cast<size_t>(v)] = out.node(s).outputs[0];
    }
    if (d_.seed_is_root) {
      ValueId s = shared[static_cast<size_t>(d_.seed)];
      local[static_cast<size_t>(d_.seed)] =
          scaleSeed(s, g_.value(d_.seed).name + suffix, layerOfReader(d_.seed));
    }
    auto lookup = [&](ValueId v) -> Arg {
      if (v == d_.batch.size_input) return Arg::integer(bk);
      ValueId l = local[static_cast<size_t>(v)];
      return l != ir::kNoId ? Arg::value(l) : sharedLookup(v);
    };
    for (size_t n = 0; n < g_.numNodes(); ++n) {
      if (d_.where[n] != Where::PerMb) continue;
      const ir::Node& nd = g_.nodes()[n];
      NodeId c = copyNode(nd, lookup, suffix, bk);
      out.node(c).microbatch = mb;
      if (nd.cost) {  // a micro-batch does b_k/B of the work; weights count once
        ir::Cost cost = *nd.cost;
        double f = static_cast<double>(bk) / static_cast<double>(d_.total);
        cost.time_us *= f;
        cost.output_bytes = static_cast<int64_t>(std::llround(static_cast<double>(cost.output_bytes) * f));
        cost.temp_bytes = static_cast<int64_t>(std::llround(static_cast<double>(cost.temp_bytes) * f));
        if (k > 0) cost.persistent_bytes = 0;
        out.node(c).cost = cost;
      }
      for (size_t i = 0; i < nd.outputs.size(); ++i) {
        ValueId o = nd.outputs[i];
        auto oi = static_cast<size_t>(o);
        ValueId copy = out.node(c).outputs[i];
        local[oi] = copy;
        const std::string& name = g_.value(o).name;
        if (o == d_.seed) local[oi] = scaleSeed(copy, name + suffix + ".scaled", nd.layer);
        switch (d_.combine[oi]) {
          case Combine::None: break;
          case Combine::Cat: parts[oi].push_back(copy); break;
          case Combine::Loss:
          case Combine::Accumulate: {
            double wk = d_.combine[oi] == Combine::Loss ? w : 1.0;
            std::string acc_name = last ? name : fmt::format("{}.acc{}", name, k);
            NodeId a = ir::kNoId;
            if (k == 0 && wk != 1.0) {
              a = out.addNode("aten::mul.Scalar", {Arg::value(copy), Arg::floating(wk)},
                              {{fresh(acc_name), out.value(copy).type}});
            } else if (k > 0) {
              std::vector<Arg> args{Arg::value(acc[oi]), Arg::value(copy)};
              if (wk != 1.0) args.push_back(Arg::floating(wk).withKeyword("alpha"));
              a = out.addNode("aten::add.Tensor", std::move(args),
                              {{fresh(acc_name), out.value(copy).type}});
            }
            if (a != ir::kNoId) addAttrs(a, nd.layer, nd.phase.value_or(Phase::Forward), mb);
            acc[oi] = a == ir::kNoId ? copy : out.node(a).outputs[0];
            if (last) combined[oi] = acc[oi];
            break;
          }
        }
      }
    }
    start += bk;
  }
  for (size_t vi = 0; vi < g_.numValues(); ++vi) {
    if (d_.combine[vi] != Combine::Cat) continue;
    if (parts[vi].size() == 1) {
      combined[vi] = parts[vi][0];
      continue;
    }
    const ir::Value& val = g_.value(static_cast<ValueId>(vi));
    std::vector<Arg> items;
    for (ValueId p : parts[vi]) items.push_back(Arg::value(p));
    NodeId c = out.addNode("aten::cat", {Arg::list(std::move(items)), Arg::integer(d_.cat_dim[vi])},
                           {{fresh(val.name), instantiate(val.type, sym, d_.total)}});
    const ir::Node& prod = g_.node(val.producer);
    addAttrs(c, prod.layer, prod.phase.value_or(Phase::Forward), std::nullopt);
    combined[vi] = out.node(c).outputs[0];
  }
  for (size_t n = 0; n < g_.numNodes(); ++n) {
    if (d_.where[n] != Where::Post) continue;
    const ir::Node& nd = g_.nodes()[n];
    NodeId c = copyNode(nd, sharedLookup, "", std::nullopt);
    out.node(c).cost = nd.cost;
    for (size_t i = 0; i < nd.outputs.size(); ++i) {
      shared[static_cast<size_t>(nd.outputs[i])] = out.node(c).outputs[i];
    }
  }
  std::vector<ValueId> outputs;
  for (ValueId v : g_.outputs()) {
    Arg a = sharedLookup(v);
    MP_INTERNAL_ASSERT(a.isValue(), "microbatch: output %{} is the batch size", g_.value(v).name);
    outputs.push_back(a.toValue());
  }
  out.setOutputs(std::move(outputs));
  return out;
}

}  // namespace

std::vector<int64_t> microbatchSizes(int64_t batch, int microbatches) {
  MP_CHECK(microbatches >= 1, ConfigError, "{}: microbatches must be >= 1, got {}", kWho,
           microbatches);
  MP_CHECK(batch >= 1, ConfigError, "{}: batch_size must be >= 1, got {}", kWho, batch);
  MP_CHECK(microbatches <= batch, ConfigError,
           "{}: {} micro-batches asked for a batch of {}: each micro-batch needs at least one "
           "sample; use at most {} micro-batches or a larger batch",
           kWho, microbatches, batch, batch);
  const int64_t chunk = (batch + microbatches - 1) / microbatches;
  std::vector<int64_t> sizes;
  for (int64_t s = 0; s < batch; s += chunk) sizes.push_back(std::min(chunk, batch - s));
  return sizes;
}

ir::Graph microbatch(const ir::Graph& g, const MicrobatchOptions& options) {
  return Microbatcher(g, options).run();
}

LossReduction parseLossReduction(std::string_view s) {
  if (s == "auto") return LossReduction::Auto;
  if (s == "mean") return LossReduction::Mean;
  if (s == "sum") return LossReduction::Sum;
  MP_THROW(ConfigError, "{}: loss_reduction '{}' is not one of auto, mean, sum", kWho, s);
}

}  // namespace modelpar::passes
