// Pass `microbatch` (microbatch.h), step 3: the loss, its reduction over the
// batch (the weight w_k of micro-batch k), the backward seed, and the check
// that the loss is a weighted sum of micro-batch losses.
#include <algorithm>

#include "ir/check.h"
#include "passes/pipeline/microbatch_impl.h"

namespace modelpar::passes::microbatch_detail {
namespace {

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

}  // namespace

// The value of the backward's seed op that reads `loss` (ones_like(loss)), or
// kNoId.
ValueId Microbatcher::seedNodeOf(ValueId loss) const {
  for (NodeId u : users_[static_cast<size_t>(loss)]) {
    const ir::Node& nd = g_.node(u);
    if (nd.phase == Phase::Backward && isSeedOp(nd.op) && nd.outputs.size() == 1) {
      return nd.outputs[0];
    }
  }
  return ir::kNoId;
}

// 3. The loss: a scalar forward output computed per micro-batch.
void Microbatcher::findLossAndSeed() {
  findLoss();
  findSeed();
  findReduction();
}

// 3. The loss: the loss option, the one output a seed op reads, the one
// candidate output, or the one scalar a seed op reads.
void Microbatcher::findLoss() {
  std::vector<ValueId> candidates;
  for (ValueId v : g_.outputs()) {
    const ir::Value& val = g_.value(v);
    if (val.producer == ir::kNoId || !producedPerMb(v) || !val.type.isTensor()) continue;
    if (phaseOf(v) != Phase::Forward || val.type.numel() != std::optional<int64_t>(1)) continue;
    if (std::find(candidates.begin(), candidates.end(), v) == candidates.end()) {
      candidates.push_back(v);
    }
  }
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
}

// 3. The seed: the ones_like(loss) node, a named value, or a tangent input.
void Microbatcher::findSeed() {
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
}

// 3. The reduction: whether the loss is a mean, and its counted reducer.
void Microbatcher::findReduction() {
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
  if (d_.mean && d_.sizes.size() > 1) {
    d_.counted = countedReducer();
    if (d_.counted != ir::kNoId) d_.count = g_.node(d_.counted).outputs[1];
  }
  // Class weights make a mean nll loss divide by the targets' weight: a
  // counted mean weighs each micro-batch by it; b_k/B weights cannot.
  if (d_.mean && d_.sizes.size() > 1 && d_.counted == ir::kNoId && d_.loss != ir::kNoId &&
      o_.loss_reduction == LossReduction::Auto) {
    for (NodeId n : lossReducers()) {
      const ir::Node& nd = g_.node(n);
      MP_CHECK(nd.op.find("nll_loss") == std::string::npos || nd.args.size() <= 2 ||
                   nd.args[2].isNone(),
               UnsupportedOpError,
               "{}: graph @{}: {} averages with class weights, a weighted mean that is not "
               "b_k/B times the micro-batch means; use reduction=sum and divide by the weights",
               kWho, g_.name(), ref(n));
    }
  }
}

// Note [Counted means]
// ~~~~~~~~~~~~~~~~~~~~
// A mean nll loss (cross entropy) divides by the weight of the targets it
// counts: the number of targets that are not ignore_index (-100 by
// default: padding, the labels a language model masks), or their class
// weights' sum. Its micro-batch means are then not weighted by b_k/B: a
// micro-batch of padding counts fewer targets (found by a test: labels
// padded in the first half of the batch gave 2.796 for eager's 2.915).
// AOTAutograd's nll_loss_forward returns that weight, T_k, beside the mean
// L_k, and the full batch's loss is Σ T_k·L_k / Σ T_k. Σ T_k is known only
// after the last micro-batch's forward, which 1F1B runs after the first
// micro-batch's backward, so the weights are applied in two steps: micro-batch
// k's backward is seeded with T_k (its own, known by then), the loss and
// every seed-dependent result (gradients) are accumulated as usual, and after
// the micro-batches they are divided by T = Σ T_k. The gradient is linear in
// the seed, so Σ_k T_k·∇L_k / T is the full batch's, whatever the schedule.
// This applies when the loss has one reducer, an nll_loss_forward with a mean;
// a loss of several terms keeps the b_k/B weights, exact when the targets
// each micro-batch counts are in proportion to its size (language models'
// shifted labels: one ignored position per row).

std::vector<NodeId> Microbatcher::lossReducers() const {
  std::vector<char> on = lossPath();
  std::vector<NodeId> out;
  for (size_t n = 0; n < g_.numNodes(); ++n) {
    const ir::Node& nd = g_.nodes()[n];
    bool produces = std::any_of(nd.outputs.begin(), nd.outputs.end(),
                                [&](ValueId o) { return on[static_cast<size_t>(o)] != 0; });
    if (produces && isReducer(static_cast<NodeId>(n))) out.push_back(static_cast<NodeId>(n));
  }
  return out;
}

NodeId Microbatcher::countedReducer() const {
  std::vector<NodeId> reducers = lossReducers();
  if (reducers.size() != 1) return ir::kNoId;
  const ir::Node& nd = g_.node(reducers[0]);
  if (nd.op != "aten::nll_loss_forward" && nd.op != "aten::nll_loss2d_forward") return ir::kNoId;
  if (nd.outputs.size() != 2 || !reducerIsMean(reducers[0])) return ir::kNoId;
  const Type& t = g_.value(nd.outputs[1]).type;
  return t.isTensor() && t.numel() == std::optional<int64_t>(1) ? reducers[0] : ir::kNoId;
}

// The forward values the loss is a linear function of, back to the ops that
// reduce over the batch (their inputs carry the batch dimension).
std::vector<char> Microbatcher::lossPath() const {
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

bool Microbatcher::isReducer(NodeId n) const {
  for (ValueId v : g_.node(n).inputs()) {
    if (g_.value(v).type.isTensor() && hasBatchDim(v)) return true;
  }
  return false;
}

bool Microbatcher::detectMean() const {
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

bool Microbatcher::reducerIsMean(NodeId n) const {
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
  return reduction == 1;
}

// A node between the batch reduction and the loss must keep the loss a
// weighted sum: an add/sub of loss terms (a constant term only when the
// weights sum to 1, i.e. a mean), a product with one loss factor, ...
void Microbatcher::checkLinear(NodeId n, const std::vector<char>& on) const {
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
  // x / c is linear in x, c / x is not: the loss term must be the dividend.
  bool dividend = nd.op != "aten::div" ||
                  (!nd.args.empty() && nd.args[0].isValue() &&
                   on[static_cast<size_t>(nd.args[0].toValue())] != 0);
  bool ok = isLinearOp(nd.op) && other_batched == 0 && dividend &&
            (additive ? (nd.overload == "Tensor" && loss_operands == 2) || d_.mean
                      : loss_operands == 1);
  MP_CHECK(ok, UnsupportedOpError,
           "{}: graph @{}: the loss %{} is not a weighted sum of micro-batch losses: {} lies "
           "between the batch reduction and the loss; reduce the batch last",
           kWho, g_.name(), g_.value(d_.loss).name, ref(n));
}

}  // namespace modelpar::passes::microbatch_detail
