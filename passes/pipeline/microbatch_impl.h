// Internals of the `microbatch` pass (microbatch.h), shared by microbatch.cpp
// (where each node runs, what leaves the micro-batches, the exactness checks),
// microbatch_loss.cpp (the loss, its reduction over the batch, the backward
// seed) and microbatch_build.cpp (the new graph). Not part of the API: include passes/microbatch.h.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "ir/graph.h"
#include "passes/pipeline/batch_symbol.h"
#include "passes/pipeline/microbatch.h"

namespace modelpar::passes::microbatch_detail {

using ir::Arg;
using ir::NodeId;
using ir::Phase;
using ir::Type;
using ir::ValueId;

inline constexpr std::string_view kWho = "modelpar microbatch";

/// Where a node of the input runs: once before the micro-batches, once per
/// micro-batch, or once after them (update nodes and what reads them).
enum class Where : uint8_t { Shared, PerMb, Post };
/// How a value leaving the micro-batches is combined.
/// RunningStat: a deferred batch norm's new running mean / var, computed
/// from the micro-batches' statistics after them.
enum class Combine : uint8_t { None, Cat, Loss, Accumulate, RunningStat };

/// Everything the rewrite needs, decided before it starts.
struct Decision {
  BatchSymbol batch;
  std::vector<int64_t> sizes;
  int64_t total = 0;
  std::vector<Where> where;          // per node
  std::vector<char> per_mb_value;    // per value: produced per micro-batch
  std::vector<Combine> combine;      // per value
  std::vector<int> cat_dim;          // per value
  std::vector<char> deferred_bn;     // per node: a batch norm with deferred running stats
  ValueId loss = ir::kNoId, seed = ir::kNoId;
  bool seed_is_root = false;         // an input or shared value, scaled per micro-batch
  bool mean = false;
  // Note [Counted means] (microbatch_loss.cpp): the mean nll loss whose
  // per-micro-batch target count (its total_weight output) weights the
  // micro-batches; kNoId when the weights are the micro-batch sizes.
  NodeId counted = ir::kNoId;
  ValueId count = ir::kNoId;
  double weight(size_t k) const {
    if (counted != ir::kNoId) return 1.0;  // tensor weights, applied in build()
    return mean ? static_cast<double>(sizes[k]) / static_cast<double>(total) : 1.0;
  }
};

class Microbatcher {
 public:
  Microbatcher(const ir::Graph& g, const MicrobatchOptions& o)
      : g_(g), o_(o), users_(g.users()), is_output_(g.numValues(), 0) {
    for (ValueId v : g.outputs()) is_output_[static_cast<size_t>(v)] = 1;
  }

  /// Decides everything, then builds the split graph.
  ir::Graph run();

 private:
  const ir::Node& producerOf(ValueId v) const { return g_.node(g_.value(v).producer); }
  bool producedPerMb(ValueId v) const { return d_.per_mb_value[static_cast<size_t>(v)] != 0; }
  bool hasBatchDim(ValueId v) const { return batchDimOf(g_.value(v).type, d_.batch.symbol) >= 0; }
  Phase phaseOf(ValueId v) const {
    const ir::Value& val = g_.value(v);
    if (val.producer == ir::kNoId) return Phase::Forward;
    return g_.node(val.producer).phase.value_or(Phase::Forward);
  }
  std::string ref(NodeId n) const;
  // 2. Per micro-batch: not an update node and reads a batched input, the size
  // input, the seed root, or a per-micro-batch value. After: update nodes and
  // what reads their results. Shared: the rest.
  void classify(ValueId seed_root);
  // 3. (microbatch_loss.cpp) The loss: a scalar forward output computed per
  // micro-batch; the seed; the reduction.
  void findLossAndSeed();
  // Its steps, in this order.
  void findLoss();
  void findSeed();
  void findReduction();
  // The output of the backward's seed op that reads `loss`, or kNoId.
  ValueId seedNodeOf(ValueId loss) const;
  // The forward values the loss is a linear function of, back to the ops that
  // reduce over the batch (their inputs carry the batch dimension).
  std::vector<char> lossPath() const;
  bool isReducer(NodeId n) const;
  bool detectMean() const;
  bool reducerIsMean(NodeId n) const;
  // The reducers on the loss path, in node order.
  std::vector<NodeId> lossReducers() const;
  // The loss's one reducer when it is a mean nll loss (Note [Counted means]).
  NodeId countedReducer() const;
  // 3b. Batch norms whose running statistics are deferred (batch_norm option).
  void findDeferredBatchNorms();
  // Under deferred batch norm, the nodes that read bn's new running stats
  // (AOTAutograd's copy_ into the buffer) and nothing else per micro-batch
  // run after the micro-batches, as do their readers.
  void deferReaders(NodeId bn);
  bool isDeferredBn(NodeId n) const {
    return n != ir::kNoId && d_.deferred_bn[static_cast<size_t>(n)] != 0;
  }
  // 4. Values leaving the micro-batches: read by a node after them, or returned.
  void decideCombinations();
  // 5. Random ops, in-place ops on shared values, batch statistics, the loss path.
  void checkExactness() const;
  // Whether every use of v, directly or through values without a batch
  // dimension, is the row-group argument of a grouped matmul (Note [Row-group
  // offsets] in microbatch.cpp).
  bool onlyGroupsRows(ValueId v) const;
  // A node between the batch reduction and the loss must keep the loss a
  // weighted sum: an add/sub of loss terms (a constant term only when the
  // weights sum to 1, i.e. a mean), a product with one loss factor, ...
  void checkLinear(NodeId n, const std::vector<char>& on) const;

  // 6. (microbatch_build.cpp) The new graph, from d_.
  ir::Graph build();

  const ir::Graph& g_;
  const MicrobatchOptions& o_;
  std::vector<std::vector<NodeId>> users_;
  std::vector<char> is_output_;
  Decision d_;
};

}  // namespace modelpar::passes::microbatch_detail
