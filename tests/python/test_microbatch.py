"""modelpar.microbatch and modelpar.checkpoint numerically: the split and the
checkpointed steps, run on the reference interpreter, give the full-batch
step's loss, outputs, gradients and updated parameters (passes/pipeline/microbatch.h,
passes/pipeline/checkpoint.h; the structure is tested in tests/passes/)."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

import modelpar
from tolerances import Reordered

ROOT = Path(__file__).resolve().parents[2]
# Micro-batching splits the sums over the batch (tests/python/tolerances.py): the MLP steps
# here sum at most 32 terms (hidden width; batches up to 10), 3 layers forward and backward.
TOL = Reordered(32, depth=6)
# Batch norm over micro-batches of at most 10 x 4 x 4 = 160 positions, forward and backward.
BN_TOL = Reordered(160, depth=2)

# The symbolic MLP step with a sum-reduced loss (reduction=2).
MLP_SUM = (ROOT / "examples/ir/mlp_step_symbolic.txt").read_text().replace(
    "aten::mse_loss(%p, %y, 1)", "aten::mse_loss(%p, %y, 2)").replace(
    "aten::mse_loss_backward(%g, %p, %y, 1)", "aten::mse_loss_backward(%g, %p, %y, 2)")

# The MLP with the backward seed as a tangent input (AOTAutograd's joint form).
MLP_TANGENT = (ROOT / "examples/ir/mlp_step_symbolic.txt").read_text().replace(
    "%w2: f32[32, 4] param) {", "%w2: f32[32, 4] param, %tangent: f32[] input) {").replace(
    '  %g: f32[] = aten::ones_like(%loss) {layer="loss", phase=bwd}\n', "").replace(
    "aten::mse_loss_backward(%g,", "aten::mse_loss_backward(%tangent,")

# A skip connection, a mean loss through aten::mean, and the batch size as an
# int input (torch.compile's `%s0: int input`) in expand and the mean's divisor:
#   h = relu(x @ w1);  z = relu(h @ w2) + h;  p = z @ w3;  loss = mean((p - y)^2)
SKIP = """
graph @skip(%x: f32[B, 8] input, %y: f32[B, 3] input, %B: int input,
            %w1: f32[8, 16] param, %w2: f32[16, 16] param, %w3: f32[16, 3] param) {
  %h0: f32[B, 16] = aten::mm(%x, %w1) {layer="l1", phase=fwd}
  %h: f32[B, 16] = aten::relu(%h0) {layer="l1", phase=fwd}
  %r0: f32[B, 16] = aten::mm(%h, %w2) {layer="l2", phase=fwd}
  %r: f32[B, 16] = aten::relu(%r0) {layer="l2", phase=fwd}
  %z: f32[B, 16] = aten::add.Tensor(%r, %h) {layer="l2", phase=fwd}
  %p: f32[B, 3] = aten::mm(%z, %w3) {layer="l3", phase=fwd}
  %d: f32[B, 3] = aten::sub.Tensor(%p, %y) {layer="loss", phase=fwd}
  %sq: f32[B, 3] = aten::mul.Tensor(%d, %d) {layer="loss", phase=fwd}
  %loss: f32[] = aten::mean(%sq) {layer="loss", phase=fwd}
  %g: f32[] = aten::ones_like(%loss) {layer="loss", phase=bwd}
  %ge: f32[B, 3] = aten::expand(%g, [%B, 3]) {layer="loss", phase=bwd}
  %n: int = modelpar::sym_mul(%B, 3) {layer="loss", phase=bwd}
  %gs: f32[B, 3] = aten::div.Scalar(%ge, %n) {layer="loss", phase=bwd}
  %gd: f32[B, 3] = aten::mul.Tensor(%gs, %d) {layer="loss", phase=bwd}
  %dp: f32[B, 3] = aten::mul.Scalar(%gd, 2) {layer="loss", phase=bwd}
  %zt: f32[16, B] = aten::t(%z) {layer="l3", phase=bwd}
  %dw3: f32[16, 3] = aten::mm(%zt, %dp) {layer="l3", phase=bwd}
  %w3t: f32[3, 16] = aten::t(%w3) {layer="l3", phase=bwd}
  %dz: f32[B, 16] = aten::mm(%dp, %w3t) {layer="l3", phase=bwd}
  %dr0: f32[B, 16] = aten::threshold_backward(%dz, %r, 0) {layer="l2", phase=bwd}
  %ht: f32[16, B] = aten::t(%h) {layer="l2", phase=bwd}
  %dw2: f32[16, 16] = aten::mm(%ht, %dr0) {layer="l2", phase=bwd}
  %w2t: f32[16, 16] = aten::t(%w2) {layer="l2", phase=bwd}
  %dhm: f32[B, 16] = aten::mm(%dr0, %w2t) {layer="l2", phase=bwd}
  %dh: f32[B, 16] = aten::add.Tensor(%dhm, %dz) {layer="l2", phase=bwd}
  %dh0: f32[B, 16] = aten::threshold_backward(%dh, %h, 0) {layer="l1", phase=bwd}
  %xt: f32[8, B] = aten::t(%x) {layer="l1", phase=bwd}
  %dw1: f32[8, 16] = aten::mm(%xt, %dh0) {layer="l1", phase=bwd}
  %w1_new: f32[8, 16] = aten::sub.Tensor(%w1, %dw1, alpha=0.1) {layer="l1", phase=update}
  %w2_new: f32[16, 16] = aten::sub.Tensor(%w2, %dw2, alpha=0.1) {layer="l2", phase=update}
  %w3_new: f32[16, 3] = aten::sub.Tensor(%w3, %dw3, alpha=0.1) {layer="l3", phase=update}
  return %loss, %p, %dw1, %w1_new, %w2_new, %w3_new
}
"""

# Dropout between two layers: its mask must not be redrawn by recomputation.
DROPOUT = """
graph @drop(%x: f32[B, 8] input, %w1: f32[8, 16] param, %w2: f32[16, 2] param) {
  %h: f32[B, 16] = aten::mm(%x, %w1) {layer="l1", phase=fwd}
  %a: f32[B, 16] = aten::tanh(%h) {layer="l1", phase=fwd}
  %o: f32[B, 16], %mask: bool[B, 16] = aten::native_dropout(%a, 0.5, true) {layer="l1", phase=fwd}
  %e: f32[B, 16] = aten::exp(%o) {layer="l2", phase=fwd}
  %p: f32[B, 2] = aten::mm(%e, %w2) {layer="l2", phase=fwd}
  %loss: f32[] = aten::sum(%p) {layer="loss", phase=fwd}
  %g: f32[] = aten::ones_like(%loss) {layer="loss", phase=bwd}
  %dp: f32[B, 2] = aten::expand_as(%g, %p) {layer="loss", phase=bwd}
  %et: f32[16, B] = aten::t(%e) {layer="l2", phase=bwd}
  %dw2: f32[16, 2] = aten::mm(%et, %dp) {layer="l2", phase=bwd}
  %w2t: f32[2, 16] = aten::t(%w2) {layer="l2", phase=bwd}
  %de: f32[B, 16] = aten::mm(%dp, %w2t) {layer="l2", phase=bwd}
  %do: f32[B, 16] = aten::mul.Tensor(%de, %e) {layer="l2", phase=bwd}
  %da: f32[B, 16] = aten::native_dropout_backward(%do, %mask, 2.0) {layer="l1", phase=bwd}
  %dh: f32[B, 16] = aten::tanh_backward(%da, %a) {layer="l1", phase=bwd}
  %xt: f32[8, B] = aten::t(%x) {layer="l1", phase=bwd}
  %dw1: f32[8, 16] = aten::mm(%xt, %dh) {layer="l1", phase=bwd}
  return %loss, %dw1, %dw2
}
"""

# A training-mode batch norm step in the node forms torch.compile's modelpar
# backend imports (the functional batch norm, its backward reading the new
# running stats it ignores), with a sum loss against a target t.
BN_STEP = """
graph @bn(%x: f32[B, 3, 4, 4] input, %t: f32[B, 3, 4, 4] input, %w: f32[3] param,
          %b: f32[3] param, %rm: f32[3] buffer, %rv: f32[3] buffer) {
  %y: f32[B, 3, 4, 4], %mean: f32[3], %rstd: f32[3], %rm2: f32[3], %rv2: f32[3] = aten::_native_batch_norm_legit_functional(%x, %w, %b, %rm, %rv, true, 0.1, 1e-05) {layer="bn", phase=fwd}
  %p: f32[B, 3, 4, 4] = aten::mul.Tensor(%y, %t) {layer="loss", phase=fwd}
  %loss: f32[] = aten::sum(%p) {layer="loss", phase=fwd}
  %g: f32[] = aten::ones_like(%loss) {layer="loss", phase=bwd}
  %dy: f32[B, 3, 4, 4] = aten::mul.Tensor(%t, %g) {layer="loss", phase=bwd}
  %dx: f32[B, 3, 4, 4], %dw: f32[3], %db: f32[3] = aten::native_batch_norm_backward(%dy, %x, %w, %rm2, %rv2, %mean, %rstd, true, 1e-05, [true, true, true]) {layer="bn", phase=bwd}
  %w_new: f32[3] = aten::sub.Tensor(%w, %dw, alpha=0.1) {layer="bn", phase=update}
  return %loss, %y, %rm2, %rv2, %dw, %db, %w_new
}
"""


@pytest.fixture(autouse=True)
def _seed() -> None:
    torch.manual_seed(0)


def mlp_inputs(batch: int, tangent: bool = False) -> list:
    xs = [torch.randn(batch, 16), torch.randn(batch, 4), torch.randn(16, 32) * 0.3,
          torch.randn(32, 4) * 0.3]
    return xs + [torch.tensor(1.0)] if tangent else xs


def skip_inputs(batch: int) -> list:
    return [torch.randn(batch, 8), torch.randn(batch, 3), batch, torch.randn(8, 16) * 0.3,
            torch.randn(16, 16) * 0.3, torch.randn(16, 3) * 0.3]


def assert_same(a: list, b: list) -> None:
    assert len(a) == len(b)
    for i, (x, y) in enumerate(zip(a, b)):
        TOL.assert_close(x, y, msg=lambda m, i=i: f"output {i}: {m}")


@pytest.mark.parametrize("m", [1, 2, 3, 4])
@pytest.mark.parametrize("batch", [8, 10])
@pytest.mark.parametrize("text", ["mean", "sum", "tangent"])
def test_mlp_step_split_equals_full_batch(text: str, batch: int, m: int) -> None:
    graph = {"mean": modelpar.ir.load_graph(ROOT / "examples/ir/mlp_step_symbolic.txt"),
             "sum": modelpar.parse_graph(MLP_SUM),
             "tangent": modelpar.parse_graph(MLP_TANGENT)}[text]
    inputs = mlp_inputs(batch, tangent=text == "tangent")
    split = modelpar.microbatch(graph, microbatches=m, batch_size=batch)
    split.verify()
    assert_same(modelpar.run_graph(split, inputs), modelpar.run_graph(graph, inputs))


def test_full_mlp_step_equals_autograd() -> None:
    """The reference graph is a real step: its loss and update match autograd."""
    x, y, w1, w2 = mlp_inputs(8)
    w1r, w2r = w1.clone().requires_grad_(), w2.clone().requires_grad_()
    loss = torch.nn.functional.mse_loss(torch.relu(x @ w1r) @ w2r, y)
    loss.backward()
    graph = modelpar.ir.load_graph(ROOT / "examples/ir/mlp_step_symbolic.txt")
    out = modelpar.run_graph(modelpar.microbatch(graph, microbatches=3, batch_size=8),
                             [x, y, w1, w2])
    assert_same(out, [loss.detach(), w1 - 0.1 * w1r.grad, w2 - 0.1 * w2r.grad])


@pytest.mark.parametrize("m", [1, 2, 3, 4])
def test_skip_connection_split_equals_full_batch_and_autograd(m: int) -> None:
    graph = modelpar.parse_graph(SKIP)
    inputs = skip_inputs(10)
    full = modelpar.run_graph(graph, inputs)
    split = modelpar.microbatch(graph, microbatches=m, batch_size=10)
    assert_same(modelpar.run_graph(split, inputs), full)
    x, y, _, w1, w2, w3 = inputs
    ws = [w.clone().requires_grad_() for w in (w1, w2, w3)]
    h = torch.relu(x @ ws[0])
    p = (torch.relu(h @ ws[1]) + h) @ ws[2]
    loss = ((p - y) ** 2).mean()
    loss.backward()
    assert_same(full, [loss.detach(), p.detach(), ws[0].grad] +
                [w - 0.1 * wr.grad for w, wr in zip((w1, w2, w3), ws)])


def test_microbatch_sizes_follow_torch_chunk() -> None:
    for batch, m in [(10, 3), (10, 4), (10, 6), (8, 8), (7, 2)]:
        expected = [len(c) for c in torch.arange(batch).chunk(m)]
        assert modelpar.planning.pipeline.microbatch_sizes(batch, m) == expected


def test_errors_map_to_python_classes() -> None:
    graph = modelpar.ir.load_graph(ROOT / "examples/ir/mlp_step.txt")  # static batch of 8
    with pytest.raises(modelpar.ConfigError, match=r"f32\[B, 16\]"):
        modelpar.microbatch(graph, microbatches=2, batch_size=8)
    sym = modelpar.ir.load_graph(ROOT / "examples/ir/mlp_step_symbolic.txt")
    with pytest.raises(modelpar.ConfigError, match="9 micro-batches asked for a batch of 8"):
        modelpar.microbatch(sym, microbatches=9, batch_size=8)
    with pytest.raises(modelpar.UnsupportedOpError, match="native_dropout"):
        modelpar.microbatch(modelpar.parse_graph(DROPOUT), microbatches=2, batch_size=8,
                            allow_random=False)


# ---- checkpoint -----------------------------------------------------------------


@pytest.mark.parametrize("mode", ["always", "except_last", "never"])
@pytest.mark.parametrize("m", [1, 3])
def test_checkpointed_skip_step_equals_full_batch(mode: str, m: int) -> None:
    graph = modelpar.parse_graph(SKIP)
    inputs = skip_inputs(9)
    split = modelpar.microbatch(graph, microbatches=m, batch_size=9)
    ck = modelpar.checkpoint(split, {"l1": 0, "l2": 0, "l3": 1, "loss": 1}, mode=mode)
    ck.graph.verify()
    assert len(ck.stage_of_node) == ck.graph.num_nodes
    checkpointed = {mb for _, mb, _ in ck.groups}
    expected = {"always": set(range(m)), "except_last": set(range(m - 1)), "never": set()}[mode]
    assert checkpointed == expected
    assert_same(modelpar.run_graph(ck.graph, inputs), modelpar.run_graph(graph, inputs))


def test_checkpoint_keeps_dropout_masks() -> None:
    """Recomputation reads the stored mask: the checkpointed step draws the
    same random numbers as the plain one, so results are identical."""
    split = modelpar.microbatch(modelpar.parse_graph(DROPOUT), microbatches=2, batch_size=6,
                                allow_random=True)
    ck = modelpar.checkpoint(split, [0] * split.num_nodes, mode="always")
    names = [n for _, _, group in ck.groups for n in group]
    assert names and not any("dropout" in n or n.startswith("o.") for n in names)
    assert "e.mb0.rc" in names and "a.mb0.rc" in names
    inputs = [torch.randn(6, 8), torch.randn(8, 16), torch.randn(16, 2)]
    torch.manual_seed(1)
    plain = modelpar.run_graph(split, inputs)
    torch.manual_seed(1)
    again = modelpar.run_graph(ck.graph, inputs)
    for a, b in zip(plain, again):
        assert torch.equal(a, b)


def test_checkpoint_stage_dict_must_cover_every_layer() -> None:
    split = modelpar.microbatch(modelpar.parse_graph(SKIP), microbatches=2, batch_size=4)
    with pytest.raises(modelpar.ConfigError, match="layer 'l3'"):
        modelpar.checkpoint(split, {"l1": 0, "l2": 0, "loss": 1})
    with pytest.raises(modelpar.ConfigError, match="sometimes"):
        modelpar.checkpoint(split, [0] * split.num_nodes, mode="sometimes")


def test_comparison_sees_a_wrong_loss_weight() -> None:
    """The equality above is not vacuous: weighting a mean loss as a sum
    (w_k = 1) gives gradients m times too large, and the check sees it."""
    graph = modelpar.ir.load_graph(ROOT / "examples/ir/mlp_step_symbolic.txt")
    inputs = mlp_inputs(8)
    wrong = modelpar.microbatch(graph, microbatches=2, batch_size=8, loss_reduction="sum")
    full = modelpar.run_graph(graph, inputs)
    got = modelpar.run_graph(wrong, inputs)
    TOL.assert_close(got[0], 2 * full[0])
    w1 = inputs[2]
    TOL.assert_close(got[1] - w1, 2 * (full[1] - w1))


# ---- deferred batch norm --------------------------------------------------------


def bn_inputs(batch: int) -> list:
    return [torch.randn(batch, 3, 4, 4) * 2 + 1, torch.randn(batch, 3, 4, 4), torch.randn(3),
            torch.randn(3), torch.randn(3), torch.rand(3) + 0.5]


@pytest.mark.parametrize("m", [2, 4])
@pytest.mark.parametrize("batch", [8, 10])
def test_deferred_batch_norm_updates_running_stats_like_the_full_batch(batch: int, m: int) -> None:
    graph = modelpar.parse_graph(BN_STEP)
    x, t, w, b, rm, rv = inputs = bn_inputs(batch)
    split = modelpar.microbatch(graph, microbatches=m, batch_size=batch, batch_norm="deferred")
    split.verify()
    loss, y, rm2, rv2, dw, db, w_new = modelpar.run_graph(split, inputs)
    # Running stats: eager PyTorch's update for the whole batch.
    rm_eager, rv_eager = rm.clone(), rv.clone()
    torch.nn.functional.batch_norm(x, rm_eager, rv_eager, w, b, training=True, momentum=0.1,
                                   eps=1e-5)
    BN_TOL.assert_close(rm2, rm_eager)
    BN_TOL.assert_close(rv2, rv_eager)
    assert not torch.allclose(rv2, rv)  # the update did something
    # Each micro-batch is normalised with its own statistics (torchgpipe's
    # DeferredBatchNorm); gradients are the sums of the micro-batches'.
    chunks = list(zip(x.chunk(m), t.chunk(m)))
    ys, grads = [], []
    for xk, tk in chunks:
        wr, br = w.clone().requires_grad_(), b.clone().requires_grad_()
        yk = torch.nn.functional.batch_norm(xk, None, None, wr, br, training=True, eps=1e-5)
        (yk * tk).sum().backward()
        ys.append(yk.detach())
        grads.append((wr.grad, br.grad))
    BN_TOL.assert_close(y, torch.cat(ys))
    BN_TOL.assert_close(dw, sum(g[0] for g in grads))
    BN_TOL.assert_close(db, sum(g[1] for g in grads))
    TOL.assert_close(w_new, w - 0.1 * dw)
    # The per-micro-batch statistics differ from the batch's: y is not the
    # full batch's (so the comparison above is not vacuous).
    full = modelpar.run_graph(graph, inputs)
    assert not torch.allclose(y, full[1], atol=1e-3)


def test_deferred_batch_norm_with_one_microbatch_equals_the_unsplit_step() -> None:
    graph = modelpar.parse_graph(BN_STEP)
    inputs = bn_inputs(6)
    split = modelpar.microbatch(graph, microbatches=1, batch_size=6, batch_norm="deferred")
    assert_same(modelpar.run_graph(split, inputs), modelpar.run_graph(graph, inputs))


def test_batch_norm_is_refused_unless_deferred() -> None:
    graph = modelpar.parse_graph(BN_STEP)
    with pytest.raises(modelpar.UnsupportedOpError, match="batch_norm option to deferred"):
        modelpar.microbatch(graph, microbatches=2, batch_size=8)
    with pytest.raises(modelpar.ConfigError, match="batch_norm='lazy' is not valid; batch_norm takes one of 'refuse', 'deferred'"):
        modelpar.microbatch(graph, microbatches=2, batch_size=8, batch_norm="lazy")
