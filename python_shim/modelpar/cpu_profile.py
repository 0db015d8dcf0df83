"""The machine profile of this computer's CPU worker devices, for planning.

Plans for CPU worker devices (``device_map`` unset or ``"cpu"``) are costed
with a profile of the CPU they run on instead of passes' default device
(a GPU-like 14 TFLOP/s, which makes every op look 100x cheaper than it is on
a CPU core and hides the per-op host overhead that decides CPU plans).

The profile is calibrated on first use and cached on disk: a short
micro-benchmark (about a second) at the workers' intra-op thread count:

* matmul throughput (``mm`` of 64..512 squares) and memory bandwidth
  (``add`` of 1 K..4 M floats), fitted by passes/cost/calibrate.h's least
  squares (time = bytes / bandwidth + flops / peak + overhead);
* the per-op host overhead of the executor: a chain of 256 one-element
  ops on one CPU worker, minus a chain of 1, per op. This replaces the
  fitted intercept, which eager Python calls inflate;
* transfers: ``clone`` of 4 KiB..16 MiB (bandwidth) plus the executor's
  measured hand-off between two workers (a send of 4 bytes from one to the
  other, minus the same chain on one worker); of the hand-off, what the
  send instruction itself costs the sending worker (its traced span in a
  chain that alternates between two workers: handing the value to the copy
  thread, waking the receiver) is the send overhead, which the simulator
  charges the sender's compute, and the rest the link latency;
* the fixed cost of a step (a one-op step minus its op: waking the worker,
  collecting the outputs), which the simulator adds to every step, and
  what each worker beyond the first adds to it (the same step on two
  workers, the second idle, minus on one).

A progress bar on stderr shows the calibration. The profile is JSON
(passes/cost/README.md) at ``<cache>/cpu-<cpu model>-t<threads>.json``,
``<cache>`` being ``$XDG_CACHE_HOME/modelpar`` or ``~/.cache/modelpar``
(``-v2`` in the name: the profile's version, so that a profile without a
term the simulator now uses is calibrated again).
``MODELPAR_CPU_PROFILE`` overrides: ``off`` plans with passes' default
device (the test suite sets it, so plans do not depend on the CPU that runs
the tests); a path uses that profile file.

Example::

    from modelpar.cpu_profile import cpu_profile_path
    path = cpu_profile_path(threads=1)        # calibrates once, then cached
    modelpar.plan_graph(g, devices=2, machine=path)
"""

from __future__ import annotations

import json
import os
import platform
import re
import statistics
import sys
import time
from collections.abc import Callable
from pathlib import Path

import torch

from .errors import ConfigError

__all__ = ["cpu_profile_path", "calibrate_cpu", "cache_dir", "cpu_model_name", "machine_for",
           "measures_nodes"]

_ENV = "MODELPAR_CPU_PROFILE"
_VERSION = 2  # 2: send_overhead_us, worker_overhead_us


def cpu_model_name() -> str:
    """The CPU's model name (``/proc/cpuinfo``), else ``platform.processor()``."""
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.lower().startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine() or "cpu"


def cache_dir() -> Path:
    """``$XDG_CACHE_HOME/modelpar``, else ``~/.cache/modelpar``."""
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return Path(base) / "modelpar"


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
    env = os.environ.get(_ENV, "").strip()
    if env.lower() == "off":
        return None
    if env:
        if not os.path.isfile(env):
            raise ConfigError(f"modelpar cpu profile: {_ENV}={env!r} is not a file; give a machine "
                              "profile JSON (passes/cost/README.md), 'off', or unset it to "
                              "calibrate this CPU")
        return env
    path = _cache_file(threads)
    if path.is_file():
        return str(path)
    text = calibrate_cpu(threads, progress=progress)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(f".{os.getpid()}.tmp")
    tmp.write_text(text)
    os.replace(tmp, path)  # atomic: a concurrent reader sees all or nothing
    return str(path)


