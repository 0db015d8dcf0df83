"""Training loops as people write them, in every mode: the compiled model
called twice before one backward (a siamese or consistency loss), gradient
accumulation (two backward calls into the same .grad before the update),
and the gradient of the input (adversarial training, saliency maps).
Each against eager: the losses, every parameter's gradient and the input's.

Tolerances: tests/python/tolerances.py's per-model fp32 reduction-order
bound (placement moves sums between threads, micro-batching splits the
batch sums); the accumulated gradients are sums of two such results.
"""

from __future__ import annotations

import copy

import pytest
import torch

import modelpar
from models import CASES

MODES: dict[str, dict] = {
    "m-etf": {"devices": 2, "placer": "m-etf"},
    "gpipe": {"devices": 2, "pipeline": {"microbatches": 2}},
    # the model alone under 1F1B: split mode runs fill-drain (with a warning)
    "1f1b": {"devices": 2, "pipeline": {"schedule": "1f1b", "microbatches": 2}},
    "auto": {"devices": 2, "strategy": "auto"},
}


@pytest.fixture(autouse=True)
def _fresh() -> None:
    torch._dynamo.reset()
    modelpar.clear_plans()


def _grads_equal(model: torch.nn.Module, eager: torch.nn.Module, tol, what: str) -> None:
    scale = max(float(q.grad.abs().max()) for q in eager.parameters())
    for (n, p), q in zip(model.named_parameters(), eager.parameters()):
        tol.assert_close(p.grad, q.grad, scale=scale, msg=lambda m, n=n: f"{what}: grad of {n}: {m}")


@pytest.mark.filterwarnings("ignore:modelpar pipeline")
@pytest.mark.parametrize("mode", list(MODES))
def test_the_model_called_twice_before_one_backward(mode: str) -> None:
    """Two forwards of the compiled model, then one backward through both:
    each call's saved activations must survive the other's (a pipeline in
    split mode runs its backward program once per forward)."""
    case = CASES["gpt"]
    torch.manual_seed(0)
    model = case.make_model()
    eager = copy.deepcopy(model)
    fast = torch.compile(model, backend="modelpar", options={"strict": True, **MODES[mode]})
    tol = case.tol.after(steps=2)
    for step in range(2):
        x1, y = case.batch(step, 8)
        x2, _ = case.batch(step + 10, 8)
        loss = case.loss(fast(x1), y) + 0.5 * case.loss(fast(x2), y)
        ref = case.loss(eager(x1), y) + 0.5 * case.loss(eager(x2), y)
        tol.assert_close(loss.detach(), ref.detach(), msg=lambda m: f"step {step} loss: {m}")
        loss.backward()
        ref.backward()
    _grads_equal(model, eager, tol, mode)


@pytest.mark.filterwarnings("ignore:modelpar pipeline")
@pytest.mark.parametrize("mode", list(MODES))
def test_gradient_accumulation_sums_like_eager(mode: str) -> None:
    """Two batches' halves of the loss backward into the same .grad, then
    one update, twice."""
    case = CASES["gpt"]
    torch.manual_seed(0)
    model = case.make_model()
    eager = copy.deepcopy(model)
    fast = torch.compile(lambda x, y: case.loss(model(x), y), backend="modelpar",
                         options={"strict": True, **MODES[mode]})
    opt = torch.optim.SGD(model.parameters(), lr=0.05)
    ref_opt = torch.optim.SGD(eager.parameters(), lr=0.05)
    tol = case.tol.after(steps=4)
    for update in range(2):
        for part in range(2):
            x, y = case.batch(2 * update + part, 8)
            loss = fast(x, y) / 2
            ref = case.loss(eager(x), y) / 2
            tol.assert_close(loss.detach(), ref.detach(),
                             msg=lambda m: f"update {update} part {part}: {m}")
            loss.backward()
            ref.backward()
        _grads_equal(model, eager, tol, f"{mode}, update {update}")
        opt.step()
        ref_opt.step()
        opt.zero_grad()
        ref_opt.zero_grad()


@pytest.mark.filterwarnings("ignore:modelpar pipeline")
@pytest.mark.parametrize("mode", list(MODES))
def test_the_inputs_gradient_equals_eagers(mode: str) -> None:
    case = CASES["mlp"]
    torch.manual_seed(0)
    model = case.make_model()
    eager = copy.deepcopy(model)
    fast = torch.compile(lambda x, y: case.loss(model(x), y), backend="modelpar",
                         options={"strict": True, **MODES[mode]})
    x, y = case.batch(0, 8)
    x = x.clone().requires_grad_()
    x_ref = x.detach().clone().requires_grad_()
    fast(x, y).backward()
    case.loss(eager(x_ref), y).backward()
    assert x.grad is not None, "no gradient for the input"
    case.tol.assert_close(x.grad, x_ref.grad, scale=float(x_ref.grad.abs().max()))
    _grads_equal(model, eager, case.tol, mode)
