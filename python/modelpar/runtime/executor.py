"""The multi-device executor: runs a Program with one worker per logical
device, bound to CPU workers (what CI runs), to GPUs, or to one GPU hosting
several logical devices. See runtime/executor.h for the stream protocol."""

from __future__ import annotations

import os
from collections.abc import Sequence
from typing import Any, Callable, Optional, Union

import torch
from torch.utils._python_dispatch import _disable_current_modes

from .. import _C
from .._C import Program
from ..deprecation import renamed_names
from ..errors import ConfigError
from ..kernels import with_kernel_regions
from .interpreter import RuntimeValue

__all__ = ["Executor", "cuda_graph_issues", "cuda_devices_built", "threads_per_worker"]

Span = Optional[tuple[int, int]]


# Note [Python dispatch modes stay on the caller]
# The executor hands the caller's thread-local state to its workers (grad
# mode, autocast, dispatch key sets), and that state includes the stack of
# Python dispatch modes (TorchDispatchMode). A mode on that stack would see
# every op of every worker, from several threads at once and each through
# the GIL: AOTAutograd's _AnalyzeCustomOpInputOutputMode, active during
# torch.compile's first call, made that call's ops about 30 us each. A
# compiled step is opaque to the caller's modes, as Inductor's kernels are:
# the modes are lifted for the step and put back after it.
def outside_dispatch_modes(run: Callable[..., Any], *args: Any) -> Any:
    """``run(*args)`` with the caller's Python dispatch modes lifted."""
    if torch._C._len_torch_dispatch_stack() == 0:
        return run(*args)
    with _disable_current_modes():
        return run(*args)


