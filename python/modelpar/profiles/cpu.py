"""The machine profile of this computer's CPU worker devices, for planning.

Plans for CPU worker devices (``device_map`` unset or ``"cpu"``) are costed
with a profile of the CPU they run on instead of passes' default device
(a GPU-like 14 TFLOP/s, which makes every op look 100x cheaper than it is on
a CPU core and hides the per-op host overhead that decides CPU plans).

The profile is calibrated on first use and cached on disk: a short
micro-benchmark (about a second) at the workers' intra-op thread count,
profiles/calibration.py's measurements at CPU sizes (``mm`` of 64..512
squares, ``add`` of 1 K..4 M floats, ``clone`` of 4 KiB..16 MiB) plus the
executor's per-op overhead, hand-off between two workers (of which the
send span, handing the value to the copy thread and waking the receiver, is
charged to the sender), the fixed cost of a step and of each extra worker.

A progress bar on stderr shows the calibration. The profile is JSON
(passes/cost/README.md) at ``<cache>/cpu-<cpu model>-t<threads>.json``,
``<cache>`` being ``$XDG_CACHE_HOME/modelpar`` or ``~/.cache/modelpar``
(``-v5`` in the name: the profile's version, so that a profile without a
term the simulator now uses, measured on an executor that has changed
how it hands values over, or measured wrongly, is calibrated again).
``MODELPAR_CPU_PROFILE`` overrides: ``off`` plans with passes' default
device (the test suite sets it, so plans do not depend on the CPU that runs
the tests); a path uses that profile file.

Example::

    from modelpar.profiles.cpu import cpu_profile_path
    path = cpu_profile_path(threads=1)        # calibrates once, then cached
    modelpar.plan_graph(g, devices=2, machine=path)
"""

from __future__ import annotations

import collections
import hashlib
import json
import os
import platform
import re
from dataclasses import replace
from pathlib import Path
from typing import Any

from ..errors import ConfigError
from .cache import cache_dir, write_profile
from .calibration import Target, calibrate, profile_from_env

__all__ = ["cpu_profile_path", "calibrate_cpu", "cpu_model_name", "machine_for",
           "machine_for_options", "measures_nodes", "sharing", "per_logical_device"]

_ENV = "MODELPAR_CPU_PROFILE"
_VERSION = 5  # 2: send_overhead_us, worker_overhead_us; 3: waits spin first (hand-off);
#                4: a sender copies a small value itself; 5: profiles calibrated inside a
#                compiler timed fake tensors (Note [Calibrated on real tensors])


def cpu_model_name() -> str:
    """The CPU's model name (``/proc/cpuinfo``), else ``platform.processor()``."""
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.lower().startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine() or "cpu"


def _cache_file(threads: int) -> Path:
    slug = re.sub(r"[^A-Za-z0-9]+", "-", cpu_model_name()).strip("-").lower() or "cpu"
    return cache_dir() / f"cpu-{slug}-t{threads}-v{_VERSION}.json"


def cpu_profile_path(threads: int = 1, *, progress: bool = True) -> str | None:
    """The path of the CPU profile for workers with ``threads`` intra-op
    threads: ``$MODELPAR_CPU_PROFILE`` if it names a file, None if it is
    ``off``, else the cached profile, calibrated first if there is none.

    Raises:
        ConfigError: ``$MODELPAR_CPU_PROFILE`` names no file, or ``threads`` < 1.
    """
    if isinstance(threads, bool) or not isinstance(threads, int) or threads < 1:
        raise ConfigError(f"modelpar cpu profile: threads={threads!r} is not valid; threads takes "
                          "an int >= 1")
    given, named = profile_from_env(_ENV, "cpu", "CPU")
    if given:
        return named
    path = _cache_file(threads)
    if path.is_file():
        return str(path)
    write_profile(path, calibrate_cpu(threads, progress=progress))
    return str(path)


def calibrate_cpu(threads: int = 1, *, progress: bool = True,
                  memory_bytes: int | None = None) -> str:
    """Measures this CPU (see the module docstring and profiles/calibration.py)
    and returns the profile's JSON text: one device, replicated by the
    planners to as many CPU workers as they plan for. ``memory_bytes``: the
    device's capacity (default: the machine's physical memory; the
    ``memory`` option overrides it per plan).
    """
    if memory_bytes is None:
        try:
            memory_bytes = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
        except (ValueError, OSError, AttributeError):
            memory_bytes = 16 << 30
    target = Target.cpu(threads)
    target = replace(target, extra={"cpu": cpu_model_name(), **target.extra})
    return calibrate(target, memory_bytes, progress=progress)