class _Progress:
    """A one-line progress bar on stderr."""

    def __init__(self, total: int, enabled: bool, title: str) -> None:
        self.total, self.done, self.enabled, self.title = total, 0, enabled, title

    def step(self, what: str) -> None:
        self.done += 1
        if not self.enabled:
            return
        width = 24
        filled = width * self.done // self.total
        sys.stderr.write(f"\r{self.title} [{'#' * filled}{'.' * (width - filled)}] "
                         f"{self.done}/{self.total} {what:<24}")
        if self.done == self.total:
            sys.stderr.write("\n")
        sys.stderr.flush()


def _median_us(fn: Callable[[], object], reps: int) -> float:
    fn()
    times = []
    for _ in range(reps):
        t0 = time.perf_counter_ns()
        fn()
        times.append(time.perf_counter_ns() - t0)
    return statistics.median(times) / 1e3


def _chain(layers: list[str]) -> str:
    """An IR graph: one-element relu after relu, one per layer name."""
    lines = ["graph @chain(%x: f32[1] input) {"]
    prev = "%x"
    for i, layer in enumerate(layers):
        lines.append(f'  %v{i}: f32[1] = aten::relu({prev}) {{layer="{layer}", phase=fwd}}')
        prev = f"%v{i}"
    lines += [f"  return {prev}", "}"]
    return "\n".join(lines)


def _executor_us(text: str, devices: int, pinned: dict[str, int] | None, threads: int,
                 reps: int) -> float:
    from .executor import Executor
    from .ir import parse_graph
    from .planning import plan_graph
    plan = plan_graph(parse_graph(text), devices=devices, dump_dir="", coarsen=False,
                      pinned_layers=pinned)
    ex = Executor(plan.program, device_map="cpu-workers", threads_per_device=threads)
    x = torch.randn(1)
    for _ in range(5):
        ex.run([x])
    # The fastest run: the executor's costs are differences of these, and
    # other load on the machine only ever adds to a run (a median taken
    # while other processes ran put the worker overhead at 27 us, the
    # fastest at 6 us, as the measured steps of plans that differ by one
    # idle worker show).
    times = []
    for _ in range(reps):
        t0 = time.perf_counter_ns()
        ex.run([x])
        times.append(time.perf_counter_ns() - t0)
    return min(times) / 1e3


def _send_us(threads: int, k: int = 32, reps: int = 30) -> float:
    """The median traced span of a send instruction in a chain of ``k``
    one-element ops alternating between two workers."""
    from .executor import Executor
    from .ir import parse_graph
    from .planning import plan_graph
    names = [f"l{i}" for i in range(k)]
    plan = plan_graph(parse_graph(_chain(names)), devices=2, dump_dir="", coarsen=False,
                      pinned_layers={n: i % 2 for i, n in enumerate(names)})
    sends: list[list[int]] = [[], []]  # per device, the indices of its sends
    device, index = -1, 0
    for line in str(plan.program).splitlines():
        m = re.match(r"\s*device (\d+)", line)
        if m:
            device, index = int(m.group(1)), 0
        elif device >= 0 and line.strip() and line.strip() != "}":
            if line.strip().startswith("send "):
                sends[device].append(index)
            index += 1
    ex = Executor(plan.program, device_map="cpu-workers", threads_per_device=threads,
                  record_trace=True)
    x = torch.randn(1)
    for _ in range(5):
        ex.run([x])
    spans = []
    for _ in range(reps):
        ex.run([x])
        host = ex.last_trace()["host"]
        for d, idx in enumerate(sends):
            for i in idx:
                s = host[d][i]
                if s is not None:
                    spans.append((s[1] - s[0]) / 1e3)
    return statistics.median(spans) if spans else 0.0


