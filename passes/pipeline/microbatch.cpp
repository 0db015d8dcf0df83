// Pass `microbatch` (microbatch.h). Steps: 1. options and the batch symbol;
// 2. which nodes run per micro-batch, once before, or after; 3. the loss,
// its reduction and the backward seed; 4. what leaves the micro-batches and
// how it is combined; 5. the checks that make the split exact; 6. the new
// graph. Everything is decided before the new graph is built. Step 3 is in
// microbatch_loss.cpp, step 6 in microbatch_build.cpp.
#include "passes/pipeline/microbatch.h"

#include <algorithm>
#include <optional>
#include <string_view>

#include "ir/check.h"
#include "ir/random_ops.h"
#include "passes/cost/op_family.h"
#include "passes/option_names.h"
#include "passes/pipeline/microbatch_impl.h"

namespace modelpar::passes {
namespace microbatch_detail {
namespace {

constexpr std::string_view kFunctionalBn = "aten::_native_batch_norm_legit_functional";

/// Ops that read their tensor argument for its dtype, device or sizes only.
bool readsItsArgumentForMetadataOnly(std::string_view op) {
  for (std::string_view m : {"aten::new_ones", "aten::new_zeros", "aten::new_empty",
                             "aten::new_full", "aten::new_empty_strided", "aten::sym_size",
                             "aten::sym_numel", "aten::sym_stride", "aten::size"}) {
    if (op == m) return true;
  }
  return false;
}

// Note [Row-group offsets]
// ~~~~~~~~~~~~~~~~~~~~~~~~
// A mixture-of-experts layer (transformers' Mixtral, Qwen-MoE, OLMoE, ...
// with their default "grouped_mm" experts) sorts its (token, expert) rows by
// expert, counts the rows of each expert over the whole batch
// (aten::histc), and turns the counts into group ends (aten::cumsum) for a
// grouped matmul, which multiplies rows [offs[g-1], offs[g]) by expert g's
// weight. The counts reduce over the batch, but they say nothing about the
// data: only where each expert's group of sorted rows ends. Per micro-batch
// they are computed from that micro-batch's own rows, sorted the same way,
// so every row meets its expert's weight as in the full batch and the step
// is the full batch's (the weight gradients sum over micro-batches, like
// any other). A value without a batch dimension computed from batched data
// is therefore exact per micro-batch when every use of it, directly or
// through other such values, is the offsets argument of one of these ops,
// and nothing else reads or returns it.

/// Grouped matmuls and the index of their row-group offsets argument
/// (`offs`): PyTorch's, and the fallback transformers registers for fp32
/// under torch.compile (forward and backward).
std::optional<size_t> rowGroupArgument(std::string_view op) {
  if (op == "aten::_grouped_mm" || op == "transformers::grouped_mm_fallback" ||
      op == "transformers::grouped_mm_fallback_backward") {
    return 2;
  }
  return std::nullopt;
}

/// What to say when a batch-norm op's statistics stop the split.
std::string batchNormHint(std::string_view op, BatchNormMode mode) {
  if (op.find("batch_norm") == std::string_view::npos) return "";
  if (mode == BatchNormMode::Refuse) {
    return " (batch norm computes its statistics per micro-batch: set the batch_norm option to "
           "deferred (BatchNormMode::Deferred, torchgpipe's DeferredBatchNorm) to normalise each "
           "micro-batch with its own statistics and update the running statistics from the whole "
           "batch's, or use eval-mode batch norm, group or layer norm, or one micro-batch)";
  }
  return fmt::format(" (deferred batch norm combines only the new running mean / var of {}; its "
                     "per-micro-batch save_mean / save_rstd must stay inside the micro-batches, "
                     "and other batch-norm forms must be functionalized first)",
                     kFunctionalBn);
}

}  // namespace

ir::Graph Microbatcher::run() {
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
  findDeferredBatchNorms();
  decideCombinations();
  checkExactness();
  // 6.
  return build();
}

std::string Microbatcher::ref(NodeId n) const {
  const ir::Node& nd = g_.node(n);
  return fmt::format("{} = {}", g_.nodeRef(n), nd.qualifiedName());
}

// 2. Per micro-batch: not an update node and reads a batched input, the size
// input, the seed root, or a per-micro-batch value. After: update nodes and
// what reads their results. Shared: the rest.
void Microbatcher::classify(ValueId seed_root) {
  d_.where.assign(g_.numNodes(), Where::Shared);
  d_.per_mb_value.assign(g_.numValues(), 0);
  std::vector<char> root(g_.numValues(), 0), post_value(g_.numValues(), 0);
  for (size_t i = 0; i < g_.inputs().size(); ++i) {
    if (d_.batch.input_dim[i] >= 0) root[static_cast<size_t>(g_.inputs()[i].value)] = 1;
  }
  for (ValueId v : d_.batch.size_inputs) root[static_cast<size_t>(v)] = 1;
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

// 3b. Batch norms whose running statistics are deferred: training-mode
// functional batch norms run per micro-batch, under batch_norm = Deferred.
void Microbatcher::findDeferredBatchNorms() {
  d_.deferred_bn.assign(g_.numNodes(), 0);
  if (o_.batch_norm != BatchNormMode::Deferred) return;
  for (size_t n = 0; n < g_.numNodes(); ++n) {
    const ir::Node& nd = g_.nodes()[n];
    if (d_.where[n] != Where::PerMb || nd.op.find("batch_norm") == std::string::npos) continue;
    auto id = static_cast<NodeId>(n);
    std::string q = nd.qualifiedName();
    const bool training = nd.args.size() > 5 && nd.args[5].kind() == Arg::Kind::Bool &&
                          nd.args[5].toBool();
    if (q == "aten::native_batch_norm" && training) {
      MP_THROW(UnsupportedOpError,
               "{}: graph @{}: {} updates the running statistics in place per micro-batch; "
               "deferred batch norm needs the functional form {} (the modelpar backend "
               "functionalizes native_batch_norm into it)",
               kWho, g_.name(), ref(id), kFunctionalBn);
    }
    if (q != kFunctionalBn || !training) continue;  // eval mode / other forms: the checks decide
    MP_CHECK(nd.args.size() == 8 && nd.outputs.size() == 5, InvalidIrError,
             "{}: graph @{}: {} has {} arguments and {} outputs, not 8 and 5", kWho, g_.name(),
             ref(id), nd.args.size(), nd.outputs.size());
    for (int i : {6, 7}) {
      Arg::Kind k = nd.args[static_cast<size_t>(i)].kind();
      MP_CHECK(k == Arg::Kind::Float || k == Arg::Kind::Int, UnsupportedOpError,
               "{}: graph @{}: {}: deferred batch norm needs a constant {}", kWho, g_.name(),
               ref(id), i == 6 ? "momentum" : "eps");
    }
    for (int i : {3, 4}) {
      const Arg& a = nd.args[static_cast<size_t>(i)];
      MP_CHECK(a.isValue() && !producedPerMb(a.toValue()) &&
                   !(g_.inputIndex(a.toValue()) &&
                     d_.batch.input_dim[*g_.inputIndex(a.toValue())] >= 0),
               UnsupportedOpError,
               "{}: graph @{}: {}: deferred batch norm needs the running {} to be one tensor "
               "shared by all micro-batches (a buffer), not None or batched",
               kWho, g_.name(), ref(id), i == 3 ? "mean" : "var");
    }
    MP_CHECK(nd.args[0].isValue(), InvalidIrError, "{}: graph @{}: {} normalises a constant",
             kWho, g_.name(), ref(id));
    const ir::Type& xt = g_.value(nd.args[0].toValue()).type;
    MP_CHECK(xt.isTensor() && xt.shape.size() >= 2 &&
                 batchDimOf(xt, d_.batch.symbol) == 0 &&
                 std::all_of(xt.shape.begin() + 1, xt.shape.end(),
                             [](const ir::Dim& dim) { return dim.isStatic(); }),
             UnsupportedOpError,
             "{}: graph @{}: {}: deferred batch norm needs its input at [{}, C, ...] with the "
             "batch first and static other dimensions (the element count per channel weights the "
             "micro-batches; under torch.compile mark only the batch dynamic, "
             "torch._dynamo.mark_dynamic(x, 0), instead of dynamic=True), got {}",
             kWho, g_.name(), ref(id), d_.batch.symbol, ir::toString(xt));
    deferReaders(id);
    for (size_t i = 3; i < 5; ++i) {
      for (NodeId u : users_[static_cast<size_t>(nd.outputs[i])]) {
        // A training-mode backward receives the running stats but does not
        // read them (AOTAutograd passes them along): its copy may read the
        // micro-batch's own.
        const ir::Node& un = g_.node(u);
        bool ignores = un.qualifiedName() == "aten::native_batch_norm_backward" &&
                       un.args.size() > 7 && un.args[7].kind() == Arg::Kind::Bool &&
                       un.args[7].toBool();
        MP_CHECK(ignores || d_.where[static_cast<size_t>(u)] == Where::Post, UnsupportedOpError,
                 "{}: graph @{}: %{} (the new running {} of {}) is read by {} inside the "
                 "micro-batches; under deferred batch norm it is only known after all of them",
                 kWho, g_.name(), g_.value(nd.outputs[i]).name, i == 3 ? "mean" : "var", ref(id),
                 ref(u));
      }
    }
    d_.deferred_bn[n] = 1;
  }
}

void Microbatcher::deferReaders(NodeId bn) {
  const ir::Node& b = g_.node(bn);
  std::vector<char> stat(g_.numValues(), 0);
  stat[static_cast<size_t>(b.outputs[3])] = stat[static_cast<size_t>(b.outputs[4])] = 1;
  std::vector<NodeId> work;
  for (size_t i = 3; i < 5; ++i) {
    for (NodeId u : users_[static_cast<size_t>(b.outputs[i])]) work.push_back(u);
  }
  std::sort(work.begin(), work.end());
  work.erase(std::unique(work.begin(), work.end()), work.end());
  for (size_t k = 0; k < work.size(); ++k) {  // graph order: readers come after
    NodeId u = work[k];
    auto ui = static_cast<size_t>(u);
    if (d_.where[ui] != Where::PerMb) continue;
    const ir::Node& un = g_.node(u);
    if (un.qualifiedName() == "aten::native_batch_norm_backward") continue;
    bool other_batched = false;
    for (ValueId v : un.inputs()) other_batched |= producedPerMb(v) && !stat[static_cast<size_t>(v)];
    if (other_batched) continue;  // the check after this reports it
    d_.where[ui] = Where::Post;
    for (ValueId o : un.outputs) {
      d_.per_mb_value[static_cast<size_t>(o)] = 0;
      stat[static_cast<size_t>(o)] = 1;
      for (NodeId w : users_[static_cast<size_t>(o)]) work.push_back(w);
    }
  }
}

// 4. Values leaving the micro-batches: read by a node after them, or returned.
void Microbatcher::decideCombinations() {
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
    if (isDeferredBn(val.producer) && val.output_index >= 3) {
      d_.combine[vi] = Combine::RunningStat;
    } else if (dim >= 0) {
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
               batchNormHint(producerOf(v).op, o_.batch_norm));
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

// Note [Random ops per micro-batch]
// ~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~
// Dropout, bernoulli, rand_like and the like draw each element on its own:
// drawn per micro-batch, the masks are not the full batch's bit for bit but
// have its distribution, which is how torchgpipe's pipelines draw dropout.
// torch.compile's pipeline option and strategy="auto" allow them (the
// option's allow_random defaults to True; False refuses them, for a step
// that must equal eager's bit for bit); this pass's own default refuses.
// A permutation is different: randperm(B) per micro-batch permutes each
// micro-batch's rows among themselves, a different shuffle of the batch, so
// it is refused whatever allow_random says. The executor makes the draws
// reproducible (Note [Reproducible random ops over workers] in
// runtime/random_seeding.cpp).

// 5. Random ops, in-place ops on shared values, batch statistics, the loss path.
void Microbatcher::checkExactness() const {
  // One micro-batch is the whole batch: every reduction, draw and in-place
  // update happens once, on all of it, as without micro-batching.
  if (d_.sizes.size() == 1) return;
  std::vector<char> on = lossPath();
  for (size_t n = 0; n < g_.numNodes(); ++n) {
    if (d_.where[n] != Where::PerMb) continue;
    const ir::Node& nd = g_.nodes()[n];
    auto id = static_cast<NodeId>(n);
    // Note [Random ops per micro-batch]: a permutation drawn per
    // micro-batch permutes within each one, not over the batch.
    MP_CHECK(nd.op.rfind("aten::randperm", 0) != 0, UnsupportedOpError,
             "{}: graph @{}: {} draws a permutation per micro-batch, which would permute "
             "within each micro-batch instead of over the batch; draw it outside the compiled "
             "step, or use one micro-batch", kWho, g_.name(), ref(id));
    MP_CHECK(o_.allow_random || !ir::isRandom(nd), UnsupportedOpError,
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
    if (isDeferredBn(id)) continue;  // its statistics: see findDeferredBatchNorms
    // Note [Outputs without a batch dimension]: a forward output that lost
    // the batch dimension is a reduction over the batch only if it holds data
    // computed from the batch: an empty tensor (eval-mode batch norm's saved
    // statistics) holds none, and the new_* factories read their argument
    // for its dtype and device only (a 0-d new_ones).
    if (readsItsArgumentForMetadataOnly(nd.op)) continue;
    for (ValueId o : nd.outputs) {
      const Type& t = g_.value(o).type;
      if (!t.isTensor() || hasBatchDim(o)) continue;
      if (std::optional<int64_t> n = t.numel(); n && *n == 0) continue;
      if (onlyGroupsRows(o)) continue;  // Note [Row-group offsets]
      // The GPU attention kernels also return their dropout RNG state
      // (philox seed and offset) and sequence bookkeeping as int64 tensors
      // without a batch dimension; only their backward reads them, per
      // micro-batch. Seen on the first GPU run: efficient attention.
      if (classifyOp(nd.op) == OpFamily::Attention && t.dtype == ir::ScalarType::Int64) continue;
      MP_THROW(UnsupportedOpError,
               "{}: graph @{}: %{} = {} reduces over the batch in the forward and is not the "
               "loss: per micro-batch it would differ from the full batch's{}",
               kWho, g_.name(), g_.value(o).name, nd.qualifiedName(), batchNormHint(nd.op, o_.batch_norm));
    }
  }
}

bool Microbatcher::onlyGroupsRows(ValueId v) const {
  std::vector<char> seen(g_.numValues(), 0);
  std::vector<ValueId> work{v};
  bool grouped = false;
  while (!work.empty()) {
    const ValueId x = work.back();
    work.pop_back();
    if (seen[static_cast<size_t>(x)]++ != 0) continue;
    if (is_output_[static_cast<size_t>(x)] != 0) return false;
    for (NodeId u : users_[static_cast<size_t>(x)]) {
      const ir::Node& un = g_.node(u);
      if (std::optional<size_t> k = rowGroupArgument(un.op)) {
        // x must be the offsets and nothing else of this node.
        for (size_t a = 0; a < un.args.size(); ++a) {
          bool reads = false;
          un.args[a].forEachValue([&](ValueId w) { reads |= w == x; });
          if (reads && a != *k) return false;
        }
        grouped = true;
        continue;
      }
      for (ValueId o : un.outputs) {  // on through values that still lack the batch
        if (hasBatchDim(o)) return false;
        work.push_back(o);
      }
    }
  }
  return grouped;
}

}  // namespace microbatch_detail

std::vector<int64_t> microbatchSizes(int64_t batch, int microbatches) {
  MP_CHECK(microbatches >= 1, ConfigError, "{}: microbatches must be >= 1, got {}", microbatch_detail::kWho,
           microbatches);
  MP_CHECK(batch >= 1, ConfigError, "{}: batch_size must be >= 1, got {}", microbatch_detail::kWho, batch);
  MP_CHECK(microbatches <= batch, ConfigError,
           "{}: {} micro-batches asked for a batch of {}: each micro-batch needs at least one "
           "sample; use at most {} micro-batches or a larger batch",
           microbatch_detail::kWho, microbatches, batch, batch);
  const int64_t chunk = (batch + microbatches - 1) / microbatches;
  std::vector<int64_t> sizes;
  for (int64_t s = 0; s < batch; s += chunk) sizes.push_back(std::min(chunk, batch - s));
  return sizes;
}

ir::Graph microbatch(const ir::Graph& g, const MicrobatchOptions& options) {
  return microbatch_detail::Microbatcher(g, options).run();
}

BatchNormMode parseBatchNormMode(std::string_view s) {
  checkOneOf(kMicrobatchPassId, "batch_norm", s, kBatchNormModeNames);
  return s == "deferred" ? BatchNormMode::Deferred : BatchNormMode::Refuse;
}

LossReduction parseLossReduction(std::string_view s) {
  checkOneOf(kMicrobatchPassId, "loss_reduction", s, kLossReductionNames);
  return s == "mean" ? LossReduction::Mean : s == "sum" ? LossReduction::Sum : LossReduction::Auto;
}

}  // namespace modelpar::passes