def machine_for(device_map: str, threads: int = 1) -> str | None:
    """The machine profile a plan for the executor's ``device_map`` is costed
    on: the CPU profile for ``"cpu-workers"``, the GPU's for a CUDA map
    (profiles/cuda.py); None (passes' default device) where the profile is
    turned ``off``."""
    if device_map == "cpu-workers":
        return cpu_profile_path(threads)
    from .cuda import cuda_profile_path
    return cuda_profile_path(device_map)


def sharing(device_map: str, devices: int) -> int:
    """Note [Memory shared by logical devices]: how many logical devices share
    one physical device's memory under ``device_map``: every CPU worker the
    host's (``"cpu-workers"``), every logical device one GPU's for a map of
    one GPU (Note [Logical devices share their GPU] in profiles/cuda.py), and
    for a list the most entries naming the same GPU."""
    if device_map == "cpu-workers" or "," not in device_map:
        return max(int(devices), 1)
    counts = collections.Counter(entry.strip() for entry in device_map.split(","))
    return max(counts.values())


# Note [Memory shared by logical devices]: a machine profile describes one
# physical device (the CPU with the host's memory, a GPU with its own), which
# the planners replicate to as many logical devices as they plan for. Logical
# devices on one physical device share its memory, so each is planned with
# its share: the profile is rewritten with memory_bytes divided by the
# number that share it (a variant file beside it). Planned with the whole
# memory each, N CPU workers could be given N times the host's memory and a
# plan that cannot run was accepted. The ``memory`` option still sets each
# logical device's capacity as given.
def per_logical_device(path: str | None, parts: int) -> str | None:
    """The profile at ``path`` with each device's memory divided by
    ``parts`` (Note [Memory shared by logical devices]); ``path`` itself for
    one part or no profile."""
    if path is None or parts <= 1:
        return path
    base = Path(path)
    profile = json.loads(base.read_text())
    for device in profile.get("devices", []):
        device["memory_bytes"] = max(int(device["memory_bytes"]) // parts, 1)
    text = json.dumps(profile, indent=2)
    variant = cache_dir() / f"{base.stem}-per{parts}-{hashlib.sha256(text.encode()).hexdigest()[:12]}.json"
    if not variant.is_file():
        write_profile(variant, text)
    return str(variant)


def machine_for_options(opts: Any) -> str | None:
    """``machine_for`` the options' executor device map, costed at the
    threads a worker gets (Note [Every core used] in runtime/executor.py)
    and each logical device with its share of the physical device's memory
    (Note [Memory shared by logical devices]); over a process group rank
    0's profile, the same on every rank (Note [Measured once, planned
    everywhere] in distributed/first_rank.py), each rank a device of its
    own."""
    # Over ranks each process has its own threads and runs one device.
    threads = 1 if opts.world else worker_threads(opts.devices)
    if not opts.world:
        return per_logical_device(machine_for(opts.executor_device_map, threads),
                                  sharing(opts.executor_device_map, opts.devices))
    from ..distributed.first_rank import machine_on_ranks, measure_wait_s
    return machine_on_ranks(lambda: machine_for(opts.executor_device_map, threads),
                            opts.process_group, measure_wait_s(opts.peer_timeout))


def worker_threads(devices: int) -> int:
    """Intra-op threads each of ``devices`` CPU workers gets: the process's
    threads shared among them, at least one (Note [Every core used])."""
    import torch
    return max(1, torch.get_num_threads() // max(1, devices))


def measures_nodes(device_map: str) -> bool:
    """Whether plans for ``device_map`` also time the graph's nodes on this
    machine (strategy="auto": Note [The searched step] in
    compile/step_search.py): with the calibrated CPU profile, i.e. CPU workers
    and ``$MODELPAR_CPU_PROFILE`` unset. A profile named by the variable is
    taken as given (its costs are what the user wants planned with), and
    ``off`` plans with passes' default device."""
    return device_map == "cpu-workers" and not os.environ.get(_ENV, "").strip()