def threads_per_worker(program: Program, threads: int | None = None) -> int:
    """Intra-op threads for each CPU worker running ``program``: the
    process's ``threads`` (default ``torch.get_num_threads()``) shared among
    the devices that compute, at least one each.

    Note [Every core used]: a plan's workers share the cores the process
    has, as eager PyTorch's one thread pool would use them all. A one-device
    plan (``strategy="auto"`` may choose one on N devices) gets every thread,
    so it runs as the plain one-device option does; N busy workers get
    ``threads // N`` each (one each on a 2-core machine with 2 devices). The
    calibrated CPU profile is measured at the same count
    (profiles/cpu.py ``machine_for_options``)."""
    total = torch.get_num_threads() if threads is None else threads
    return max(1, total // max(1, program.computing_devices))


def cuda_devices_built() -> bool:
    """Whether this build of modelpar has the executor's CUDA devices."""
    return bool(_C.cuda_devices_built())


def cuda_graph_issues(program: Program, device_map: Union[str, Sequence[str]]) -> list[dict]:
    """Why ``program`` on ``device_map`` cannot be recorded into CUDA graphs: a
    list of ``{"device", "instruction", "what"}`` (device/instruction -1 when
    the reason is not one instruction's); empty when it can. Needs no GPU:
    ``cuda_graph_issues(p, "cuda:0")`` answers for one GPU on any machine.

    Raises:
        ConfigError: a bad device map.
    """
    spec = device_map if isinstance(device_map, str) else ",".join(str(d) for d in device_map)
    return list(_C.capture_issues(program, spec))


class Executor:
    """Runs ``program`` over logical devices; the operators are resolved and
    the workers started once, here, and reused by every :meth:`run`.

    Args:
        program: the Program (one instruction list per logical device).
        device_map: where the logical devices run (the name torch.compile's
            ``device_map`` option uses; ``devices`` elsewhere is a count):
            ``"cpu-workers"`` (one CPU worker thread per logical device),
            ``"cuda"`` (logical device i on ``cuda:i``), ``"cuda:K"`` (all on
            GPU K, each with its own streams), or one device per logical
            device (``["cuda:0", "cuda:1"]`` or ``"cuda:0,cuda:1"``).
        threads_per_device: intra-op threads of each CPU worker; 0 divides
            ``torch.get_num_threads()`` among the workers.
        record_trace: record per-instruction start/end times of every step
            (see :meth:`last_trace` and :meth:`write_chrome_trace`).
        verify: verify the program first (off only to test run-time checks).
        replay: ``"streams"`` (every step issued instruction by instruction)
            or ``"graphs"``: after ``warmup_steps`` stream steps the program
            is captured into CUDA graphs and later steps copy their inputs
            into static buffers and replay them (parameters and buffers
            already on their device are read where they live, not copied;
            one passed at a new address re-captures once); inputs must then
            keep the capture step's shapes, dtypes and devices. Programs that cannot be
            captured (CPU workers, host syncs, data-dependent shapes, ...)
            fall back to stream replay; :meth:`replay_status` says why.
        warmup_steps: stream steps before the capture (>= 1).
        outputs_may_alias: with ``replay="graphs"``, return the static output
            tensors instead of clones (the next step overwrites them).
        measure_memory: measure each device's memory in every step run on
            the stream path: the bytes of distinct tensor storages its value
            slots hold after each instruction (a storage once however many
            values view it); see :meth:`memory_report`. Off, it costs a
            branch per instruction.
        kernels: ``"aten"`` runs every operator through the dispatcher;
            ``"inductor"`` compiles each run of a device's operators between
            transfers with Inductor (Note [Kernel regions]; the report is
            ``kernel_regions``).

    Raises:
        InvalidIrError: the program fails verification, or a node's arguments
            do not fit its operator's schema.
        UnsupportedOpError: a node calls an operator the dispatcher lacks.
        ConfigError: a bad device map (wrong length, an unknown device, CUDA
            in a build without CUDA, a GPU index out of range).

    Example::

        ex = modelpar.Executor(program, device_map="cpu-workers", threads_per_device=1)
        loss, w1, w2 = ex.run([x, y, w1, w2])
    """

    def __init__(
        self,
        program: Program,
        device_map: Union[str, Sequence[str]] = "cpu-workers",
        *,
        threads_per_device: int = 0,
        record_trace: bool = False,
        verify: bool = True,
        replay: str = "streams",
        warmup_steps: int = 1,
        outputs_may_alias: bool = False,
        measure_memory: bool = False,
        kernels: str = "aten",
    ) -> None:
        #: With ``kernels="inductor"``: the program's kernel regions and how
        #: each ran (Note [Kernel regions], kernels/regions.py); else None.
        self.kernel_regions = None
        if kernels == "inductor":
            program, self.kernel_regions = with_kernel_regions(program)
        elif kernels != "aten":
            raise ConfigError(f"modelpar Executor: kernels must be 'aten' or 'inductor', got {kernels!r}")
        spec = device_map if isinstance(device_map, str) else ",".join(str(d) for d in device_map)
        self._ex = _C.Executor(
            program,
            device_map=spec,
            threads_per_device=threads_per_device,
            record_trace=record_trace,
            verify=verify,
            replay=replay,
            warmup_steps=warmup_steps,
            outputs_may_alias=outputs_may_alias,
            measure_memory=measure_memory,
        )

    def run(self, inputs: Sequence[RuntimeValue]) -> list[RuntimeValue]:
        """Runs one step on ``inputs`` (one per graph input, in order; each is
        moved to the device its ``device`` attribute names) and returns one
        value per graph output. The GIL is released while the devices work.

        Raises:
            ExecutionError: a bad input, a run-time deadlock, or a failing
                instruction: the first failure on any device stops them all
                and the message starts ``device D, instruction I (...)``.
            TypeError: an input is not a tensor, int, float or bool.
        """
        return outside_dispatch_modes(self._ex.run, list(inputs))

    __call__ = run

    def last_trace(self) -> dict:
        """``{"host": [[(start_ns, end_ns) | None, ...] per device], "transfer":
        [...], "step_ns": int}`` for the last step: ``host`` is what each
        worker did per instruction, ``transfer`` the copy of each send."""
        return self._ex.last_trace()

    def chrome_trace(self) -> str:
        """Chrome / Perfetto trace JSON of the last step.

        Raises:
            ConfigError: the executor was built without ``record_trace``.
        """
        return self._ex.chrome_trace()

    def write_chrome_trace(self, path: Union[str, os.PathLike]) -> None:
        """Writes :meth:`chrome_trace` to ``path``.

        Raises:
            ConfigError: nothing recorded, or the file cannot be written.
        """
        self._ex.write_chrome_trace(os.fspath(path))

    def replay_status(self) -> dict:
        """``{"requested", "steps", "captured", "static_buffers", "graphs",
        "issues", "summary"}``: what graph replay is doing and, when it fell
        back to stream replay, why (``issues`` as :func:`cuda_graph_issues`)."""
        return self._ex.replay_status()

    def memory_report(self) -> dict:
        """``{"steps": int, "devices": [{"start_bytes", "peak_bytes",
        "peak_instruction", "end_bytes"} per device]}`` for the last measured
        step: the bytes of distinct tensor storages each device's value slots
        held after binding its inputs, at most after any instruction (first
        reached after instruction ``peak_instruction``; -1: the inputs), and
        after its last instruction. ``steps`` counts the measured steps
        (``devices`` is empty before one). A run's temporaries, copies in
        flight and steps replayed as CUDA graphs are not seen
        (runtime/memory_meter.h, Note [Measured memory]); compare
        ``peak_bytes`` with a plan's simulated ``peak_bytes``.

        Raises:
            ConfigError: the executor was built without ``measure_memory``.
        """
        return self._ex.memory_report()

    @property
    def device_map(self) -> str:
        return self._ex.device_map

    @property
    def num_devices(self) -> int:
        return self._ex.num_devices

    @property
    def program(self) -> Program:
        return self._ex.program

    def __repr__(self) -> str:
        return f"<modelpar.Executor {self.num_devices} devices on {self.device_map}>"


# Renamed after 0.1.0 ("capture" is what a front end does to a step; CUDA graphs
# are recorded and replayed).
__getattr__ = renamed_names(__name__, {"capture_issues": "cuda_graph_issues"})
