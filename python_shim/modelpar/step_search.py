"""strategy="auto" under torch.compile: the search of one batch size's
step (compile_pipeline.PipelineStep calls ``search_step`` at the first call
of each batch size).

Note [The searched step]: under ``strategy="auto"`` the step is joined as
for a pipeline, and each batch size's first call searches the one-device
plan, the placers and the pipelines on the joint step graph
(passes/search/strategy_search.h). With this CPU's calibrated profile
(cpu_profile.measures_nodes), every node of the step is first timed on a
CPU worker on copies of the call's inputs (profile_graph, median of 5 runs;
inputs the forward call does not have, such as split mode's tangents, are
random of their types), and the per-op cost that does not shrink with the
batch, measured on the step at B and B/2, becomes the machine's per-op
overhead: the search ranks the candidates on measured costs, the
micro-batch copies of a node getting the per-op overhead plus their share
of the rest (MicrobatchOptions::launch_overhead_us). A placement of the
whole step runs as one Program, like a step-mode pipeline; in split mode
(the loss outside the compiled function) only GPipe pipelines can be split
at the backward (split_phases needs a pipeline's stages), so only they are
searched.
"""

from __future__ import annotations

import contextlib
import json
import tempfile
import time
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import torch

from . import _C
from .errors import ExecutionError

__all__ = ["search_step"]


def search_step(graph: Any, opts: Any, options: Mapping[str, Any], split: bool, batch: int,
                machine: str | None, values: Mapping[str, Any] | None, record: Any) -> Any:
    """Searches the strategies for ``graph`` (the joint step) at ``batch``
    on ``opts.devices`` devices (Note [The searched step]); ``options`` are
    the pipeline options (loss reduction, batch norm, portals), ``values``
    the call's inputs by name; the searched graph and machine are recorded
    on ``record`` (``step_graph``, ``search_machine``).

    Raises:
        PlanDoesNotFitError: no candidate fits (each one's reason listed).
    """
    from .cpu_profile import measures_nodes
    from .strategy import search_strategy
    with contextlib.ExitStack() as stack:
        if values is not None and measures_nodes(opts.executor_device_map):
            graph, fixed_us = _profiled(graph, batch, values)
            if machine is not None and fixed_us > 0:
                machine = _with_op_overhead(machine, fixed_us, stack)
        record.step_graph = graph
        record.search_machine = Path(machine).read_text() if machine else None
        return search_strategy(graph, opts.devices, batch, machine=machine,
                               memory=opts.memory, loss_reduction=options["loss_reduction"],
                               allow_random=options["allow_random"],
                               batch_norm=options["batch_norm"], portals=options["portals"],
                               schedules=("gpipe",) if split else (), one_device=not split,
                               placements=not split,
                               microbatches=_microbatch_counts(opts.devices, batch))


def _profiled(graph: Any, batch: int, values: Mapping[str, Any]) -> tuple[Any, float]:
    """``graph`` with every node's time measured on a CPU worker, run on
    copies of ``values`` (the step may write to its inputs: batch norm's
    running statistics), random inputs of their types for the rest; and the
    per-op cost that does not shrink with the batch.

    That cost is measured on the step itself: it runs at batch B and B/2
    (W(B), W(B/2): the fastest of 7 one-worker runs) and every one of its N nodes
    is taken to cost c + b * s_n, so c = (2 W(B/2) - W(B)) / N; at least the
    executor's time between ops (profile_graph_gaps)."""
    from .planning import example_inputs, profile_graph_gaps
    specs = _C.graph_input_specs(graph)
    symbols = {d for s in specs if s["kind"] == "tensor" for d in s["shape"][:1]
               if isinstance(d, str)}
    size_inputs = {s["name"] for s in specs if s["kind"] == "int"
                   and any(s["name"] == y or s["name"].startswith(y + "_") for y in symbols)}
    sizes = {sym: batch for sym in symbols}
    sizes.update({name: batch for name in size_inputs})
    inputs = example_inputs(graph, sizes)
    for i, name in enumerate(graph.input_names):
        if name in values:
            v = values[name]
            inputs[i] = v.detach().clone() if isinstance(v, torch.Tensor) else v
    half = list(inputs)
    for i, s in enumerate(specs):
        if s["kind"] == "tensor" and s["shape"][:1] and s["shape"][0] in symbols:
            half[i] = inputs[i][: batch // 2].clone()
        elif s["name"] in size_inputs:
            half[i] = batch // 2
    # AOTAutograd's first call runs under a Python dispatch mode
    # (_AnalyzeCustomOpInputOutputMode), and the executor's workers inherit
    # the caller's dispatch state: timed under it, every op would pay a trip
    # through Python (~30 us). Time the nodes without the modes.
    from torch.utils._python_dispatch import _disable_current_modes
    with _disable_current_modes():
        profiled, gap_us = profile_graph_gaps(graph, inputs, runs=5)
        if batch < 4:
            return profiled, gap_us
        full_us = _one_worker_us(graph, inputs)
        try:
            half_us = _one_worker_us(graph, half)
        except ExecutionError:  # a step that cannot run at B/2 (batch norm of one sample)
            return profiled, gap_us
    return profiled, max(gap_us, (2 * half_us - full_us) / max(1, graph.num_nodes))


def _one_worker_us(graph: Any, inputs: list[Any], runs: int = 7) -> float:
    """The fastest run of ``graph`` on one CPU worker (after one warm-up):
    the difference of two of these is taken, and other load only ever adds
    to a run, so the minimum is the steadier estimate."""
    from .executor import Executor
    from .planning import plan_graph
    program = plan_graph(graph, devices=1, coarsen=False, dump_dir="").program
    ex = Executor(program, device_map="cpu-workers", threads_per_device=1)
    ex.run(list(inputs))
    times = []
    for _ in range(runs):
        t0 = time.perf_counter_ns()
        ex.run(list(inputs))
        times.append((time.perf_counter_ns() - t0) / 1e3)
    return min(times)


def _with_op_overhead(machine: str, fixed_us: float, stack: contextlib.ExitStack) -> str:
    """A copy of the machine profile whose per-op overhead is the step's
    measured one, if larger (a temporary file, removed when ``stack``
    closes): every micro-batch's copy of an op pays it whole."""
    prof = json.loads(Path(machine).read_text())
    for dev in prof["devices"]:
        dev["launch_overhead_us"] = max(float(dev["launch_overhead_us"]), fixed_us)
    f = stack.enter_context(tempfile.NamedTemporaryFile("w", suffix=".json"))
    f.write(json.dumps(prof))
    f.flush()
    return f.name


def _microbatch_counts(devices: int, batch: int) -> list[int]:
    """N, 2N, 4N, ... up to the batch (the search's default), or the batch
    alone when it is smaller than N: a pipeline needs one micro-batch per
    stage to overlap, but a small batch still gets a (model-parallel) one."""
    counts = [m for m in (devices << k for k in range(32)) if m <= batch]
    return counts or [batch]
