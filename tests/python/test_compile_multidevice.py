"""torch.compile(backend="modelpar", options={"devices": N, "placer": ...}):
every AOTAutograd graph planned by passes' plan() and run by the
multi-device Executor on N CPU worker devices; outputs, gradients and
optimizer steps equal eager."""

from __future__ import annotations

import copy

import pytest
import torch

import modelpar
from models import MLP, InceptionNet


def _model_and_input(name: str) -> tuple[torch.nn.Module, torch.Tensor]:
    torch.manual_seed(0)
    if name == "mlp":
        return MLP(), torch.randn(8, 16)
    return InceptionNet(), torch.randn(2, 3, 8, 8)


def _close(a: torch.Tensor, b: torch.Tensor) -> None:
    torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("devices", [2, 4])
@pytest.mark.parametrize("placer", ["m-etf", "m-topo"])
@pytest.mark.parametrize("name", ["mlp", "inception"])
def test_outputs_gradients_and_sgd_steps_equal_eager(name: str, devices: int, placer: str) -> None:
    torch._dynamo.reset()
    eager, x = _model_and_input(name)
    model = copy.deepcopy(eager)
    fast = torch.compile(model, backend="modelpar",
                         options={"devices": devices, "placer": placer, "strict": True})

    out, ref = fast(x), eager(x)
    _close(out, ref)
    out.square().sum().backward()
    ref.square().sum().backward()
    for (n, p), (_, q) in zip(model.named_parameters(), eager.named_parameters()):
        assert p.grad is not None, n
        _close(p.grad, q.grad)

    plan = modelpar.plans()[-1]
    assert set(plan.graphs) == {"forward", "backward"}
    assert all(r.runs_on == "modelpar" and r.placement is not None for r in plan.graphs.values())
    text = str(plan)
    assert f"{devices} CPU worker devices ({placer})" in text
    assert "simulated step" in text and "units" in text
    # Every backward node of a layer runs on its forward's device.
    fw, bw = plan.graphs["forward"].placement, plan.graphs["backward"].placement
    for layer, dev in bw.layer_devices.items():
        if layer in fw.layer_devices:
            assert dev == fw.layer_devices[layer], layer

    opt = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)
    ref_opt = torch.optim.SGD(eager.parameters(), lr=0.05, momentum=0.9)
    for _ in range(3):
        opt.zero_grad()
        ref_opt.zero_grad()
        fast(x).square().sum().backward()
        eager(x).square().sum().backward()
        opt.step()
        ref_opt.step()
    for p, q in zip(model.parameters(), eager.parameters()):
        _close(p, q)
    with torch.no_grad():
        _close(fast(x), eager(x))


def test_bad_placer_lists_valid_ones() -> None:
    with pytest.raises(modelpar.ConfigError, match="placer takes one of 'm-topo', 'm-etf', 'm-sct'"):
        modelpar.resolve_options({"devices": 2, "placer": "best"})
    fast = torch.compile(MLP(), backend="modelpar", options={"devices": 2, "placer": "best"})
    with pytest.raises(torch._dynamo.exc.BackendCompilerFailed) as err:
        fast(torch.randn(2, 16))
    assert isinstance(err.value.inner_exception, modelpar.ConfigError)
    assert "'m-topo', 'm-etf', 'm-sct'" in str(err.value)
