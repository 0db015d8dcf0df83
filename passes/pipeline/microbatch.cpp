// Pass `microbatch` (microbatch.h). Steps: 1. options and the batch symbol;
// 2. which nodes run per micro-batch, once before, or after; 3. the loss,
// its reduction and the backward seed; 4. what leaves the micro-batches and
// how it is combined; 5. the checks that make the split exact; 6. the new
// graph. Everything is decided before the new graph is built. Step 3 is in
// microbatch_loss.cpp.
#include "passes/pipeline/microbatch.h"

#include <algorithm>
#include <cmath>
#include <optional>
#include <string_view>

#include "ir/check.h"
#include "ir/node_copy.h"
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
  auto copyNode = [&](size_t src_node, auto&& lookup, const std::string& suffix,
                      std::optional<int64_t> b) {
    ir::NodeCopyRules rules;
    rules.arg = [&](ValueId v) { return Arg(lookup(v)); };
    rules.name = [&](const std::string& base) {
      std::string name = base + suffix;
      for (int i = 1; out.findValue(name) || out.findLabel(name); ++i) {
        name = fmt::format("{}{}_{}", base, suffix, i);
      }
      return name;
    };
    rules.type = [&](const Type& t) { return instantiate(t, sym, b.value_or(d_.total)); };
    rules.keep_cost = false;  // a micro-batch's share: the cost pass estimates it again
    return ir::copyNode(g_, static_cast<NodeId>(src_node), out, rules);
  };
  auto addAttrs = [&](NodeId n, std::string layer, Phase phase, std::optional<int> mb) {
    out.node(n).layer = std::move(layer);
    out.node(n).phase = phase;
    out.node(n).microbatch = mb;
  };
  auto sharedLookup = [&](ValueId v) -> Arg {
    if (d_.batch.isSizeInput(v)) return Arg::integer(d_.total);
    ValueId c = combined[static_cast<size_t>(v)];
    MP_INTERNAL_ASSERT(c != ir::kNoId || shared[static_cast<size_t>(v)] != ir::kNoId,
                       "microbatch: %{} has no copy", g_.value(v).name);
    return Arg::value(c != ir::kNoId ? c : shared[static_cast<size_t>(v)]);
  };

  for (size_t n = 0; n < g_.numNodes(); ++n) {
    if (d_.where[n] != Where::Shared) continue;
    const ir::Node& nd = g_.nodes()[n];
    NodeId c = copyNode(n, sharedLookup, "", std::nullopt);
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
  // A slice runs in its first reader's phase: a tangent input's slices are
  // backward work (split_phases.h keeps them out of the forward part).
  auto phaseOfReader = [&](ValueId v) {
    NodeId r = first_reader[static_cast<size_t>(v)];
    std::optional<Phase> ph = r == ir::kNoId ? std::nullopt : g_.node(r).phase;
    return ph == Phase::Backward ? Phase::Backward : Phase::Forward;
  };

  // Graph inputs sliced per micro-batch: batched and read by a copy.
  std::vector<bool> is_sliced(g_.numValues(), false);
  for (size_t i = 0; i < g_.inputs().size(); ++i) {
    ValueId v = g_.inputs()[i].value;
    is_sliced[static_cast<size_t>(v)] =
        d_.batch.input_dim[i] >= 0 && first_reader[static_cast<size_t>(v)] != ir::kNoId;
  }
  // Note [Counted means]: what depends on the seed (the gradients) is
  // divided by the total target count after the micro-batches, as is the
  // loss; those results take their names there.
  std::vector<char> from_seed(g_.numValues(), 0);
  if (d_.counted != ir::kNoId && d_.seed != ir::kNoId) {
    from_seed[static_cast<size_t>(d_.seed)] = 1;
    for (const ir::Node& nd : g_.nodes()) {
      bool reads = false;
      for (ValueId v : nd.inputs()) reads |= from_seed[static_cast<size_t>(v)] != 0;
      if (reads) {
        for (ValueId o : nd.outputs) from_seed[static_cast<size_t>(o)] = 1;
      }
    }
  }
  auto divided = [&](size_t vi) {
    return d_.counted != ir::kNoId &&
           (d_.combine[vi] == Combine::Loss ||
            (from_seed[vi] != 0 &&
             (d_.combine[vi] == Combine::Accumulate || d_.combine[vi] == Combine::Cat)));
  };
  auto combinedName = [&](size_t vi) {
    const std::string& name = g_.value(static_cast<ValueId>(vi)).name;
    return divided(vi) ? name + ".sum" : name;
  };
  ValueId total_count = ir::kNoId;
  std::vector<ValueId> acc(g_.numValues(), ir::kNoId);
  std::vector<std::vector<ValueId>> parts(g_.numValues());
  std::vector<std::vector<NodeId>> bn_copies(g_.numNodes());  // deferred batch norms, per mb
  int64_t start = 0;
  for (size_t k = 0; k < nmb; ++k) {
    const int64_t bk = d_.sizes[k];
    const auto mb = static_cast<int>(k);
    // One micro-batch: the copies keep the graph's names (its outputs are
    // found by name, and a `.mb0` suffix would rename them).
    const std::string suffix = nmb == 1 ? std::string() : fmt::format(".mb{}", k);
    const double w = d_.weight(k);
    const bool last = k + 1 == nmb;
    std::vector<ValueId> local(g_.numValues(), ir::kNoId);
    // Note [Counted means]: a value times this micro-batch's target count.
    auto timesCount = [&](ValueId v, const std::string& name, const std::string& layer, Phase ph) {
      ValueId t = local[static_cast<size_t>(d_.count)];
      MP_CHECK(t != ir::kNoId, InternalError,
               "{}: graph @{}: %{} is scaled by the target count before %{} is computed", kWho,
               g_.name(), out.value(v).name, g_.value(d_.count).name);
      NodeId s = out.addNode("aten::mul.Tensor", {Arg::value(v), Arg::value(t)},
                             {{fresh(name), out.value(v).type}});
      addAttrs(s, layer, ph, mb);
      return out.node(s).outputs[0];
    };
    auto scaleSeed = [&](ValueId v, const std::string& name, const std::string& layer) {
      if (d_.counted != ir::kNoId) return timesCount(v, name, layer, Phase::Backward);
      if (w == 1.0) return v;
      NodeId s = out.addNode("aten::mul.Scalar", {Arg::value(v), Arg::floating(w)},
                             {{fresh(name), out.value(v).type}});
      addAttrs(s, layer, Phase::Backward, mb);
      return out.node(s).outputs[0];
    };
    // Slices of the batched inputs, made right before their first reader in
    // this micro-batch (so a layer's slice sits with the layer, which keeps
    // layers in order for chainFromGraph); the scaled seed root.
    auto slice = [&](ValueId v) {
      auto i = static_cast<size_t>(*g_.inputIndex(v));
      const ir::Value& val = g_.value(v);
      NodeId s = out.addNode("aten::narrow",
                             {Arg::value(shared[static_cast<size_t>(v)]),
                              Arg::integer(d_.batch.input_dim[i]), Arg::integer(start),
                              Arg::integer(bk)},
                             {{fresh(val.name + suffix), instantiate(val.type, sym, bk)}});
      addAttrs(s, layerOfReader(v), phaseOfReader(v), mb);
      local[static_cast<size_t>(v)] = out.node(s).outputs[0];
    };
    // A root seed is scaled where the micro-batch first reads it; with a
    // counted mean that is in its backward, after its count exists.
    auto seedRoot = [&] {
      ValueId s = shared[static_cast<size_t>(d_.seed)];
      local[static_cast<size_t>(d_.seed)] =
          scaleSeed(s, g_.value(d_.seed).name + suffix, layerOfReader(d_.seed));
    };
    if (d_.seed_is_root && d_.counted == ir::kNoId) seedRoot();
    auto lookup = [&](ValueId v) -> Arg {
      if (d_.batch.isSizeInput(v)) return Arg::integer(bk);
      if (d_.seed_is_root && v == d_.seed && local[static_cast<size_t>(v)] == ir::kNoId) seedRoot();
      if (local[static_cast<size_t>(v)] == ir::kNoId && is_sliced[static_cast<size_t>(v)]) slice(v);
      ValueId l = local[static_cast<size_t>(v)];
      return l != ir::kNoId ? Arg::value(l) : sharedLookup(v);
    };
    for (size_t n = 0; n < g_.numNodes(); ++n) {
      if (d_.where[n] != Where::PerMb) continue;
      const ir::Node& nd = g_.nodes()[n];
      NodeId c = copyNode(n, lookup, suffix, bk);
      out.node(c).microbatch = mb;
      if (isDeferredBn(static_cast<NodeId>(n))) bn_copies[n].push_back(c);
      if (nd.cost) {  // a micro-batch does b_k/B of the work; weights count once
        ir::Cost cost = *nd.cost;
        double f = static_cast<double>(bk) / static_cast<double>(d_.total);
        double launch = std::clamp(o_.launch_overhead_us, 0.0, cost.time_us);
        cost.time_us = launch + (cost.time_us - launch) * f;
        cost.output_bytes = static_cast<int64_t>(std::llround(static_cast<double>(cost.output_bytes) * f));
        cost.temp_bytes = static_cast<int64_t>(std::llround(static_cast<double>(cost.temp_bytes) * f));
        if (k > 0) cost.persistent_bytes = 0;
        out.node(c).cost = cost;
      }
      // Every output first: a counted mean's loss (output 0) is weighted by
      // its count (output 1).
      for (size_t i = 0; i < nd.outputs.size(); ++i) {
        local[static_cast<size_t>(nd.outputs[i])] = out.node(c).outputs[i];
      }
      if (static_cast<NodeId>(n) == d_.counted) {  // T = Σ T_k, beside each micro-batch's loss
        ValueId t = local[static_cast<size_t>(d_.count)];
        if (total_count != ir::kNoId) {
          NodeId a = out.addNode("aten::add.Tensor", {Arg::value(total_count), Arg::value(t)},
                                 {{fresh(fmt::format("{}.total{}", g_.value(d_.count).name, k)),
                                   out.value(t).type}});
          addAttrs(a, nd.layer, Phase::Forward, mb);
          t = out.node(a).outputs[0];
        }
        total_count = t;
      }
      for (size_t i = 0; i < nd.outputs.size(); ++i) {
        ValueId o = nd.outputs[i];
        auto oi = static_cast<size_t>(o);
        ValueId copy = out.node(c).outputs[i];
        const std::string& name = g_.value(o).name;
        if (o == d_.seed) local[oi] = scaleSeed(copy, name + suffix + ".scaled", nd.layer);
        switch (d_.combine[oi]) {
          case Combine::None:
          case Combine::RunningStat: break;  // after the micro-batches, from bn_copies
          case Combine::Cat: parts[oi].push_back(copy); break;
          case Combine::Accumulate:
            if (o_.accumulate_in_reverse) {  // chained after the loop, last micro-batch first
              parts[oi].push_back(copy);
              break;
            }
            [[fallthrough]];
          case Combine::Loss: {
            double wk = d_.combine[oi] == Combine::Loss ? w : 1.0;
            // Counted means: the loss is Σ T_k·L_k, divided by Σ T_k after
            // the loop, which also divides what depends on the seed.
            if (d_.counted != ir::kNoId && d_.combine[oi] == Combine::Loss) {
              copy = timesCount(copy, name + suffix + ".counted", nd.layer,
                                nd.phase.value_or(Phase::Forward));
            }
            std::string acc_name = last ? combinedName(oi) : fmt::format("{}.acc{}", name, k);
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
  // Gradients accumulated in reverse micro-batch order (GPipe's backward
  // order): acc = g_{m-1}; acc += g_k for k = m-2 .. 0, each add with mb=k.
  for (size_t vi = 0; vi < g_.numValues(); ++vi) {
    if (d_.combine[vi] != Combine::Accumulate || !o_.accumulate_in_reverse) continue;
    const ir::Value& val = g_.value(static_cast<ValueId>(vi));
    const ir::Node& prod = g_.node(val.producer);
    ValueId a = parts[vi].back();
    for (size_t k = parts[vi].size() - 1; k-- > 0;) {
      std::string acc_name = k == 0 ? combinedName(vi) : fmt::format("{}.acc{}", val.name, k);
      NodeId n = out.addNode("aten::add.Tensor", {Arg::value(a), Arg::value(parts[vi][k])},
                             {{fresh(acc_name), out.value(a).type}});
      addAttrs(n, prod.layer, prod.phase.value_or(Phase::Backward), static_cast<int>(k));
      a = out.node(n).outputs[0];
    }
    combined[vi] = a;
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
                           {{fresh(combinedName(vi)), instantiate(val.type, sym, d_.total)}});
    const ir::Node& prod = g_.node(val.producer);
    addAttrs(c, prod.layer, prod.phase.value_or(Phase::Forward), std::nullopt);
    combined[vi] = out.node(c).outputs[0];
  }
  // Note [Counted means]: the loss and the gradients over the total count.
  for (size_t vi = 0; vi < g_.numValues(); ++vi) {
    if (!divided(vi) || combined[vi] == ir::kNoId) continue;
    const ir::Value& val = g_.value(static_cast<ValueId>(vi));
    const ir::Node& prod = g_.node(val.producer);
    NodeId q = out.addNode("aten::div.Tensor", {Arg::value(combined[vi]), Arg::value(total_count)},
                           {{fresh(val.name), out.value(combined[vi]).type}});
    addAttrs(q, prod.layer, prod.phase.value_or(Phase::Forward), std::nullopt);
    combined[vi] = out.node(q).outputs[0];
  }
  // Deferred batch norms: the running statistics from the whole batch's
  // mean and unbiased variance, combined from the micro-batches' statistics.
  for (size_t n = 0; n < g_.numNodes(); ++n) {
    if (!isDeferredBn(static_cast<NodeId>(n))) continue;
    const ir::Node& nd = g_.nodes()[n];
    ValueId rm_out = nd.outputs[3], rv_out = nd.outputs[4];
    if (d_.combine[static_cast<size_t>(rm_out)] != Combine::RunningStat &&
        d_.combine[static_cast<size_t>(rv_out)] != Combine::RunningStat) {
      continue;  // the running statistics are not used
    }
    const std::vector<NodeId>& copies = bn_copies[n];
    if (copies.size() == 1) {  // one micro-batch: the copy's own update is the batch's
      combined[static_cast<size_t>(rm_out)] = out.node(copies[0]).outputs[3];
      combined[static_cast<size_t>(rv_out)] = out.node(copies[0]).outputs[4];
      continue;
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
    const Type stat_type = out.value(out.node(copies[0]).outputs[1]).type;
    const std::string& base = g_.value(rm_out).name;
    auto add = [&](std::string_view op, std::vector<Arg> args, const std::string& name) {
      NodeId a = out.addNode(op, std::move(args), {{fresh(name), stat_type}});
      addAttrs(a, nd.layer, Phase::Forward, std::nullopt);
      return out.node(a).outputs[0];
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
      mean = weighted(mean, out.node(copies[k]).outputs[1], wk,
                      fmt::format("{}.batch_mean{}", base, k + 1 == copies.size() ? "" : fmt::format(".acc{}", k)));
    }
    for (size_t k = 0; k < copies.size(); ++k) {
      const ValueId mean_k = out.node(copies[k]).outputs[1];  // no reference: add() grows out
      const ValueId rstd_k = out.node(copies[k]).outputs[2];
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
      combined[static_cast<size_t>(orig)] =
          add("aten::add.Tensor",
              {Arg::value(kept), Arg::value(stat), Arg::floating(momentum).withKeyword("alpha")},
              g_.value(orig).name);
    };
    update(nd.args[3].toValue(), mean, rm_out);
    update(nd.args[4].toValue(), unbiased, rv_out);
  }
  for (size_t n = 0; n < g_.numNodes(); ++n) {
    if (d_.where[n] != Where::Post) continue;
    const ir::Node& nd = g_.nodes()[n];
    NodeId c = copyNode(n, sharedLookup, "", std::nullopt);
    out.node(c).cost = nd.cost;
    for (size_t i = 0; i < nd.outputs.size(); ++i) {
      shared[static_cast<size_t>(nd.outputs[i])] = out.node(c).outputs[i];
    }
  }
  std::vector<ValueId> outputs;
  for (ValueId v : g_.outputs()) {
    // The batch size returned as it is (a decode step with a static KV cache
    // returns it): the input that carries it, which the nodes read as a
    // number.
    if (d_.batch.isSizeInput(v)) {
      outputs.push_back(shared[static_cast<size_t>(v)]);
      continue;
    }
    Arg a = sharedLookup(v);
    MP_INTERNAL_ASSERT(a.isValue(), "microbatch: output %{} is not a value", g_.value(v).name);
    outputs.push_back(a.toValue());
  }
  out.setOutputs(std::move(outputs));
  return out;
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
