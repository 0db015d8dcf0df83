"""The GPU machine profile (modelpar/profiles/cuda.py) without a GPU: device
maps, the cache, MODELPAR_CUDA_PROFILE, and the sharing variant of a map
whose logical devices share a GPU (Note [Logical devices share their GPU]).
The calibration's measurements are device_calibration.py's, which
test_cpu_profile.py runs on the CPU; on a GPU, test_cuda.py calibrates the
real one."""

from __future__ import annotations

import json

import pytest
import torch

import modelpar
from modelpar.profiles import cpu as cpu_profile, cuda as cuda_profile
from modelpar.errors import ConfigError


@pytest.fixture
def gpus(tmp_path, monkeypatch):
    """Two fake visible GPUs; calibrate_cuda returns a fixed profile and
    counts its calls."""
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    monkeypatch.delenv("MODELPAR_CUDA_PROFILE", raising=False)
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 2)
    monkeypatch.setattr(torch.cuda, "current_device", lambda: 1)
    monkeypatch.setattr(torch.cuda, "get_device_name", lambda i=None: "NVIDIA H100 80GB HBM3")
    calls = []
    base = {"devices": [{"name": "cuda", "memory_bytes": 80 << 30, "peak_flops": 5e13,
                         "memory_bandwidth_bytes_per_s": 3e12, "launch_overhead_us": 6.0}],
            "default_link": {"latency_us": 8.0, "bandwidth_bytes_per_s": 1e12}}

    def fake(index: int = 0, *, progress: bool = True) -> str:
        calls.append(index)
        return json.dumps(base)

    monkeypatch.setattr(cuda_profile, "calibrate_cuda", fake)
    return tmp_path / "modelpar", calls


def test_device_maps_name_gpus() -> None:
    assert cuda_profile.gpus_of("cuda:0") == [0]
    assert cuda_profile.gpus_of("cuda:0,cuda:1, cuda:1") == [0, 1, 1]
    with pytest.raises(ConfigError, match="'cpu' in device_map='cuda:0,cpu' is not a CUDA device"):
        cuda_profile.gpus_of("cuda:0,cpu")


def test_calibrates_once_per_gpu_model_and_marks_shared_gpus(gpus) -> None:
    cache, calls = gpus
    own = cuda_profile.cuda_profile_path("cuda:0,cuda:1")  # a GPU per logical device
    assert own == str(cache / "cuda-nvidia-h100-80gb-hbm3-v2.json") and calls == [0]
    assert "host_cores" not in json.loads(open(own).read())
    # Every logical device on one GPU: they share 1 (Note [Logical devices share their GPU]).
    one = cuda_profile.cuda_profile_path("cuda:0")
    assert one.endswith("-v2-share1.json") and json.loads(open(one).read())["host_cores"] == 1
    # Four logical devices on two GPUs: 2.
    two = cuda_profile.cuda_profile_path("cuda:0,cuda:0,cuda:1,cuda:1")
    assert json.loads(open(two).read())["host_cores"] == 2
    assert cuda_profile.cuda_profile_path("cuda") == one  # the current device, shared
    assert calls == [0]  # cached: calibrated once
    # The planners read it: the simulated step of devices sharing a GPU is
    # at least their compute over one GPU.
    assert cpu_profile.machine_for("cuda:0") == one
    g = modelpar.ir.load_graph(__file__.replace("tests/python/test_cuda_profile.py",
                                             "examples/ir/mlp_step.txt"))
    p = modelpar.plan_graph(g, devices=2, machine=one, dump_dir="")
    assert json.loads(p.machine_json)["host_cores"] == 1


def test_env_turns_it_off_or_names_a_profile(gpus, monkeypatch, tmp_path) -> None:
    _cache, calls = gpus
    monkeypatch.setenv("MODELPAR_CUDA_PROFILE", "off")
    assert cuda_profile.cuda_profile_path("cuda:0") is None
    given = tmp_path / "given.json"
    given.write_text("{}")
    monkeypatch.setenv("MODELPAR_CUDA_PROFILE", str(given))
    assert cuda_profile.cuda_profile_path("cuda:0") == str(given)
    monkeypatch.setenv("MODELPAR_CUDA_PROFILE", str(tmp_path / "missing.json"))
    with pytest.raises(ConfigError, match="MODELPAR_CUDA_PROFILE=.*missing.json.* is not a file"):
        cuda_profile.cuda_profile_path("cuda:0")
    assert calls == []


def test_a_gpu_this_process_does_not_see_is_a_config_error(gpus) -> None:
    with pytest.raises(ConfigError, match="names a GPU this process does not see \\(2 visible\\)"):
        cuda_profile.cuda_profile_path("cuda:0,cuda:5")


@pytest.mark.skipif(torch.cuda.is_available(), reason="the no-GPU case")
def test_calibrating_without_a_gpu_is_a_config_error() -> None:
    with pytest.raises(ConfigError, match="no GPU cuda:0 to calibrate"):
        cuda_profile.calibrate_cuda(0, progress=False)
