"""modelpar.clip_grad_norm_ and modelpar.GradScaler in one process: the
gradients of a model placed on two CPU worker devices are all local, so they
are torch's (same norm, same clipped gradients; the same skipped step); bad
arguments are ConfigErrors that change nothing. Over ranks: test_distributed.py
(test_gradient_clipping_over_ranks_uses_the_whole_models_norm,
test_grad_scaler_skips_a_step_on_every_rank_when_one_rank_overflows)."""

from __future__ import annotations

import copy

import pytest
import torch

import modelpar
from models import MLP
from tolerances import Reordered

# 16 inputs x batch 8 in fc1's weight gradient; three layers forward and back
TOL = Reordered(128, depth=6)


@pytest.fixture(autouse=True)
def _fresh_dynamo() -> None:
    torch._dynamo.reset()
    modelpar.clear_plans()


@pytest.mark.parametrize("norm_type", [2.0, float("inf"), 1.0])
def test_placed_model_clips_like_eager(norm_type: float) -> None:
    torch.manual_seed(0)
    model = MLP()
    eager = copy.deepcopy(model)
    fast = torch.compile(model, backend="modelpar", options={"devices": 2, "strict": True})
    x, y = torch.randn(8, 16), torch.randn(8, 4)
    torch.nn.functional.mse_loss(fast(x), y).backward()
    torch.nn.functional.mse_loss(eager(x), y).backward()
    norm = modelpar.clip_grad_norm_(model, 0.01, norm_type=norm_type)
    ref = torch.nn.utils.clip_grad_norm_(eager.parameters(), 0.01, norm_type=norm_type)
    assert float(ref) > 0.01  # clipping scaled the gradients
    TOL.assert_close(norm, ref)
    for (n, p), q in zip(model.named_parameters(), eager.parameters()):
        TOL.assert_close(p.grad, q.grad, msg=lambda m, n=n: f"{n}: {m}")
    assert all(g.runs_on == "modelpar" for g in modelpar.plans()[-1].graphs.values())


def test_bad_arguments_are_config_errors_and_clip_nothing() -> None:
    model = MLP()
    for p in model.parameters():
        p.grad = torch.ones_like(p)
    with pytest.raises(modelpar.ConfigError, match="expected a module, a tensor or an iterable"):
        modelpar.clip_grad_norm_(3, 1.0)
    with pytest.raises(modelpar.ConfigError, match="expected tensors, got str"):
        modelpar.clip_grad_norm_(["w"], 1.0)
    with pytest.raises(modelpar.ConfigError, match="max_norm must be a number"):
        modelpar.clip_grad_norm_(model, "1")
    with pytest.raises(modelpar.ConfigError, match="norm_type must be a number"):
        modelpar.clip_grad_norm_(model, 1.0, norm_type=None)
    assert all(bool((p.grad == 1).all()) for p in model.parameters())


def test_grad_scaler_in_one_process_is_torchs() -> None:
    torch.manual_seed(0)
    model = MLP()
    eager = copy.deepcopy(model)
    fast = torch.compile(model, backend="modelpar", options={"devices": 2, "strict": True})
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    ref_opt = torch.optim.SGD(eager.parameters(), lr=0.1)
    scaler = modelpar.GradScaler("cpu", init_scale=256.0)
    ref_scaler = torch.amp.GradScaler("cpu", init_scale=256.0)
    for step in range(3):
        x, y = torch.randn(8, 16), torch.randn(8, 4)
        scaler.scale(torch.nn.functional.mse_loss(fast(x), y)).backward()
        ref_scaler.scale(torch.nn.functional.mse_loss(eager(x), y)).backward()
        if step == 1:  # an overflow: both skip this step and halve the scale
            model.fc1.weight.grad[0, 0] = float("inf")
            eager.fc1.weight.grad[0, 0] = float("inf")
        for s, o in ((scaler, opt), (ref_scaler, ref_opt)):
            s.step(o)
            s.update()
            o.zero_grad()
        assert scaler.get_scale() == ref_scaler.get_scale()
    assert scaler.get_scale() == 128.0
    for (n, p), q in zip(model.named_parameters(), eager.parameters()):
        TOL.after(steps=3).assert_close(p, q, msg=lambda m, n=n: f"{n}: {m}")
