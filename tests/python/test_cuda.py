"""modelpar on a GPU (issue 14): one cuda:0 hosting 2 and 4 logical devices
(one stream set each), torch.compile training with m-ETF placement and with
a 1F1B pipeline, stream replay and CUDA Graph replay, against eager PyTorch
on the same GPU.

Every test here needs a CUDA build of modelpar on a machine with a GPU and
skips otherwise (CI has none: scripts/gpu_check.sh runs this file on a lent
GPU). TF32 is turned off in both runs, so the comparison is fp32 against
fp32 and only the order of sums differs: placement and micro-batching
split reductions differently, and cuBLAS / cuDNN pick their algorithms per
shape (tests/python/tolerances.py gives the bound per model)."""

from __future__ import annotations

import copy
import re

import pytest
import torch

import modelpar
from modelpar import _C
from models import CASES
from tolerances import Compiled, Reordered
from zoo import ZOO  # the models import transformers when built

pytestmark = pytest.mark.skipif(
    not (torch.cuda.is_available() and _C.cuda_devices_built()),
    reason="needs a GPU and a CUDA build of modelpar (scripts/gpu_check.sh)")

# The models whose whole training step is placed on the GPU; the U-Net's
# 13-conv path and the looped net's loop add nothing CUDA-specific beyond the
# CNN's convolutions and batch norm.
PLACED = ["mlp", "cnn", "gpt", "inception"]


@pytest.fixture(autouse=True)
def _fp32_on_gpu() -> None:
    torch._dynamo.reset()
    modelpar.clear_plans()
    torch.manual_seed(0)
    keep = (torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32)
    torch.backends.cuda.matmul.allow_tf32 = False
    torch.backends.cudnn.allow_tf32 = False
    yield
    torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32 = keep


def _state(m: torch.nn.Module) -> dict[str, torch.Tensor]:
    return {**dict(m.named_parameters()), **dict(m.named_buffers())}


def _train(name: str, options: dict, *, model_device: str = "cuda", steps: int = 3,
           tol: Reordered | None = None) -> modelpar.compile.records.PlanRecord:
    """Outputs, first-step gradients, and parameters and buffers after
    `steps` momentum-SGD steps equal eager on the GPU; returns the plan."""
    case = CASES[name]
    tol = (tol or case.tol).after(steps=steps)
    model = case.make_model().to(model_device)
    eager = copy.deepcopy(model).cuda()
    fast = torch.compile(model, backend="modelpar", options={"strict": True, **options})
    opt = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)
    ref_opt = torch.optim.SGD(eager.parameters(), lr=0.05, momentum=0.9)
    for step in range(steps):
        x, y = case.batch(step, case.batch_size)
        out = fast(x.to(model_device))
        ref = eager(x.cuda())
        assert out.device == torch.device(model_device) or model_device == "cuda" and out.is_cuda, \
            f"output on {out.device}, the caller's tensors are on {model_device}"
        tol.assert_close(out.cuda(), ref)
        case.loss(out, y.to(model_device)).backward()
        case.loss(ref, y.cuda()).backward()
        if step == 0:
            _assert_grads(model, eager, tol)
        opt.step()
        ref_opt.step()
        opt.zero_grad()
        ref_opt.zero_grad()
    sa, sb = _state(model), _state(eager)
    for n in sa:
        tol.assert_close(sa[n].cuda(), sb[n], msg=lambda m, n=n: f"{n}: {m}")
    return modelpar.plans()[-1]


def _assert_grads(model: torch.nn.Module, eager: torch.nn.Module, tol: Reordered) -> None:
    """Every gradient equals eager's and lies on its parameter's device. A
    gradient that is zero in exact arithmetic (a conv bias before batch norm)
    holds only the rounding noise of terms the size of the model's other
    gradients: it is compared at that scale (Reordered.tolerance)."""
    grads = [q.grad for q in eager.parameters() if q.grad is not None]
    model_scale = max(float(g.abs().max()) for g in grads)
    for (n, p), q in zip(model.named_parameters(), eager.parameters()):
        assert (p.grad is None) == (q.grad is None), n
        if p.grad is None:
            continue
        assert p.grad.device == p.device, f"grad of {n} on {p.grad.device}, param on {p.device}"
        own = float(q.grad.abs().max())
        scale = model_scale if own < 1e-3 * model_scale else None
        tol.assert_close(p.grad.cuda(), q.grad, msg=lambda m, n=n: f"grad of {n}: {m}", scale=scale)


@pytest.mark.parametrize("devices", [2, 4])
@pytest.mark.parametrize("name", PLACED)
def test_placed_training_on_logical_devices_of_one_gpu_equals_eager(name: str, devices: int) -> None:
    plan = _train(name, {"devices": devices, "placer": "m-etf", "device_map": "cuda:0"})
    assert f"{devices}" in str(plan)


def test_graph_replay_training_equals_eager_and_captures() -> None:
    plan = _train("mlp", {"devices": 2, "device_map": "cuda:0", "cuda_graphs": True}, steps=4)
    text = str(plan)
    assert re.search(r"graph replay: \d+ CUDA graphs on 2 logical devices", text), text


