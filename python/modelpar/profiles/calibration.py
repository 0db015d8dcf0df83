"""Measures one kind of device the executor runs on and fits a machine
profile for planning (passes/cost/README.md): the measurements shared by
the CPU profile (profiles/cpu.py: CPU worker devices) and the GPU profile
(profiles/cuda.py: logical devices on CUDA GPUs).

What is measured, on a :class:`Target` (where the tensors of the
micro-benchmarks live, the executor's device map, how to wait for it):

* kernels: ``mm`` of squares and ``add`` of vectors, fitted by
  passes/cost/calibrate.h's least squares (time = bytes / bandwidth +
  flops / peak + overhead);
* the per-op overhead of the executor: a chain of 256 one-element ops on
  one device, minus a chain of 1, per op (it replaces the fitted intercept,
  which eager Python calls inflate);
* transfers: copies of 4 KiB and up (bandwidth; each size's fastest of
  3 rounds, timed again while they do not grow with size: Note [Copies
  timed on a busy machine]) plus the executor's
  hand-off between two devices (a 4-byte send from one to the other, minus
  the same chain on one); of the hand-off, what the send instruction costs
  the sending device's host lane (its traced span) is the send overhead,
  charged to the sender, and the rest the link latency;
* the fixed cost of a step (a one-op step minus its op), and what each
  device beyond the first adds to it.

Executor timings take the fastest of their runs, over 3 rounds that take
them in turn: the costs are differences of these, and other load on the
machine only ever adds to a run.

Example::

    from .calibration import Target, calibrate
    text = calibrate(Target.cpu(threads=1), memory_bytes=8 << 30)
"""

from __future__ import annotations

import functools
import json
import os
import re
import statistics
import sys
import time
import warnings
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, TypeVar

import torch

from ..runtime.tracing_state import outside_tracing

__all__ = ["Target", "Progress", "calibrate", "copy_times", "fastest_in_rounds",
           "measure_and_fit", "median_us", "profile_from_env"]

K = TypeVar("K")


def profile_from_env(var: str, kind: str, device: str) -> tuple[bool, str | None]:
    """Whether ``$var`` decides the machine profile, and which: ``off`` (None:
    passes' default device) or a profile file's path; (False, None) when it is
    unset. ``kind`` and ``device`` name the profile and the device in errors
    ("cpu", "CPU").

    Raises:
        ConfigError: ``$var`` names no file.
    """
    from ..errors import ConfigError
    env = os.environ.get(var, "").strip()
    if env.lower() == "off":
        return True, None
    if env:
        if not os.path.isfile(env):
            raise ConfigError(f"modelpar {kind} profile: {var}={env!r} is not a file; give a "
                              "machine profile JSON (passes/cost/README.md), 'off', or unset it "
                              f"to calibrate this {device}")
        return True, env
    return False, None


def _no_wait() -> None:
    return None


@dataclass(frozen=True)
class Target:
    """What to calibrate: ``tensor_device`` runs the kernel and copy
    micro-benchmarks (``copy_to``: the device copies go to; itself when
    None), ``device_map`` is the Executor's, ``wait`` blocks until the
    device has finished what was issued. ``threads``: the intra-op threads
    the micro-benchmarks run with (CPU), None to leave them."""
    title: str
    tensor_device: torch.device
    device_map: str
    wait: Callable[[], None] = _no_wait
    threads: int | None = None
    copy_to: torch.device | None = None
    mm_sizes: Sequence[int] = (64, 128, 256, 384, 512)
    add_sizes: Sequence[int] = (1_000, 10_000, 100_000, 1_000_000, 4_000_000)
    copy_sizes: Sequence[int] = (4 << 10, 64 << 10, 1 << 20, 4 << 20, 16 << 20)
    extra: dict[str, Any] = field(default_factory=dict)  # into the profile's "calibration"

    @staticmethod
    def cpu(threads: int) -> "Target":
        """CPU worker devices with ``threads`` intra-op threads each."""
        return Target(f"modelpar: calibrating this CPU ({threads} thread{'s' * (threads > 1)})",
                      torch.device("cpu"), "cpu-workers", threads=threads,
                      extra={"threads": threads})

    @staticmethod
    def cuda(index: int) -> "Target":
        """Logical devices on GPU ``index`` (copies to the next GPU, if
        there is one: what a transfer between two GPUs costs)."""
        dev = torch.device("cuda", index)
        peer = torch.device("cuda", index + 1) if torch.cuda.device_count() > index + 1 else None
        name = torch.cuda.get_device_name(dev)
        return Target(f"modelpar: calibrating {name}", dev, f"cuda:{index}",
                      wait=lambda: torch.cuda.synchronize(dev), copy_to=peer,
                      mm_sizes=(256, 512, 1024, 2048, 4096),
                      add_sizes=(10_000, 100_000, 1_000_000, 16_000_000, 64_000_000),
                      copy_sizes=(64 << 10, 1 << 20, 16 << 20, 64 << 20, 256 << 20),
                      extra={"gpu": name, "copies_to": str(peer) if peer else "the same GPU"})


class Progress:
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