def calibrate_cpu(threads: int = 1, *, progress: bool = True,
                  memory_bytes: int | None = None) -> str:
    """Measures this CPU (see the module docstring) and returns the profile's
    JSON text: one device, replicated by the planners to as many CPU workers
    as they plan for. ``memory_bytes``: the device's capacity (default: the
    machine's physical memory; the ``memory`` option overrides it per plan).
    """
    from . import _C
    if memory_bytes is None:
        try:
            memory_bytes = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
        except (ValueError, OSError, AttributeError):
            memory_bytes = 16 << 30
    mm_sizes = (64, 128, 256, 384, 512)
    add_sizes = (1_000, 10_000, 100_000, 1_000_000, 4_000_000)
    copy_sizes = (4 << 10, 64 << 10, 1 << 20, 4 << 20, 16 << 20)
    bar = _Progress(len(mm_sizes) + len(add_sizes) + len(copy_sizes) + 2, progress,
                    f"modelpar: calibrating this CPU ({threads} thread{'s' * (threads > 1)})")
    saved_threads = torch.get_num_threads()
    torch.set_num_threads(threads)
    try:
        kernels: list[tuple[float, float, float]] = []
        for n in mm_sizes:
            a, b = torch.randn(n, n), torch.randn(n, n)
            kernels.append((3 * 4 * n * n, 2 * n ** 3, _median_us(lambda: torch.mm(a, b), 15)))
            bar.step(f"matmul {n}")
        for numel in add_sizes:
            a, b = torch.randn(numel), torch.randn(numel)
            kernels.append((12 * numel, numel, _median_us(lambda: torch.add(a, b), 15)))
            bar.step(f"add {numel}")
        transfers: list[tuple[float, float]] = []
        for nbytes in copy_sizes:
            t = torch.randn(nbytes // 4)
            transfers.append((nbytes, _median_us(lambda: t.clone(), 15)))
            bar.step(f"copy {nbytes >> 10} KiB")
    finally:
        torch.set_num_threads(saved_threads)
    # Per-op host overhead on a worker: 256 ops minus 1 op, per op.
    k = 256
    long_us = _executor_us(_chain(["a"] * k), 1, None, threads, 30)
    short_us = _executor_us(_chain(["a"]), 1, None, threads, 60)
    per_op_us = max((long_us - short_us) / (k - 1), 0.05)
    bar.step("per-op overhead")
    # Hand-off: a 4-byte send from worker 0 to worker 1, minus one worker.
    two = _chain(["a", "b"])
    handoff_us = max(_executor_us(two, 2, {"a": 0, "b": 1}, threads, 60)
                     - _executor_us(two, 1, None, threads, 60), 0.0)
    send_us = min(_send_us(threads), handoff_us)
    bar.step("hand-off")
    text = _C.calibrated_machine(kernels, transfers, int(memory_bytes), "cpu",
                                 handoff_us - send_us)
    profile = json.loads(text)
    profile["devices"][0]["launch_overhead_us"] = per_op_us
    profile["send_overhead_us"] = send_us
    # What a one-op step costs beyond its op: waking the worker, collecting
    # the outputs (DeviceModel::stepOverheadUs; simulate adds it per step).
    step_us = max(short_us - per_op_us, 0.0)
    profile["step_overhead_us"] = step_us
    worker_us = max(_executor_us(_chain(["a"]), 2, {"a": 0}, threads, 60) - short_us, 0.0)
    profile["worker_overhead_us"] = worker_us
    profile["calibration"] = {"cpu": cpu_model_name(), "threads": threads,
                              "torch": torch.__version__, "per_op_us": per_op_us,
                              "handoff_us": handoff_us, "send_overhead_us": send_us,
                              "step_overhead_us": step_us, "worker_overhead_us": worker_us,
                              "date": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())}
    return json.dumps(profile, indent=2)


def machine_for(device_map: str, threads: int = 1) -> str | None:
    """The machine profile a plan for the executor's ``device_map`` is costed
    on: the CPU profile for ``"cpu-workers"`` (None when
    ``$MODELPAR_CPU_PROFILE`` is ``off``), None (passes' default device) for
    CUDA maps, which have no calibration yet."""
    return cpu_profile_path(threads) if device_map == "cpu-workers" else None


def measures_nodes(device_map: str) -> bool:
    """Whether plans for ``device_map`` also time the graph's nodes on this
    machine (strategy="auto": Note [The searched step] in
    step_search.py): with the calibrated CPU profile, i.e. CPU workers
    and ``$MODELPAR_CPU_PROFILE`` unset. A profile named by the variable is
    taken as given (its costs are what the user wants planned with), and
    ``off`` plans with passes' default device."""
    return device_map == "cpu-workers" and not os.environ.get(_ENV, "").strip()
