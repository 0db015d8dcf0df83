// Operator tables. Names are ATen's (native_functions.yaml) without overload.
#include "passes/cost/op_family.h"

#include <algorithm>
#include <array>
#include <unordered_map>

#include "passes/place/flat_graph.h"

namespace modelpar::passes {
namespace {

using namespace std::string_view_literals;

constexpr auto kMatMul = std::array{
    "addbmm"sv, "addmm"sv, "addmv"sv, "baddbmm"sv, "bmm"sv, "dot"sv, "linear"sv, "matmul"sv,
    "mm"sv, "mv"sv, "_addmm_activation"sv, "vdot"sv};
constexpr auto kConvolution = std::array{
    "_convolution"sv, "conv1d"sv, "conv2d"sv, "conv3d"sv, "conv_transpose1d"sv,
    "conv_transpose2d"sv, "conv_transpose3d"sv, "convolution"sv, "convolution_backward"sv,
    "cudnn_convolution"sv, "mkldnn_convolution"sv};
constexpr auto kAttention = std::array{
    "_efficient_attention_backward"sv, "_efficient_attention_forward"sv,
    "_flash_attention_backward"sv, "_flash_attention_forward"sv,
    "_scaled_dot_product_attention_math"sv, "_scaled_dot_product_cudnn_attention"sv,
    "_scaled_dot_product_cudnn_attention_backward"sv,
    "_scaled_dot_product_efficient_attention"sv,
    "_scaled_dot_product_efficient_attention_backward"sv,
    "_scaled_dot_product_flash_attention"sv, "_scaled_dot_product_flash_attention_backward"sv,
    "_scaled_dot_product_flash_attention_for_cpu"sv,
    "_scaled_dot_product_flash_attention_for_cpu_backward"sv, "scaled_dot_product_attention"sv};
constexpr auto kReduction = std::array{
    "_log_softmax"sv, "_log_softmax_backward_data"sv, "_native_batch_norm_legit"sv,
    "_native_batch_norm_legit_functional"sv, "_native_batch_norm_legit_no_training"sv,
    "_softmax"sv, "_softmax_backward_data"sv, "all"sv, "amax"sv, "amin"sv, "any"sv, "argmax"sv,
    "argmin"sv, "batch_norm"sv, "cross_entropy_loss"sv, "cumsum"sv, "group_norm"sv,
    "layer_norm"sv, "linalg_vector_norm"sv, "log_softmax"sv, "logsumexp"sv, "max"sv, "mean"sv,
    "min"sv, "mse_loss"sv, "mse_loss_backward"sv, "native_batch_norm"sv,
    "native_batch_norm_backward"sv, "native_group_norm"sv, "native_group_norm_backward"sv,
    "native_layer_norm"sv, "native_layer_norm_backward"sv, "nll_loss"sv, "nll_loss2d_forward"sv,
    "nll_loss_backward"sv, "nll_loss_forward"sv, "norm"sv, "prod"sv, "rms_norm"sv, "softmax"sv,
    "std"sv, "sum"sv, "topk"sv, "var"sv, "var_mean"sv};
constexpr auto kCopy = std::array{
    "_to_copy"sv, "arange"sv, "cat"sv, "clone"sv, "constant_pad_nd"sv, "contiguous"sv, "copy"sv,
    "copy_"sv, "embedding"sv, "embedding_dense_backward"sv, "empty"sv, "empty_like"sv,
    "empty_strided"sv, "full"sv, "full_like"sv, "gather"sv, "index"sv, "index_add"sv,
    "index_put"sv, "index_select"sv, "new_empty"sv, "new_empty_strided"sv, "new_full"sv,
    "new_ones"sv, "new_zeros"sv, "ones"sv, "ones_like"sv, "pad"sv, "rand"sv, "randn"sv,
    "repeat"sv, "scalar_tensor"sv, "scatter"sv, "scatter_add"sv, "select_backward"sv,
    "slice_backward"sv, "stack"sv, "to"sv, "zeros"sv, "zeros_like"sv};
constexpr auto kView = std::array{
    "T"sv, "_reshape_alias"sv, "_unsafe_view"sv, "alias"sv, "as_strided"sv, "chunk"sv,
    "detach"sv, "diagonal"sv, "expand"sv, "expand_as"sv, "flatten"sv, "imag"sv, "lift_fresh"sv,
    "mT"sv, "movedim"sv, "narrow"sv, "numpy_T"sv, "permute"sv, "real"sv, "reshape"sv,
    "select"sv, "slice"sv, "split"sv, "split_with_sizes"sv, "squeeze"sv, "t"sv, "transpose"sv,
    "unbind"sv, "unflatten"sv, "unfold"sv, "unsqueeze"sv, "view"sv, "view_as"sv,
    "view_as_complex"sv, "view_as_real"sv};
constexpr auto kElementwise = std::array{
    "abs"sv, "add"sv, "addcdiv"sv, "addcmul"sv, "bitwise_and"sv, "bitwise_not"sv,
    "bitwise_or"sv, "clamp"sv, "clamp_max"sv, "clamp_min"sv, "cos"sv, "div"sv, "dropout"sv,
    "elu"sv, "elu_backward"sv, "eq"sv, "erf"sv, "exp"sv, "fill"sv, "ge"sv, "gelu"sv,
    "gelu_backward"sv, "gt"sv, "hardswish"sv, "hardtanh"sv, "hardtanh_backward"sv, "le"sv,
    "leaky_relu"sv, "leaky_relu_backward"sv, "lerp"sv, "log"sv, "log1p"sv, "logical_and"sv,
    "logical_not"sv, "logical_or"sv, "lt"sv, "masked_fill"sv, "maximum"sv, "minimum"sv,
    "mul"sv, "native_dropout"sv, "native_dropout_backward"sv, "ne"sv, "neg"sv, "pow"sv,
    "reciprocal"sv, "relu"sv, "rsqrt"sv, "rsub"sv, "sigmoid"sv, "sigmoid_backward"sv,
    "silu"sv, "silu_backward"sv, "sin"sv, "softplus"sv, "sqrt"sv, "square"sv, "sub"sv,
    "tanh"sv, "tanh_backward"sv, "threshold"sv, "threshold_backward"sv, "where"sv};

std::string_view baseName(std::string_view op) {
  size_t p = op.rfind("::");
  return p == std::string_view::npos ? op : op.substr(p + 2);
}

// Name -> family, built once (the passes classify every node, often twice).
const std::unordered_map<std::string_view, OpFamily>& familyTable() {
  static const auto* table = [] {
    auto* t = new std::unordered_map<std::string_view, OpFamily>();
    auto add = [&](const auto& names, OpFamily f) {
      for (std::string_view n : names) t->emplace(n, f);
    };
    add(kMatMul, OpFamily::MatMul);
    add(kConvolution, OpFamily::Convolution);
    add(kAttention, OpFamily::Attention);
    add(kReduction, OpFamily::Reduction);
    add(kCopy, OpFamily::Copy);
    add(kView, OpFamily::View);
    add(kElementwise, OpFamily::Elementwise);
    return t;
  }();
  return *table;
}

}  // namespace

std::string_view name(OpFamily f) {
  static constexpr std::array kNames = {"matmul"sv,    "convolution"sv, "attention"sv,
                                        "elementwise"sv, "reduction"sv, "copy"sv,
                                        "view"sv,      "other"sv};
  return kNames[static_cast<size_t>(f)];
}

bool isInPlaceOp(std::string_view op) {
  std::string_view b = baseName(op);
  if (b.size() < 2 || b.back() != '_') return false;
  // Python dunders (aten::__and__) are functional; only __iand__ & co. write in place.
  if (b.substr(0, 2) == "__") return b.substr(0, 3) == "__i";
  return true;
}

ir::ValueId writtenInput(const ir::Graph& g, const ir::Node& n,
                         const std::vector<ir::ValueId>& roots) {
  if (!isInPlaceOp(n.op) || n.args.empty() || !n.args[0].isValue()) return ir::kNoId;
  const ir::ValueId root = roots[static_cast<size_t>(n.args[0].toValue())];
  return root != ir::kNoId && g.inputIndex(root) ? root : ir::kNoId;
}

OpFamily classifyOp(std::string_view op) {
  std::string_view b = baseName(op);
  if (b.substr(0, 9) == "_foreach_") return OpFamily::Elementwise;
  const auto& table = familyTable();
  if (b == "copy_") return OpFamily::Copy;  // before stripping: copy_ is a copy
  // An in-place op costs what its functional form costs.
  if (b.size() > 1 && b.back() == '_') b.remove_suffix(1);
  auto it = table.find(b);
  return it == table.end() ? OpFamily::Other : it->second;
}

bool aliasesInput(const ir::Node& n) {
  return isInPlaceOp(n.op) || classifyOp(n.op) == OpFamily::View;
}

int64_t denseBytes(const ir::Graph& g, ir::ValueId v) {
  return g.value(v).type.bytes().value_or(0);
}

// Note [Reduced losses keep their element-wise buffer]
// ~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~
// ATen's mse_loss, smooth_l1_loss and binary_cross_entropy compute the
// element-wise loss into a buffer of their input's size and, with a
// reduction (mean or sum, the default mean), return the 0-dim result on that
// buffer's storage: the loss holds input-size bytes until it is freed.
// Measured on torch 2.13's CPU kernels: mse_loss of two f32[2, 4] returns a
// 0-dim tensor whose storage has 32 bytes, not 4; l1_loss, huber_loss,
// nll_loss, mean and sum return a fresh 4-byte one. The executor's measured
// memory (Note [Measured memory], runtime/memory_meter.h) found it: a GPipe
// pipeline keeps every micro-batch's loss until the backward, and device 3
// of the skip step measured 6.6 % over the simulated peak at batch 64 (the
// gap grows with the batch). A received copy of the loss is a clone, dense
// again (denseBytes).
namespace {

/// Position of the `reduction` argument of a loss that keeps its buffer, or -1.
int retainedReductionArg(std::string_view op) {
  if (op == "aten::mse_loss" || op == "aten::smooth_l1_loss") return 2;
  if (op == "aten::binary_cross_entropy") return 3;
  return -1;
}

}  // namespace

int64_t storageBytes(const ir::Graph& g, ir::ValueId v) {
  const ir::Value& val = g.value(v);
  const int64_t dense = val.type.bytes().value_or(0);
  if (val.producer == ir::kNoId) return dense;
  const ir::Node& n = g.node(val.producer);
  const int at = retainedReductionArg(n.op);
  if (at < 0 || n.outputs.empty() || n.outputs[0] != v || n.args.empty() || !n.args[0].isValue()) {
    return dense;
  }
  int64_t reduction = 1;  // at::Reduction::Mean, the schemas' default
  for (size_t k = 0; k < n.args.size(); ++k) {
    const ir::Arg& a = n.args[k];
    if ((a.keyword() == "reduction" || (a.keyword().empty() && k == static_cast<size_t>(at))) &&
        a.kind() == ir::Arg::Kind::Int) {
      reduction = a.toInt();
    }
  }
  if (reduction == 0) return dense;  // Reduction::None: the buffer is the output
  return std::max(dense, g.value(n.args[0].toValue()).type.bytes().value_or(0));
}

int64_t allocBytes(const ir::Graph& g, ir::ValueId v) {
  const ir::Value& val = g.value(v);
  if (val.producer != ir::kNoId && aliasesInput(g.node(val.producer))) {
    // Shares its first tensor input's storage; with no tensor input it is fresh.
    bool has_base = false;
    for (const ir::Arg& a : g.node(val.producer).args) {
      a.forEachValue([&](ir::ValueId b) { has_base = has_base || g.value(b).type.isTensor(); });
    }
    if (has_base) return 0;
  }
  return storageBytes(g, v);
}

std::vector<ir::ValueId> aliasBases(const ir::Graph& g) {
  std::vector<ir::ValueId> base(g.numValues(), ir::kNoId);
  for (const ir::Node& n : g.nodes()) {
    if (n.outputs.empty() || !aliasesInput(n)) continue;
    ir::ValueId first = ir::kNoId;
    for (const ir::Arg& a : n.args) {
      a.forEachValue([&](ir::ValueId v) {
        if (first == ir::kNoId && g.value(v).type.isTensor()) first = v;
      });
      if (first != ir::kNoId) break;
    }
    for (ir::ValueId o : n.outputs) base[static_cast<size_t>(o)] = first;
  }
  return base;
}

std::vector<ir::ValueId> storageRoots(const ir::Graph& g) {
  std::vector<ir::ValueId> root = aliasBases(g);
  // A base is defined before its alias, so ids increase along every chain.
  for (size_t v = 0; v < root.size(); ++v) {
    ir::ValueId b = root[v];
    root[v] = b == ir::kNoId ? static_cast<ir::ValueId>(v) : root[static_cast<size_t>(b)];
  }
  return root;
}

std::vector<std::pair<ir::NodeId, ir::NodeId>> inPlaceOrderEdges(const ir::Graph& g) {
  return inPlaceOrderEdges(flatten(g));
}

}  // namespace modelpar::passes