def median_us(fn: Callable[[], object], reps: int, wait: Callable[[], None] = _no_wait) -> float:
    """The median time of ``fn()`` (waited for) in microseconds."""
    fn()
    wait()
    times = []
    for _ in range(reps):
        t0 = time.perf_counter_ns()
        fn()
        wait()
        times.append(time.perf_counter_ns() - t0)
    return statistics.median(times) / 1e3


def fastest_in_rounds(timers: Mapping[K, Callable[[], float]], rounds: int = 3) -> dict[K, float]:
    """The smallest of what each timer returns (the fastest of its runs)
    over ``rounds`` rounds that call the timers in turn.

    Note [Timing in rounds]: the costs measured here and at the search
    (the per-op overhead, the hand-off) are differences of two timings,
    so the two must see the same machine. Timed one after the other, a
    slow spell of a VM (tens to hundreds of ms) could cover one and not
    the other (looped's per-op overhead at 4 micro-batches measured 10.5
    us where 2 and 8 measured 4.3 and 4.9; one CPU calibration measured
    1.7 us per op where the ones before and after measured 0.86). Taken in
    turns, every timing is made before, during and after such a spell, and
    each keeps its fastest."""
    best = {k: float("inf") for k in timers}
    for _ in range(rounds):
        for k, timer in timers.items():
            best[k] = min(best[k], timer())
    return best


def chain(layers: list[str]) -> str:
    """An IR graph: one-element relu after relu, one per layer name."""
    lines = ["graph @chain(%x: f32[1] input) {"]
    prev = "%x"
    for i, layer in enumerate(layers):
        lines.append(f'  %v{i}: f32[1] = aten::relu({prev}) {{layer="{layer}", phase=fwd}}')
        prev = f"%v{i}"
    lines += [f"  return {prev}", "}"]
    return "\n".join(lines)


def _executor(target: Target, text: str, devices: int, pinned: dict[str, int] | None,
              record_trace: bool = False) -> Any:
    from ..runtime.executor import Executor
    from ..ir.text import parse_graph
    from ..planning.placement import plan_graph
    plan = plan_graph(parse_graph(text), devices=devices, dump_dir="", coarsen=False,
                      pinned_layers=pinned)
    ex = Executor(plan.program, device_map=target.device_map,
                  threads_per_device=target.threads or 1, record_trace=record_trace)
    return plan, ex


def executor_us(target: Target, text: str, devices: int, pinned: dict[str, int] | None,
                reps: int) -> float:
    """The fastest of ``reps`` steps of ``text`` planned on ``devices``."""
    _plan, ex = _executor(target, text, devices, pinned)
    x = torch.randn(1, device=target.tensor_device)
    for _ in range(5):
        ex.run([x])
    target.wait()
    times = []
    for _ in range(reps):
        t0 = time.perf_counter_ns()
        ex.run([x])
        target.wait()
        times.append(time.perf_counter_ns() - t0)
    return min(times) / 1e3


def send_us(target: Target, k: int = 32, reps: int = 30) -> float:
    """The median traced host span of a send instruction in a chain of
    ``k`` one-element ops alternating between two devices."""
    names = [f"l{i}" for i in range(k)]
    plan, ex = _executor(target, chain(names), 2, {n: i % 2 for i, n in enumerate(names)},
                         record_trace=True)
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
    x = torch.randn(1, device=target.tensor_device)
    for _ in range(5):
        ex.run([x])
    target.wait()
    spans = []
    for _ in range(reps):
        ex.run([x])
        target.wait()
        host = ex.last_trace()["host"]
        for d, idx in enumerate(sends):
            for i in idx:
                s = host[d][i]
                if s is not None:
                    spans.append((s[1] - s[0]) / 1e3)
    return statistics.median(spans) if spans else 0.0


# Note [Copies timed on a busy machine]: a link's bandwidth is the slope of
# copy time over size, fitted to five copy sizes, and the fit fails when the
# times do not grow with size. A median of 15 copies can still land on a
# stretch where the process waited for a core (a build beside it), more
# than the next size takes: so each size is timed in COPY_ROUNDS rounds that
# take the sizes in turn and keeps its fastest round (waiting only ever adds
# time); while the times still fall as sizes grow, the sizes are timed
# again, up to COPY_ATTEMPTS times, and after that a warning says the
# machine was busy and how to go on without calibrating. (The failure the
# demo met on a fresh machine, every copy 140 us whatever its size, was not
# load but fake tensors: Note [Calibrated on real tensors] in
# runtime/tracing_state.py.)
COPY_ROUNDS = 3
COPY_ATTEMPTS = 3


def _grows(times: Sequence[tuple[float, float]]) -> bool:
    return all(b[1] >= a[1] for a, b in zip(times, times[1:]))


