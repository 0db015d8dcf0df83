"""The modelpar device from eager Python: a model moved to "modelpar" trains
exactly like on the CPU, steps replay one captured plan, and what cannot be
captured breaks the graph or raises."""

from __future__ import annotations

import os
import warnings

import pytest
import torch

import modelpar
from device_training import train_on
from tolerances import Reordered

# The replayed step runs AOTAutograd-style decomposed ops, and capturable Adam evaluates its
# update with other ops than CPU Adam (tests/python/tolerances.py): the block's longest sum is
# 4 x 6 x 6 = 144 positions, about 6 reductions deep, over 4 optimizer steps.
TOL = Reordered(144, depth=6, steps=4)


class Block(torch.nn.Module):
    """conv + batch norm + linear with a residual add (no conv bias before batch
    norm: its gradient is rounding noise, which Adam would amplify)."""

    def __init__(self) -> None:
        super().__init__()
        self.conv1 = torch.nn.Conv2d(3, 6, 3, padding=1, bias=False)
        self.bn1 = torch.nn.BatchNorm2d(6)
        self.conv2 = torch.nn.Conv2d(6, 6, 3, padding=1, bias=False)
        self.bn2 = torch.nn.BatchNorm2d(6)
        self.fc = torch.nn.Linear(6 * 6 * 6, 5)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = torch.relu(self.bn1(self.conv1(x)))
        h = torch.relu(h + self.bn2(self.conv2(h)))
        return self.fc(h.flatten(1))


def _train(device: str, make_optimizer, steps: int) -> tuple[list[float], torch.nn.Module]:
    return train_on(device, Block, lambda p: make_optimizer(p, device), steps)


OPTIMIZERS = {
    "sgd": lambda p, device: torch.optim.SGD(p, lr=0.05),
    "sgd_momentum": lambda p, device: torch.optim.SGD(p, lr=0.05, momentum=0.9),
    # capturable: the step count lives on the device and bias corrections are
    # tensor ops, so every step records the same graph (the CPU reference
    # cannot be capturable; the arithmetic is the same).
    "adam": lambda p, device: torch.optim.Adam(p, lr=0.01, capturable=device != "cpu"),
}


@pytest.mark.parametrize("name", sorted(OPTIMIZERS))
def test_model_on_modelpar_trains_like_cpu(name: str) -> None:
    want, cpu_model = _train("cpu", OPTIMIZERS[name], steps=4)
    modelpar.device.reset_device_counters()
    got, dev_model = _train("modelpar", OPTIMIZERS[name], steps=4)
    TOL.assert_close(torch.tensor(got), torch.tensor(want))
    for (n, p_cpu), p_dev in zip(cpu_model.state_dict().items(), dev_model.state_dict().values()):
        assert p_dev.device.type == "modelpar", n
        TOL.assert_close(p_dev.cpu(), p_cpu, msg=n)
    counters = modelpar.device.device_counters()
    assert counters["graph_breaks"] == 0
    assert counters["captures"] + counters["replays"] == 4
    # Optimizers that create their state in the first step capture a second
    # graph for the second; from then on every step replays.
    assert counters["captures"] == (1 if name == "sgd" else 2)


def test_graph_names_layers_from_hooks_and_phases() -> None:
    _train("modelpar", OPTIMIZERS["sgd"], steps=1)
    g = modelpar.device.last_graph()
    assert "%conv1.weight: f32[6, 3, 3, 3] param" in g
    assert "%bn1.running_mean: f32[6] buffer" in g
    assert '{layer="conv1", phase=fwd}' in g
    assert '{layer="bn2", phase=fwd}' in g
    assert "phase=bwd" in g and "phase=update" in g


def test_device_and_tensor_methods() -> None:
    x = torch.arange(6.0).reshape(2, 3)
    m = x.to("modelpar")
    assert m.device == torch.device("modelpar", 0)
    assert m.is_modelpar and x.modelpar().is_modelpar
    assert torch.modelpar.device_count() == 1
    assert "device='modelpar:0'" in repr(m * 2)
    breaks = modelpar.device.device_counters()["graph_breaks"]
    assert str(m * 2).startswith("tensor([[ 0.,  2.,  4.]")  # printing materialises, no graph break
    assert modelpar.device.device_counters()["graph_breaks"] == breaks
    assert (m.sum() * 2).item() == 30.0
    torch.testing.assert_close((m.t() @ m).cpu(), x.t() @ x)


def test_inplace_and_slicing_assignment() -> None:
    x = torch.randn(4, 5)
    m = x.to("modelpar")
    for t in (x, m):
        t[:, 1:3] = 0.5
        t[2] += 1.0
        t.relu_()
    torch.testing.assert_close(m.cpu(), x)


