"""The hand-written 2-device pipeline example computes exactly the single-device
training step, which in turn equals eager PyTorch autograd; broken copies are rejected."""
from __future__ import annotations

from pathlib import Path

import pytest
import torch

import modelpar
from tolerances import Reordered

# The hand-written step and the pipelined program add the MLP's sums (32 wide, batch 8) in
# other orders than autograd, 2 layers forward and backward (tests/python/tolerances.py).
TOL = Reordered(32, depth=4)

EXAMPLES = Path(__file__).resolve().parents[2] / "examples" / "ir"


def _inputs(seed: int) -> list[torch.Tensor]:
    gen = torch.Generator().manual_seed(seed)
    return [torch.randn(8, 16, generator=gen), torch.randn(8, 4, generator=gen),
            torch.randn(16, 32, generator=gen) * 0.3, torch.randn(32, 4, generator=gen) * 0.3]


def _eager_step(x, y, w1, w2, lr=0.1):
    w1 = w1.clone().requires_grad_()
    w2 = w2.clone().requires_grad_()
    loss = torch.nn.functional.mse_loss(torch.relu(x @ w1) @ w2, y)
    loss.backward()
    with torch.no_grad():
        return [loss.detach(), w1 - lr * w1.grad, w2 - lr * w2.grad]


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_single_device_step_equals_eager_autograd(seed: int) -> None:
    graph = modelpar.ir.load_graph(str(EXAMPLES / "mlp_step.txt"))
    inputs = _inputs(seed)
    for got, want in zip(modelpar.run_graph(graph, inputs), _eager_step(*inputs)):
        TOL.assert_close(got, want)


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_pipelined_program_equals_single_device_graph(seed: int) -> None:
    program = modelpar.ir.load_program(str(EXAMPLES / "mlp_pipeline_2dev.txt"))
    graph = modelpar.ir.load_graph(str(EXAMPLES / "mlp_step.txt"))
    inputs = _inputs(seed)
    pipelined = modelpar.run_program(program, inputs)
    single = modelpar.run_graph(graph, inputs)
    assert len(pipelined) == 3
    for got, want in zip(pipelined, single):
        # Micro-batch accumulation reorders float sums: equal up to rounding.
        TOL.assert_close(got, want)


def test_program_without_a_send_is_rejected() -> None:
    program = modelpar.ir.load_program(str(EXAMPLES / "mlp_pipeline_2dev_missing_send.txt"))
    with pytest.raises(modelpar.InvalidIrError, match=r"%a_1"):
        program.verify()


def test_deadlocking_program_is_rejected_and_not_run() -> None:
    program = modelpar.ir.load_program(str(EXAMPLES / "mlp_pipeline_2dev_deadlock.txt"))
    with pytest.raises(modelpar.InvalidIrError, match="deadlock"):
        program.verify()
    with pytest.raises(modelpar.InvalidIrError, match="deadlock"):
        modelpar.run_program(program, _inputs(0))


def test_ir_demo_runs_and_reports_success(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    from modelpar.demo.ir_walkthrough import run_ir_demo
    assert run_ir_demo(out_dir=str(tmp_path)) == 0
    out = capsys.readouterr().out
    assert "all checks passed" in out
    assert (tmp_path / "mlp_pipeline_program.dot").read_text().startswith("digraph")


@pytest.mark.parametrize("batch", [16, 5])
def test_four_layer_gradient_step_equals_eager_autograd(batch: int) -> None:
    # examples/rank_train.cpp checks its ranks against this hand-written
    # graph run in one piece; here the graph itself meets autograd. Its sums
    # are at most 64 long, 8 matmuls deep on the way to dw1 (4 forward, 4
    # backward).
    tol = Reordered(64, depth=8)
    graph = modelpar.ir.load_graph(str(EXAMPLES / "mlp4_grads_symbolic.txt"))
    gen = torch.Generator().manual_seed(batch)
    x, y = torch.randn(batch, 32, generator=gen), torch.randn(batch, 8, generator=gen)
    ws = [torch.randn(a, b, generator=gen) / a**0.5 for a, b in [(32, 64), (64, 64), (64, 64), (64, 8)]]
    got = modelpar.run_graph(graph, [x, y, *ws])
    leaves = [w.clone().requires_grad_() for w in ws]
    h = x
    for i, w in enumerate(leaves):
        h = h @ w if i == 3 else torch.relu(h @ w)
    loss = torch.nn.functional.mse_loss(h, y)
    loss.backward()
    assert len(got) == 5
    tol.assert_close(got[0], loss.detach())
    for g, w in zip(got[1:], leaves):
        tol.assert_close(g, w.grad)
