// PrivateUse1 kernels for the fused RNN cells. PyTorch's RNN code picks
// `_thnn_fused_lstm_cell` / `_thnn_fused_gru_cell` for any non-CPU device
// (PrivateUse1 included), but only CUDA implements them, so a step replayed
// on the CPU could not run them. These kernels compute the same thing with
// ATen ops on the modelpar tensors, which records those ops instead: the
// formulas of aten/src/ATen/native/cuda/RNN.cu, in the order of the CPU
// cells of aten/src/ATen/native/RNN.cpp (biases added to each gate input
// first) so that results round like eager CPU.
#include <optional>
#include <tuple>

#include <ATen/TensorOperators.h>
#include <ATen/core/Tensor.h>
#include <ATen/ops/cat.h>
#include <ATen/ops/zeros_like.h>
#include <torch/library.h>

namespace modelpar::backend {
namespace {

using at::Tensor;

Tensor plus(const Tensor& gates, const std::optional<Tensor>& bias) {
  return bias && bias->defined() ? gates + *bias : gates;
}

bool given(const std::optional<Tensor>& t) { return t && t->defined(); }

// (input_gates, hidden_gates, cx, input_bias, hidden_bias) -> (hy, cy, workspace)
// Gates in the order i, f, g, o; workspace = [i, f, g, o] after activation.
std::tuple<Tensor, Tensor, Tensor> lstmCell(const Tensor& igates, const Tensor& hgates, const Tensor& cx,
                                            const std::optional<Tensor>& ibias,
                                            const std::optional<Tensor>& hbias) {
  const Tensor in = plus(igates, ibias);  // sequenced: the recorded order is fixed
  const Tensor hid = plus(hgates, hbias);
  const Tensor gates = in + hid;
  const std::vector<Tensor> c = gates.chunk(4, 1);
  const Tensor i = c[0].sigmoid(), f = c[1].sigmoid(), g = c[2].tanh(), o = c[3].sigmoid();
  const Tensor cy = f * cx + i * g;
  const Tensor hy = o * cy.tanh();
  return {hy, cy, at::cat({i, f, g, o}, 1)};
}

// (grad_hy?, grad_cy?, cx, cy, workspace, has_bias) -> (grad_gates, grad_cx, grad_bias)
std::tuple<Tensor, Tensor, Tensor> lstmCellBackward(const std::optional<Tensor>& grad_hy,
                                                    const std::optional<Tensor>& grad_cy,
                                                    const Tensor& cx, const Tensor& cy,
                                                    const Tensor& workspace, bool has_bias) {
  if (!given(grad_hy) && !given(grad_cy)) return {};
  const std::vector<Tensor> w = workspace.chunk(4, 1);
  const Tensor &i = w[0], &f = w[1], &g = w[2], &o = w[3];
  const Tensor tc = cy.tanh();
  Tensor gc;
  Tensor go_gate;
  if (given(grad_hy)) {
    gc = *grad_hy * o * (1 - tc * tc);
    go_gate = *grad_hy * tc * (1 - o) * o;
  } else {
    gc = at::zeros_like(cy);
    go_gate = at::zeros_like(o);
  }
  if (given(grad_cy)) gc = gc + *grad_cy;
  const Tensor gi = gc * g * (1 - i) * i;
  const Tensor gf = gc * cx * (1 - f) * f;
  const Tensor gg = gc * i * (1 - g * g);
  const Tensor grad_gates = at::cat({gi, gf, gg, go_gate}, 1);
  return {grad_gates, gc * f, has_bias ? grad_gates.sum(0) : Tensor()};
}

// (input_gates, hidden_gates, hx, input_bias, hidden_bias) -> (hy, workspace)
// Gates in the order r, z, n; workspace = [r, z, n, hx, hidden n-gate].
std::tuple<Tensor, Tensor> gruCell(const Tensor& igates, const Tensor& hgates, const Tensor& hx,
                                   const std::optional<Tensor>& ibias, const std::optional<Tensor>& hbias) {
  const std::vector<Tensor> ic = plus(igates, ibias).chunk(3, 1);
  const std::vector<Tensor> hc = plus(hgates, hbias).chunk(3, 1);
  const Tensor r = (hc[0] + ic[0]).sigmoid();
  const Tensor z = (hc[1] + ic[1]).sigmoid();
  const Tensor n = (ic[2] + hc[2] * r).tanh();
  const Tensor hy = (hx - n) * z + n;
  return {hy, at::cat({r, z, n, hx, hc[2]}, 1)};
}

// (grad_hy, workspace, has_bias) ->
//   (grad_input_gates, grad_hidden_gates, grad_hx, grad_input_bias, grad_hidden_bias)
std::tuple<Tensor, Tensor, Tensor, Tensor, Tensor> gruCellBackward(const Tensor& grad_hy,
                                                                   const Tensor& workspace,
                                                                   bool has_bias) {
  const std::vector<Tensor> w = workspace.chunk(5, 1);
  const Tensor &r = w[0], &z = w[1], &n = w[2], &hx = w[3], &hn = w[4];
  const Tensor gz = grad_hy * (hx - n) * (1 - z) * z;
  const Tensor ghx = grad_hy * z;
  const Tensor gn = grad_hy * (1 - z) * (1 - n * n);
  const Tensor ghn = gn * r;
  const Tensor gr = gn * hn * (1 - r) * r;
  const Tensor gi = at::cat({gr, gz, gn}, 1);
  const Tensor gh = at::cat({gr, gz, ghn}, 1);
  if (!has_bias) return {gi, gh, ghx, Tensor(), Tensor()};
  return {gi, gh, ghx, gi.sum(0), gh.sum(0)};
}

TORCH_LIBRARY_IMPL(aten, PrivateUse1, m) {
  m.impl("_thnn_fused_lstm_cell", TORCH_FN(lstmCell));
  m.impl("_thnn_fused_lstm_cell_backward_impl", TORCH_FN(lstmCellBackward));
  m.impl("_thnn_fused_gru_cell", TORCH_FN(gruCell));
  m.impl("_thnn_fused_gru_cell_backward", TORCH_FN(gruCellBackward));
}

}  // namespace
}  // namespace modelpar::backend