def test_data_dependent_op_breaks_the_graph_with_one_warning() -> None:
    x = torch.randn(6, 4)
    m = x.to("modelpar") * 1.0
    before = modelpar.device.device_counters()["graph_breaks"]
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        got = torch.masked_select(m, m > 0)
    assert got.device.type == "modelpar"
    torch.testing.assert_close(got.cpu(), torch.masked_select(x, x > 0))
    assert modelpar.device.device_counters()["graph_breaks"] == before + 1
    assert any("aten::masked_select" in str(w.message) for w in caught)


def test_strict_mode_raises_naming_the_op() -> None:
    modelpar.device.set_device_options(strict=True)
    try:
        with pytest.raises(RuntimeError, match=r"aten::nonzero.*strict"):
            torch.nonzero(torch.randn(3).to("modelpar"))
    finally:
        modelpar.device.set_device_options(strict=False)


def test_mixing_devices_names_op_and_devices() -> None:
    with pytest.raises(RuntimeError, match=r"aten::add\.Tensor.*modelpar:0 and cpu"):
        torch.randn(2, 2).to("modelpar") + torch.randn(2, 2)


def test_state_dict_saves_and_loads(tmp_path) -> None:
    model = torch.nn.Linear(3, 2)
    want = {k: v.clone() for k, v in model.state_dict().items()}
    model.to("modelpar")
    with torch.no_grad():
        model.weight.mul_(2.0)  # pending in a trace when saved
    torch.save(model.state_dict(), tmp_path / "m.pt")
    got = torch.load(tmp_path / "m.pt", map_location="cpu")
    torch.testing.assert_close(got["weight"], want["weight"] * 2)
    torch.testing.assert_close(got["bias"], want["bias"])


def test_cmake_prefix_path_has_the_package_config() -> None:
    config = os.path.join(modelpar.device.cmake_prefix_path, "modelpar", "modelparConfig.cmake")
    assert os.path.isfile(config)


def test_device_name_waits_for_enable_where_a_gpu_is_visible() -> None:
    """Where a GPU is visible, importing modelpar leaves PrivateUse1 unnamed so
    that CUDA stays PyTorch's accelerator (Note [Naming the device is not
    free] in backend/device.cpp); modelpar.device.enable() names it, warning
    what that costs. A subprocess that makes torch.cuda.is_available() say
    True stands in for a GPU machine (tests/python/test_cuda.py checks the
    real one), with MODELPAR_NAME_DEVICE_AT_LOAD=0 telling libmodelpar.so
    the same (it names the device when it loads where no GPU is visible)."""
    import subprocess
    import sys
    script = """
import warnings, torch
torch.cuda.is_available = lambda: True
import modelpar
assert torch._C._get_privateuse1_backend_name() == "privateuseone"
assert not modelpar.device.enabled()
try:
    torch.ones(1).to("modelpar")
    raise SystemExit("'modelpar' parsed before enable()")
except RuntimeError:
    pass
with warnings.catch_warnings(record=True) as w:
    warnings.simplefilter("always")
    modelpar.device.enable()
    modelpar.device.enable()
assert len(w) == 1 and "backward of CUDA tensors" in str(w[0].message), [str(x.message) for x in w]
assert torch._C._get_privateuse1_backend_name() == "modelpar"
assert torch.accelerator.current_accelerator().type == "modelpar"
x = torch.ones(3).to("modelpar") * 2
assert x.to("cpu").tolist() == [2.0, 2.0, 2.0]
print("ok")
"""
    r = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=120,
                       env={**os.environ, "PYTHONPATH": os.pathsep.join(sys.path),
                            "MODELPAR_NAME_DEVICE_AT_LOAD": "0"})
    assert r.returncode == 0 and r.stdout.strip().endswith("ok"), r.stdout + r.stderr


def test_eager_activation_checkpointing_still_works_with_the_device_named() -> None:
    # Named, the modelpar device is PyTorch's accelerator on a machine without
    # a GPU; torch.utils.checkpoint's recompute then enters autocast for it,
    # which asks torch.modelpar for get_amp_supported_dtype.
    if not modelpar.device.enabled():
        pytest.skip("the device is not named in this process (a GPU is visible)")
    torch.manual_seed(0)
    block = torch.nn.Sequential(torch.nn.Linear(8, 8), torch.nn.GELU(), torch.nn.Linear(8, 8))
    x = torch.randn(4, 8)
    want = torch.autograd.grad(block(x).square().sum(), list(block.parameters()))
    out = torch.utils.checkpoint.checkpoint(block, x, use_reentrant=False)
    got = torch.autograd.grad(out.square().sum(), list(block.parameters()))
    for g, w in zip(got, want):
        torch.testing.assert_close(g, w, rtol=0, atol=0)  # the same ops, recomputed
