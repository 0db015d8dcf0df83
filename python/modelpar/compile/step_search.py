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
random of their types) and scaled to add up to the step's fastest run
(Note [Node times anchored to the fastest step]), and the per-op cost that
does not shrink with the batch, measured on the step at B and B/2, becomes
the machine's per-op
overhead: the search ranks the candidates on measured costs, the
micro-batch copies of a node getting the per-op overhead plus their share
of the rest (MicrobatchOptions::launch_overhead_us). An op's cost is not
linear in its share of the batch (measured: cnn's pipelines of 16
micro-batches of one sample simulated 2x slower than they ran, those of 4
micro-batches 1.2x faster, on the one overhead fitted at B and B/2), so the
step also runs at each micro-batch size B/m, and pipelines of m
micro-batches are planned with the overhead that makes m steps at B/m cost
what they measured (StrategySearchOptions::microbatch_launch_overhead_us).
The CPU workers are threads of this process: the cores they get are
measured too (the step run on every worker at once against one alone) and
become the machine's ``host_cores`` (Note [Shared host cores] in
passes/lower/simulate.cpp), so that plans which overlap the workers are not
simulated on cores that other work holds. A placement of the whole step
runs as one Program, like a step-mode pipeline; in split mode
(the loss outside the compiled function) only GPipe pipelines can be split
at the backward (split_phases needs a pipeline's stages), so only they are
searched.

Note [Searched pipelines keep the pipeline option's defaults]: a
searched pipeline is what the ``pipeline`` option would build for the same
schedule, micro-batches, partition and checkpoint mode, with the same
defaults: training-mode batch norm deferred (torchgpipe's DeferredBatchNorm:
each micro-batch normalised with its own statistics, the running statistics
from the whole batch's) and dropout drawn per micro-batch. A pipeline is
measured against what the option would run, so auto is never slower than
the plain option it stands for. (Until issue 38, auto refused batch norm in
micro-batches, and every pipeline of a ResNet was a failed candidate.) The
math then differs from eager's by the per-micro-batch statistics, so when
auto chooses such a pipeline for a step with training-mode batch norm it
warns once, naming the way back: ``options={"strategy": "auto", "pipeline":
{"batch_norm": "refuse"}}``; under auto the ``pipeline`` option may give
only ``batch_norm``, ``allow_random``, ``loss_reduction`` and ``portals``.
In split mode, where only GPipe pipelines are searched, pipelines of one
micro-batch (the layers cut into stages, run in turn) are candidates too.

Random ops are another matter: dropout, bernoulli, rand_like and the like
draw each element on its own, so drawn per micro-batch they have the
distribution they have over the whole batch (Note [Random ops per
micro-batch] in passes/pipeline/microbatch.cpp). ``strategy="auto"``
therefore searches pipelines of a model with dropout (GPT-2 and BERT train
with dropout 0.1, and all their pipelines were failed candidates),
reproducible under torch.manual_seed (Note [Reproducible random ops over
workers] in runtime/random_seeding.cpp). A permutation (``randperm``) drawn
per micro-batch would permute within micro-batches only: a step that draws
one keeps its pipelines of several micro-batches refused.

Over a process group (``devices="world"``), rank 0 times the nodes and
measures the cores, and every rank searches with its numbers (Note
[Measured once, planned everywhere] in distributed/first_rank.py), so every rank picks
the same plan; the ranks are costed as CPU workers of this machine (threads
sharing its cores, transfers at the profile's in-process cost), and the
one-device plan is not a candidate (the other ranks would idle). Under
``materialize`` (Note [Planning without running] in distributed/materialize.py) the
parameters are not initialised yet: nothing is timed, and the search ranks
the candidates on the machine profile alone.
"""

from __future__ import annotations

import contextlib
import functools
import json
import statistics
import tempfile
import time
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import torch

from .. import _C
from ..errors import ExecutionError

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
    from ..distributed import homes
    from ..profiles.cpu import measures_nodes
    from ..planning.strategy import search_strategy
    with contextlib.ExitStack() as stack:
        if values is not None and measures_nodes(opts.executor_device_map) \
                and not homes.plan_only:
            counts = _microbatch_counts(opts.devices, batch)
            step_us = json.loads(Path(machine).read_text()).get("step_overhead_us", 0.0) \
                if machine is not None else 0.0

            def measure() -> tuple[list[float], float, dict[int, float], float]:
                return _measured(graph, batch, values, opts.devices, counts, step_us)
            if opts.world:  # Note [Measured once, planned everywhere] in distributed/first_rank.py
                from ..distributed.first_rank import from_first_rank, measure_wait_s
                times, fixed_us, launch, cores = from_first_rank(
                    measure, opts.process_group, f"the step's node times at batch {batch}",
                    measure_wait_s(opts.peer_timeout))
            else:
                times, fixed_us, launch, cores = measure()
            graph = _C.apply_profile(graph, times)
            if machine is not None:
                machine = _with_measured(machine, fixed_us, cores, stack)
                record.search_microbatch_launch_us = launch
        record.step_graph = graph
        record.search_machine = Path(machine).read_text() if machine else None
        return search_strategy(graph, opts.devices, batch, machine=machine,
                               memory=opts.memory, loss_reduction=options["loss_reduction"],
                               allow_random=options["allow_random"],
                               batch_norm=options["batch_norm"], portals=options["portals"],
                               schedules=("gpipe",) if split else (),
                               one_device=not split and not opts.world,
                               placements=not split,
                               microbatches=_searched_counts(opts.devices, batch, split),
                               microbatch_launch_us=record.search_microbatch_launch_us)


def _measured(graph: Any, batch: int, values: Mapping[str, Any], devices: int,
              counts: list[int], step_us: float
              ) -> tuple[list[float], float, dict[int, float], float]:
    """Every node's time in ``graph`` (microseconds, -1 where not timed),
    measured on a CPU worker, run on copies of ``values`` (the step may
    write to its inputs: batch norm's running statistics), random inputs of
    their types for the rest, and anchored to the whole step; the
    per-op cost that does not shrink with the batch, at B/2 and per
    micro-batch count of ``counts``; and the cores ``devices`` workers get
    (_host_cores; 0 when not measured).

    That cost is measured on the step itself: it runs at batch B and B/m
    (W(B), W(B/m): the fastest of their one-worker runs, timed in turns,
    Note [Timing in rounds] in profiles/calibration.py; each with the fixed
    step cost F, ``step_us``)
    and every one of its N nodes is taken to cost c + b * s_n, so
    m (W(B/m) - F) - (W(B) - F) = (m - 1) N c; at least the executor's time
    between ops (profile_graph_times). c at m = 2 becomes the machine's per-op
    overhead."""
    from ..planning.placement import example_inputs, profile_graph_times
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

    def sized(b: int) -> list[Any]:
        out = list(inputs)
        for i, s in enumerate(specs):
            if s["kind"] == "tensor" and s["shape"][:1] and s["shape"][0] in symbols:
                out[i] = inputs[i][:b].clone()
            elif s["name"] in size_inputs:
                out[i] = b
        return out

    # AOTAutograd's first call runs under a Python dispatch mode
    # (_AnalyzeCustomOpInputOutputMode), and the executor's workers inherit
    # the caller's dispatch state: timed under it, every op would pay a trip
    # through Python (~30 us). Time the nodes without the modes.
    from torch.utils._python_dispatch import _disable_current_modes
    with _disable_current_modes():
        # Note [Every core used] (runtime/executor.py): each of the plan's
        # workers gets its share of the process's threads; time the nodes so.
        threads = max(1, torch.get_num_threads() // max(1, devices))
        times, gap_us = profile_graph_times(graph, inputs, runs=5, threads_per_device=threads)
        cores = _host_cores(graph, inputs, devices) if devices > 1 else 0.0
        counts = [m for m in sorted({2, *counts}) if m >= 2 and batch // m >= 1] \
            if batch >= 4 else []
        steps = {1: _OneWorker(graph, inputs, threads)}
        for m in counts:
            try:
                steps[m] = _OneWorker(graph, sized(batch // m), threads)
            except ExecutionError:  # a step that cannot run at B/m (batch norm of one sample)
                continue
        fastest = _fastest_in_rounds(steps)
        full_us = fastest[1] - step_us
        times = _anchored(times, full_us)
        launch: dict[int, float] = {}
        for m, us in fastest.items():
            if m > 1:
                launch[m] = max(gap_us, (m * (us - step_us) - full_us)
                                / ((m - 1) * max(1, graph.num_nodes)))
    return times, launch.get(2, gap_us), launch, cores


class _OneWorker:
    """``graph`` planned on one CPU worker, ready to run on ``inputs`` (run
    once here: the warm-up; raises ExecutionError when the step cannot run)."""

    def __init__(self, graph: Any, inputs: list[Any], threads: int = 1) -> None:
        from ..runtime.executor import Executor
        from ..planning.placement import InputRewind, plan_graph
        program = plan_graph(graph, devices=1, coarsen=False, dump_dir="").program
        self.executor = Executor(program, device_map="cpu-workers", threads_per_device=threads)
        self.inputs = inputs
        self.rewind = InputRewind(graph, inputs)  # Note [Timing a step that writes its inputs]
        t0 = time.perf_counter_ns()
        self.executor.run(list(inputs))
        self.first_us = (time.perf_counter_ns() - t0) / 1e3
        self.rewind.restore()

    def runs_in(self, budget_us: float) -> int:
        """How many runs (3 to 50) fill about ``budget_us``."""
        return max(3, min(50, int(budget_us / max(self.first_us, 1.0))))

    def fastest(self, runs: int) -> float:
        """The fastest of ``runs`` steps, in microseconds."""
        best = float("inf")
        for _ in range(runs):
            t0 = time.perf_counter_ns()
            self.executor.run(list(self.inputs))
            best = min(best, (time.perf_counter_ns() - t0) / 1e3)
            self.rewind.restore()
        return best


def _fastest_in_rounds(steps: Mapping[int, _OneWorker], rounds: int = 3,
                       budget_us: float = 20_000) -> dict[int, float]:
    """The fastest run of each step over ``rounds`` rounds taking them in
    turn (Note [Timing in rounds] in profiles/calibration.py), each step at
    least 3 runs (at most 50) a round or as many as fill ``budget_us`` over
    the rounds."""
    from ..profiles.calibration import fastest_in_rounds
    return fastest_in_rounds({k: functools.partial(step.fastest, step.runs_in(budget_us / rounds))
                              for k, step in steps.items()}, rounds)


def _anchored(times: list[float], whole_us: float) -> list[float]:
    """``times`` (per node, -1: not timed) scaled to add up to ``whole_us``,
    the step's fastest run on one worker less its fixed cost.

    Note [Node times anchored to the fastest step]: a node's time is the
    median of 5 traced runs, and a burst of other load (or of the VM's
    neighbours) during those few milliseconds inflates all of them together:
    on an idle 2-core VM one search's node times summed to 1.5-1.75x the
    step they came from (gpt 3461 us simulated one-device, 1975 us
    measured), the next search's to 0.99x. The whole step's time is the
    steadier number (the fastest of its runs, _fastest_in_rounds), so
    the nodes keep their shares and their sum is set to it; the executor's
    time between ops is part of it, as the simulator charges no gap between
    measured nodes."""
    timed = sum(t for t in times if t > 0)
    if timed <= 0 or whole_us <= 0:
        return times
    k = whole_us / timed
    return [t * k if t > 0 else t for t in times]


def _one_worker_us(graph: Any, inputs: list[Any], runs: int = 7) -> float:
    """The fastest run of ``graph`` on one CPU worker (after one warm-up),
    of ``runs`` runs or as many as fill about 20 ms (at most 50)."""
    step = _OneWorker(graph, inputs)
    return step.fastest(max(runs, step.runs_in(20_000)))


def _host_cores(graph: Any, inputs: list[Any], devices: int, trials: int = 10) -> float:
    """The cores ``devices`` CPU workers get now: the step runs on one
    worker alone (T1 a step) and on ``devices`` workers at once, each its
    own copy, from as many threads (Tn a step of each); cores =
    devices * T1 / Tn, within [1, devices]. Each timing runs about 10 ms,
    alone and together in turn; the mean of ``trials`` (other load comes
    and goes: the mean is the share it leaves on average; on an idle 2-core
    VM 10 trials of 10 ms spread 1.6-1.7 over six searches of gpt where 5
    of 20 ms spread 1.5-1.7). Other load on the machine (or fewer cores
    than workers) shows as fewer cores."""
    import threading
    from ..runtime.executor import Executor
    from ..planning.placement import plan_graph
    program = plan_graph(graph, devices=1, coarsen=False, dump_dir="").program
    exs = [Executor(program, device_map="cpu-workers", threads_per_device=1)
           for _ in range(devices)]
    from ..planning.placement import InputRewind
    args = [[v.clone() if isinstance(v, torch.Tensor) else v for v in inputs]
            for _ in range(devices)]
    # Note [Timing a step that writes its inputs] in planning/placement.py
    rewinds = [InputRewind(graph, a) for a in args]
    for ex, a, r in zip(exs, args, rewinds):
        ex.run(list(a))
        r.restore()
    alone = _one_worker_us(graph, inputs, runs=5)
    reps = max(3, min(100, int(10_000 / max(alone, 1.0))))

    def loop(k: int, start: threading.Barrier) -> None:
        start.wait()
        for _ in range(reps):
            exs[k].run(list(args[k]))
            rewinds[k].restore()

    estimates = []
    for _ in range(trials):
        t0 = time.perf_counter_ns()
        for _ in range(reps):
            exs[0].run(list(args[0]))
            rewinds[0].restore()
        t1 = (time.perf_counter_ns() - t0) / 1e3 / reps
        start = threading.Barrier(devices + 1)
        threads = [threading.Thread(target=loop, args=(k, start)) for k in range(devices)]
        for t in threads:
            t.start()
        start.wait()
        t0 = time.perf_counter_ns()
        for t in threads:
            t.join()
        tn = (time.perf_counter_ns() - t0) / 1e3 / reps
        estimates.append(devices * t1 / tn)
    return min(float(devices), max(1.0, statistics.fmean(estimates)))


def _with_measured(machine: str, fixed_us: float, cores: float,
                   stack: contextlib.ExitStack) -> str:
    """A copy of the machine profile whose per-op overhead is the step's
    measured one, if larger (every micro-batch's copy of an op pays it
    whole), and whose host cores are the measured ones (0: not measured); a
    temporary file, removed when ``stack`` closes."""
    prof = json.loads(Path(machine).read_text())
    for dev in prof["devices"]:
        dev["launch_overhead_us"] = max(float(dev["launch_overhead_us"]), fixed_us)
    if cores > 0:
        prof["host_cores"] = cores
    f = stack.enter_context(tempfile.NamedTemporaryFile("w", suffix=".json"))
    f.write(json.dumps(prof))
    f.flush()
    return f.name


def _searched_counts(devices: int, batch: int, split: bool) -> list[int]:
    """The micro-batch counts the search tries: _microbatch_counts, and in
    split mode also 1 (Note [Searched pipelines keep the pipeline option's defaults])."""
    counts = _microbatch_counts(devices, batch)
    return [1, *counts] if split and 1 not in counts else counts


def _microbatch_counts(devices: int, batch: int) -> list[int]:
    """N, 2N, 4N, ... up to the batch (the search's default), or the batch
    alone when it is smaller than N: a pipeline needs one micro-batch per
    stage to overlap, but a small batch still gets a (model-parallel) one."""
    counts = [m for m in (devices << k for k in range(32)) if m <= batch]
    return counts or [batch]
