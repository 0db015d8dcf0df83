"""The machine profile of this computer's GPUs, for planning (issue 17:
"CUDA devices get theirs").

Plans for a CUDA ``device_map`` were costed on passes' default device, a
guess. They are now costed on a profile of the GPU they run on, calibrated
on first use and cached on disk like the CPU's (profiles/cpu.py), with the
same measurements (profiles/calibration.py) at GPU sizes: ``mm`` of
256..4096 squares, ``add`` of 10 K..64 M floats, copies of 64 KiB..256 MiB
(to the next GPU when there is one, else within the GPU), the executor's
per-op launch cost, hand-off between two logical devices, send span and
step overhead, every timing waited for with ``torch.cuda.synchronize``.
A progress bar on stderr shows it (a few seconds).

Note [Logical devices share their GPU]: several logical devices on one GPU
(``device_map="cuda:0"``) get a stream set each, but one GPU's SMs: two
large kernels on two streams take about as long as one after the other.
That is the CPU workers' situation with fewer cores than workers (Note
[Shared host cores] in passes/lower/simulate.cpp), so the profile a map
plans with says how many GPUs its logical devices share (``host_cores``:
the number of distinct GPUs in the map when some GPU hosts several logical
devices, else 0, every device its own): the simulator then makes a step
take at least all devices' compute over that many GPUs.

The profile is JSON (passes/cost/README.md) at
``<cache>/cuda-<gpu name>-v2.json`` (``<cache>`` as for the CPU), the
sharing variant beside it (``...-v2-share<k>.json``).
``MODELPAR_CUDA_PROFILE`` overrides: ``off`` plans with passes' default
device (the test suite sets it), a path uses that profile file.

Example::

    from .cuda import cuda_profile_path
    path = cuda_profile_path("cuda:0")   # calibrates once, then cached
    modelpar.plan_graph(g, devices=2, machine=path)
"""

from __future__ import annotations

import json
import re
from pathlib import Path

import torch

from .cache import cache_dir, write_profile
from .calibration import Target, calibrate, profile_from_env
from ..errors import ConfigError

__all__ = ["cuda_profile_path", "calibrate_cuda", "gpus_of"]

_ENV = "MODELPAR_CUDA_PROFILE"
_VERSION = 2  # 2: profiles calibrated inside a compiler timed fake tensors
#                (Note [Calibrated on real tensors])


def gpus_of(device_map: str) -> list[int]:
    """The GPU index of each entry of a CUDA device map (``"cuda"`` is the
    current device).

    Raises:
        ConfigError: an entry is not ``cuda`` or ``cuda:K``.
    """
    out = []
    for entry in device_map.split(","):
        m = re.fullmatch(r"\s*cuda(?::(\d+))?\s*", entry)
        if m is None:
            raise ConfigError(f"modelpar cuda profile: {entry!r} in device_map={device_map!r} is "
                              "not a CUDA device; a CUDA device map lists cuda or cuda:K")
        out.append(int(m.group(1)) if m.group(1) is not None else torch.cuda.current_device())
    return out


def _cache_file(index: int) -> Path:
    name = torch.cuda.get_device_name(index)
    slug = re.sub(r"[^A-Za-z0-9]+", "-", name).strip("-").lower() or "gpu"
    return cache_dir() / f"cuda-{slug}-v{_VERSION}.json"


def calibrate_cuda(index: int = 0, *, progress: bool = True) -> str:
    """Measures GPU ``index`` (module docstring) and returns the profile's
    JSON text: one device of the GPU's memory.

    Raises:
        ConfigError: no such GPU.
    """
    if not torch.cuda.is_available() or not 0 <= index < torch.cuda.device_count():
        raise ConfigError(f"modelpar cuda profile: no GPU cuda:{index} to calibrate "
                          f"({torch.cuda.device_count()} visible)")
    memory = torch.cuda.get_device_properties(index).total_memory
    return calibrate(Target.cuda(index), memory, progress=progress)


def _shared(device_map: str, gpus: list[int]) -> int:
    """Note [Logical devices share their GPU]: how many GPUs the map's
    logical devices share, 0 when each has its own."""
    single = "," not in device_map  # every logical device on that one GPU
    if single or len(set(gpus)) < len(gpus):
        return len(set(gpus))
    return 0


def cuda_profile_path(device_map: str, *, progress: bool = True) -> str | None:
    """The path of the profile a plan for the CUDA ``device_map`` is costed
    on: ``$MODELPAR_CUDA_PROFILE`` if it names a file, None if it is
    ``off``, else the cached profile of the map's first GPU (calibrated
    first if there is none) with the map's sharing (Note [Logical devices
    share their GPU]).

    Raises:
        ConfigError: ``$MODELPAR_CUDA_PROFILE`` names no file; the map names
            no visible GPU.
    """
    given, named = profile_from_env(_ENV, "cuda", "GPU")
    if given:
        return named
    gpus = gpus_of(device_map)
    if not torch.cuda.is_available() or max(gpus) >= torch.cuda.device_count():
        raise ConfigError(f"modelpar cuda profile: device_map={device_map!r} names a GPU this "
                          f"process does not see ({torch.cuda.device_count()} visible)")
    base = _cache_file(gpus[0])
    if not base.is_file():
        write_profile(base, calibrate_cuda(gpus[0], progress=progress))
    share = _shared(device_map, gpus)
    if share == 0:
        return str(base)
    variant = base.with_name(f"{base.stem}-share{share}.json")
    if not variant.is_file() or variant.stat().st_mtime < base.stat().st_mtime:
        profile = json.loads(base.read_text())
        profile["host_cores"] = share
        write_profile(variant, json.dumps(profile, indent=2))
    return str(variant)