@pytest.mark.parametrize("cuda_graphs", [False, True])
def test_inductor_kernel_regions_on_logical_devices_of_one_gpu_equal_eager(cuda_graphs: bool) -> None:
    """kernels="inductor" on the GPU: Triton kernels per region (Note [Kernel
    regions]), compiled in the warm-up step and, with graph replay, captured
    in the CUDA graphs of later steps."""
    plan = _train("gpt", {"devices": 2, "device_map": "cuda:0", "kernels": "inductor",
                          "cuda_graphs": cuda_graphs}, steps=4,
                  tol=Compiled(CASES["gpt"].tol.reduction, CASES["gpt"].tol.depth))
    reports = [r for _, r in plan.kernel_regions]
    assert reports and all(r.compiled_artifacts > 0 and not r.failed for r in reports), str(plan)
    if cuda_graphs:
        assert re.search(r"graph replay: \d+ CUDA graphs", str(plan)), str(plan)


def test_cpu_model_with_cuda_device_map_trains_and_returns_to_the_callers_devices() -> None:
    """Parameters and inputs on the CPU, the plan on cuda:0: outputs come back
    on the CPU and each gradient on its parameter's device."""
    _train("mlp", {"devices": 2, "device_map": "cuda:0"}, model_device="cpu")


@pytest.mark.parametrize("name,devices", [("mlp", 2), ("gpt", 2), ("gpt", 4)])  # mlp: 3 layers
def test_1f1b_pipeline_on_logical_devices_of_one_gpu_equals_eager(name: str, devices: int) -> None:
    case = CASES[name]
    tol = Reordered(256, depth=34)
    model = case.make_model().cuda()
    eager = copy.deepcopy(model)

    def step(x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        return case.loss(model(x), y)

    fast = torch.compile(step, backend="modelpar", options={
        "strict": True, "devices": devices, "device_map": "cuda:0",
        "pipeline": {"microbatches": 4, "schedule": "1f1b"}})
    for seed in range(2):
        model.zero_grad()
        eager.zero_grad()
        x, y = case.batch(seed, 8)
        loss = fast(x.cuda(), y.cuda())
        ref = case.loss(eager(x.cuda()), y.cuda())
        tol.assert_close(loss, ref)
        loss.backward()
        ref.backward()
        _assert_grads(model, eager, tol)
    plan = modelpar.plans()[-1]
    assert plan.pipeline.schedule == "1f1b"


def test_importing_modelpar_leaves_cuda_autograd_alone() -> None:
    """The modelpar device name waits for modelpar.device.enable() where a
    GPU is visible (Note [Naming the device is not free]): CUDA stays
    PyTorch's accelerator and a plain CUDA backward works."""
    assert not modelpar.device.enabled()
    assert torch.accelerator.current_accelerator().type == "cuda"
    x = torch.randn(4, 4, device="cuda", requires_grad=True)
    (x * 2).sum().backward()
    torch.testing.assert_close(x.grad, torch.full_like(x, 2.0))


def test_the_gpu_is_calibrated_once_and_plans_use_its_profile(tmp_path, monkeypatch, capsys) -> None:
    # modelpar/profiles/cuda.py on the real GPU: a progress bar, figures of a
    # GPU (not a CPU core, not the default spec's guess), cached, and a
    # compiled plan for logical devices of cuda:0 costed on it, marked as
    # sharing one GPU (Note [Logical devices share their GPU]).
    import json
    from modelpar.profiles import cuda as cuda_profile
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    monkeypatch.delenv("MODELPAR_CUDA_PROFILE", raising=False)
    path = cuda_profile.cuda_profile_path("cuda:0")
    assert "modelpar: calibrating" in capsys.readouterr().err
    prof = json.loads(open(path).read())
    dev = prof["devices"][0]
    print("calibrated:", json.dumps({**dev, **prof["calibration"]}))
    assert prof["host_cores"] == 1
    assert dev["peak_flops"] > 5e12, dev  # fp32 on a data-centre GPU: tens of TFLOP/s
    assert dev["memory_bandwidth_bytes_per_s"] > 3e11, dev  # HBM: TB/s
    assert 0.5 < dev["launch_overhead_us"] < 200, dev
    assert cuda_profile.cuda_profile_path("cuda:0") == path
    assert "calibrating" not in capsys.readouterr().err  # cached
    plan = _train("mlp", {"devices": 2, "placer": "m-etf", "device_map": "cuda:0"})
    assert json.loads(plan.graphs["forward"].placement.machine_json)["host_cores"] == 1


# Real models (tests/python/zoo.py, Hugging Face transformers) on logical
# devices of cuda:0: every model placed by m-ETF and pipelined (GPipe with
# the loss outside, 1F1B with it compiled in), and strategy="auto" searching
# on the GPU's profile for a decoder, an encoder and the CNN; the same
# checks as tests/python/test_model_zoo.py on the CPU (loss per step, every
# first-step gradient, parameters and buffers after three steps).
ZOO_GPU_MODES = ["m-etf", "gpipe-never", "1f1b-except_last"]
ZOO_GPU_AUTO = ["llama", "bert", "resnet"]
ZOO_GPU_CASES = ([(name, mode) for name in ZOO for mode in ZOO_GPU_MODES]
                 + [(name, "auto") for name in ZOO_GPU_AUTO])


@pytest.mark.parametrize("name,mode", ZOO_GPU_CASES)
def test_real_models_train_like_eager_on_logical_devices_of_one_gpu(name: str, mode: str) -> None:
    pytest.importorskip("transformers")
    from test_model_zoo import _run
    _run(name, mode, device="cuda")