def copy_times(target: Target, bar: Progress, *,
               timer: Callable[[Callable[[], object], int, Callable[[], None]], float] | None = None
               ) -> list[tuple[float, float]]:
    """(bytes, microseconds) per copy size of ``target`` (Note [Copies timed
    on a busy machine]); ``timer`` replaces :func:`median_us` (tests)."""
    timer = timer or median_us
    dev, wait = target.tensor_device, target.wait
    to = target.copy_to or dev
    tensors = {n: torch.randn(n // 4, device=dev) for n in target.copy_sizes}

    def one(nbytes: int) -> float:
        t = tensors[nbytes]
        copy = (lambda: t.to(to, copy=True)) if to != dev else (lambda: t.clone())
        return timer(copy, 15, wait)

    times: list[tuple[float, float]] = []
    for _ in range(COPY_ATTEMPTS):
        best = fastest_in_rounds({n: functools.partial(one, n) for n in target.copy_sizes},
                                 rounds=COPY_ROUNDS)
        times = [(float(n), best[n]) for n in target.copy_sizes]
        if _grows(times):
            break
    for n in target.copy_sizes:
        bar.step(f"copy {n >> 10} KiB")
    if not _grows(times):
        shown = ", ".join(f"{int(n) >> 10} KiB {us:.1f} us" for n, us in times)
        warnings.warn(f"modelpar calibrate: copy times did not grow with size in {COPY_ATTEMPTS} "
                      f"tries ({shown}): the machine is busy; the profile fits them as they are "
                      "(set MODELPAR_CPU_PROFILE to a profile made on a quiet machine, or "
                      "calibrate again later)", RuntimeWarning, stacklevel=3)
    return times


def calibrate(target: Target, memory_bytes: int, *, progress: bool = True) -> str:
    """Measures ``target`` (see the module docstring) and returns the
    profile's JSON text: one device, which the planners replicate to as
    many devices as they plan for; ``memory_bytes`` is its capacity. Runs
    on real tensors when called from inside a compiler (Note [Calibrated on
    real tensors] in runtime/tracing_state.py)."""
    with outside_tracing():
        return measure_and_fit(target, memory_bytes, progress)


def measure_and_fit(target: Target, memory_bytes: int, progress: bool) -> str:
    """:func:`calibrate`'s work, where the caller has lifted any tracing."""
    from .. import _C
    bar = Progress(len(target.mm_sizes) + len(target.add_sizes) + len(target.copy_sizes) + 2,
                   progress, target.title)
    dev, wait = target.tensor_device, target.wait
    saved_threads = torch.get_num_threads()
    if target.threads is not None:
        torch.set_num_threads(target.threads)
    try:
        kernels: list[tuple[float, float, float]] = []
        for n in target.mm_sizes:
            a, b = torch.randn(n, n, device=dev), torch.randn(n, n, device=dev)
            kernels.append((3 * 4 * n * n, 2 * n ** 3, median_us(lambda: torch.mm(a, b), 15, wait)))
            bar.step(f"matmul {n}")
        for numel in target.add_sizes:
            a, b = torch.randn(numel, device=dev), torch.randn(numel, device=dev)
            kernels.append((12 * numel, numel, median_us(lambda: torch.add(a, b), 15, wait)))
            bar.step(f"add {numel}")
        transfers = copy_times(target, bar)
    finally:
        torch.set_num_threads(saved_threads)
    # The executor's costs are differences of these steps (Note [Timing in
    # rounds]).
    k = 256
    two = chain(["a", "b"])
    steps = {"long": (chain(["a"] * k), 1, None, 30), "short": (chain(["a"]), 1, None, 60),
             "two": (two, 2, {"a": 0, "b": 1}, 60), "two_on_one": (two, 1, None, 60),
             "second_worker": (chain(["a"]), 2, {"a": 0}, 60)}
    best = fastest_in_rounds({name: functools.partial(executor_us, target, *args)
                              for name, args in steps.items()})
    # Per-op overhead on a device: 256 ops minus 1 op, per op.
    long_us, short_us = best["long"], best["short"]
    per_op_us = max((long_us - short_us) / (k - 1), 0.05)
    bar.step("per-op overhead")
    # Hand-off: a 4-byte send from device 0 to device 1, minus one device.
    handoff_us = max(best["two"] - best["two_on_one"], 0.0)
    send_span_us = min(send_us(target), handoff_us)
    bar.step("hand-off")
    name = "cpu" if dev.type == "cpu" else dev.type
    profile = json.loads(_C.calibrated_machine(kernels, transfers, int(memory_bytes), name,
                                               handoff_us - send_span_us))
    profile["devices"][0]["launch_overhead_us"] = per_op_us
    profile["send_overhead_us"] = send_span_us
    # What a one-op step costs beyond its op: waking the device's worker,
    # collecting the outputs (DeviceModel::stepOverheadUs; simulate adds it).
    step_us = max(short_us - per_op_us, 0.0)
    profile["step_overhead_us"] = step_us
    device_us = max(best["second_worker"] - short_us, 0.0)
    profile["worker_overhead_us"] = device_us
    profile["calibration"] = {**target.extra, "device_map": target.device_map,
                              "torch": torch.__version__, "per_op_us": per_op_us,
                              "handoff_us": handoff_us, "send_overhead_us": send_span_us,
                              "step_overhead_us": step_us, "worker_overhead_us": device_us,
                              "date": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())}
    return json.dumps(profile, indent=2)
