"""Plan records: what modelpar compiled in this process, one per Dynamo graph.

A ``PlanRecord`` holds the IR of the graphs AOTAutograd produced for one Dynamo
graph (forward and backward for training, inference for no-grad calls),
where each runs, and where it came from in the user's code. ``print(plan)``
shows a summary; ``plan.write_ir(folder)`` writes the IR text.
``modelpar.plans()`` lists them, newest last.

With planned options (``devices`` > 1, ``memory``, ``trace``, a CUDA
``device_map``) a plan also reports the placement (``joint``: forward and
backward planned as one; ``placement``), the simulated step
(``simulated_step_us``), and, once the compiled function has run, the
measured one: ``measured_step_us`` (the last step's wall time of the
forward plus the backward executor) and ``measured_median_us`` (over all
steps, ``step_times_us``); with ``trace`` the Chrome traces written after
each step (``trace_path``, ``simulated_trace_path``). Example::

    fast = torch.compile(model, backend="modelpar", options={"devices": 2, "trace": "step.json"})
    fast(x).sum().backward()
    p = modelpar.plans()[-1]
    p.simulated_step_us, p.measured_step_us, p.trace_path   # ..., ..., "step.json"
    print(p)
"""

from __future__ import annotations

import collections
import itertools
import os
import re
import statistics
import threading
import weakref
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from .._C import Graph, graph_input_roles, graph_nodes
from ..errors import ConfigError
from ..planning.options import CompileOptions
from ..planning.placement import JointPlacement, plan_graph
from ..deprecation import renamed_names
from .step_trace import StepTrace, forget_step_traces, step_trace_for

__all__ = ["PlanRecord", "GraphRecord", "plans", "clear_plans"]

_RESUME = re.compile(r"^torch_dynamo_resume_in_(.+)_at_(\d+)$")

# Note [Bounded step times]: a plan records the wall time of every step, and
# a training run makes millions; so it keeps the last STEP_TIMES_KEPT (the
# median and the last step come from those) and a count and a sum of all
# (the mean), a few kilobytes per plan however long the run.
STEP_TIMES_KEPT = 1000


class GraphRecord:
    """One captured graph of a plan.

    Note [Records do not keep executors]: ``modelpar.plans()`` lists every
    graph compiled in the process, for as long as it lives, but the executor
    of a graph (worker threads, a rank executor's hold on its process group,
    graph replay's static buffers) belongs to the compiled code: when Dynamo
    drops that code (``torch._dynamo.reset()``, the compiled function
    collected, a recompile evicting it) the executor must go with it. So a
    record holds its executor by a weak reference, and ``executor`` is None
    once the compiled code is gone."""

    def __init__(self, kind: str, graph: Graph | None, runs_on: str, reason: str | None = None,
                 compile_seconds: float = 0.0, placement: object | None = None,
                 executor: object | None = None) -> None:
        self.kind = kind                  # "forward", "backward" or "inference"
        self.graph = graph                # None when it could not be imported
        self.runs_on = runs_on            # "modelpar" or "eager"
        self.reason = reason              # why it runs eagerly
        self.compile_seconds = compile_seconds
        #: With options devices > 1: the PlacementPlan it runs (placement,
        #: program, simulated step); None on one device.
        self.placement = placement
        self._executor: Callable[[], object | None] = lambda: None
        self.executor = executor

    @property
    def executor(self) -> object | None:
        """The modelpar.Executor running it, while the compiled code that
        runs it lives (Note [Records do not keep executors]); the summary
        shows its replay status (stream replay, or CUDA graphs and why not)."""
        return self._executor()

    @executor.setter
    def executor(self, executor: object | None) -> None:
        if executor is None:
            self._executor = lambda: None
        else:
            self._executor = weakref.ref(executor)

    @property
    def text(self) -> str:
        return str(self.graph) if self.graph is not None else ""

    def __repr__(self) -> str:
        return (f"GraphRecord(kind={self.kind!r}, runs_on={self.runs_on!r}, "
                f"reason={self.reason!r}, executor={self.executor!r})")


@dataclass
class PlanRecord:
    """One Dynamo graph as modelpar compiled it."""
    index: int
    function: str               # the user's function (resume functions mapped back)
    filename: str
    line: int                   # where the function starts
    resumed_at: int | None      # the line of the graph break this piece starts after
    options: CompileOptions
    graphs: dict[str, GraphRecord] = field(default_factory=dict)
    #: The PlacementPlan of the joint forward + backward graph (planned
    #: training graphs; None otherwise). Its step is the simulated step.
    joint: Any = None
    #: How the two graphs were joined (``modelpar.planning.placement.plan_joint``'s ``saved``,
    #: ``tangents`` and ``gradients``), to plan them again (bench/).
    joint_links: dict[str, list] | None = None
    #: With the ``pipeline`` option: the PipelinePlan of the last batch size
    #: run, every batch size's, the mode (``step``: the loss is compiled in
    #: and the whole pipelined step runs at the forward call; ``split``:
    #: fill-drain across AOTAutograd's two calls), and the planning time.
    pipeline: Any = None
    pipeline_batches: dict[int, Any] = field(default_factory=dict)
    #: pipelined steps dropped from the cache (compile_pipeline.MAX_BATCH_SIZES)
    pipeline_evictions: int = 0
    pipeline_mode: str | None = None
    #: With the ``pipeline`` option: why this graph is placed by m-ETF
    #: instead (Note [A graph the pipeline cannot cut]), else None.
    unpipelined: str | None = None
    #: With ``strategy="auto"``: the StrategySearch of the last batch size
    #: (modelpar/strategy.py) and of each batch size.
    search: Any = None
    search_batches: dict[int, Any] = field(default_factory=dict)
    #: With ``strategy="auto"``: per batch size, what the first steps measured
    #: of the chosen plan against the one-device plan and which was kept
    #: (Note [Never slower than one device] in compile/plan_guard.py).
    guard_batches: dict[int, str] = field(default_factory=dict)
    #: With ``pipeline`` or ``strategy="auto"``: the joined training step
    #: graph the passes plan (symbolic batch; bench/strategy_search.py
    #: measures every candidate on it).
    step_graph: Any = None
    #: With ``strategy="auto"``: the machine profile (JSON text) the last
    #: search planned on (None: passes' default device).
    search_machine: str | None = None
    #: With ``strategy="auto"``: {micro-batches: per-op overhead (us)} the
    #: last search planned pipelines with (Note [The searched step]).
    search_microbatch_launch_us: dict[int, float] = field(default_factory=dict)
    pipeline_seconds: float = 0.0
    #: Measured wall time of the last STEP_TIMES_KEPT completed steps
    #: (forward + backward executors, or the inference executor),
    #: microseconds, oldest first; every step is counted in ``steps_measured``
    #: and ``mean_step_us`` (Note [Bounded step times]).
    step_times_us: "collections.deque[float]" = field(
        default_factory=lambda: collections.deque(maxlen=STEP_TIMES_KEPT))
    steps_measured: int = 0
    step_time_total_us: float = 0.0
    #: With ``measure_memory``: device -> the most bytes of tensor storages
    #: any executor of the step held there after any instruction, over every
    #: step run (Note [Measured memory]); over a process group, this rank's
    #: device only.
    measured_peak_bytes: dict[int, int] = field(default_factory=dict)
    #: Where the last step's measured / simulated Chrome traces were written.
    trace_path: str | None = None
    simulated_trace_path: str | None = None
    #: Under a mesh with a dp dimension: the GradientReducer of the step
    #: (distributed/data_parallel.py), whose summary plans() shows.
    data_parallel: Any = None
    #: With ``kernels="inductor"``: (what, weak reference to its KernelRegions)
    #: for each program run with kernel regions (Note [Kernel regions]); a
    #: report goes with the compiled code that holds it.
    _kernel_regions: list[tuple[str, Any]] = field(default_factory=list, repr=False)
    _pending_forward: Any = field(default=None, repr=False)

    def add_kernel_regions(self, what: str, report: Any) -> None:
        """Shows ``report`` (a KernelRegions, or None) in the summary while it lives."""
        if report is not None:
            self._kernel_regions.append((what, weakref.ref(report)))
            self._kernel_regions = [(w, r) for w, r in self._kernel_regions if r() is not None]

    @property
    def kernel_regions(self) -> list[tuple[str, Any]]:
        """With ``kernels="inductor"``: (what, KernelRegions) for each live
        program (its regions, what they hold, what ran op by op and why,
        regions Inductor could not compile)."""
        return [(w, r()) for w, r in self._kernel_regions if r() is not None]

    @property
    def simulated_step_us(self) -> float | None:
        """The simulated step: the joint plan's, else the sum of the planned
        graphs' (None when nothing was planned)."""
        if self.joint is not None:
            return self.joint.step_time_us
        if self.pipeline is not None:
            return self.pipeline.step_time_us
        placed = [r.placement for r in self.graphs.values() if r.placement is not None]
        return sum(p.step_time_us for p in placed) if placed else None

    @property
    def candidates(self) -> list[dict[str, Any]] | None:
        """With ``strategy="auto"``: the strategies searched for the last
        batch size, one dict each (label, status, step_us, peak_bytes,
        lower_bound_us, reason, chosen: the one that runs), else None."""
        return None if self.search is None else self.search.candidates

    @property
    def measured_step_us(self) -> float | None:
        """The last step's measured wall time (None before a step ran)."""
        return self.step_times_us[-1] if self.step_times_us else None

    @property
    def measured_median_us(self) -> float | None:
        """The median of the last STEP_TIMES_KEPT measured steps (None
        before a step ran)."""
        return statistics.median(self.step_times_us) if self.step_times_us else None

    @property
    def mean_step_us(self) -> float | None:
        """The mean of every measured step (None before a step ran)."""
        return self.step_time_total_us / self.steps_measured if self.steps_measured else None

    @property
    def placement(self) -> dict[str, int]:
        """Node name -> device: of the joint graph, else of every planned
        graph (names of the backward prefixed ``backward:``)."""
        if self.joint is not None:
            return dict(self.joint.placement)
        out: dict[str, int] = {}
        for kind, rec in self.graphs.items():
            if rec.placement is not None:
                prefix = "" if kind != "backward" else "backward:"
                out.update({prefix + k: v for k, v in rec.placement.placement.items()})
        return out

    def record_run(self, kind: str, executor: Any, start_ns: int, end_ns: int) -> None:
        """Called by the compiled graph after each executor run: a forward
        waits for its backward; a backward or inference run completes a step
        (its time is recorded and, with ``trace``, the traces written: Note
        [One trace for the pieces of a step] in compile/step_trace.py)."""
        trace = self._step_trace() if self.options.trace else None
        if trace is not None:
            trace.add(self.name, kind, executor, start_ns)
        if self.options.measure_memory:
            self._note_memory(executor)
        if kind == "forward":
            self._pending_forward = (start_ns, end_ns)
            return
        runs = [(start_ns, end_ns)]
        if kind == "backward" and self._pending_forward is not None:
            runs.insert(0, self._pending_forward)
        self._pending_forward = None
        took_us = sum(e - s for s, e in runs) / 1e3
        self.step_times_us.append(took_us)
        self.steps_measured += 1
        self.step_time_total_us += took_us
        if trace is not None:
            simulated = self.joint if self.joint is not None else self.pipeline
            if simulated is None:
                placed = [r.placement for r in self.graphs.values() if r.placement is not None]
                simulated = placed[-1] if placed else None
            trace.complete(self.name, simulated)
            self.trace_path = str(trace.path)
            if trace.simulated_path is not None and trace.simulated:
                self.simulated_trace_path = str(trace.simulated_path)

    def _note_memory(self, executor: Any) -> None:
        """Folds an executor's last measured step into measured_peak_bytes
        (a rank executor reports its own device only)."""
        devices = executor.memory_report()["devices"]
        mine = getattr(executor, "rank_now", None)
        for d, m in enumerate(devices):
            if mine is None or d == mine:
                self.measured_peak_bytes[d] = max(self.measured_peak_bytes.get(d, 0),
                                                  int(m["peak_bytes"]))

    @property
    def simulated_peak_bytes(self) -> list[int] | None:
        """Each device's simulated peak of the programs that run: the
        pipeline's, else the largest of the placed graphs' (a training step
        placed as one runs as its forward and backward programs, whose peaks
        these are, not the joint plan's: Note [Saved values cross after the
        forward] in passes/plan_joint.h)."""
        placed = [r.placement for r in self.graphs.values() if r.placement is not None]
        plans = [self.pipeline] if self.pipeline is not None else placed or [self.joint]
        plans = [p for p in plans if p is not None]
        if not plans:
            return None
        n = max(len(p.peak_bytes) for p in plans)
        return [max(int(p.peak_bytes[d]) for p in plans if d < len(p.peak_bytes)) for d in range(n)]

    def _step_trace(self) -> StepTrace:
        rank = None
        if self.options.world:
            import torch.distributed as dist
            # the process's global rank: under a mesh the ranks of the dp
            # replicas share their rank in the plan's (pp) group
            rank = dist.get_rank()
        return step_trace_for(self.options.trace, rank)

    @property
    def name(self) -> str:
        """An identifier for file names and IR graph names: ``forward_3``."""
        return f"{re.sub(r'[^A-Za-z0-9_]', '_', self.function)}_{self.index}"

    @property
    def graph_breaks(self) -> int:
        """Graph breaks Dynamo has made in this plan's function so far (one
        resume point per break seen)."""
        with _lock:
            return len({p.resumed_at for p in _plans
                        if (p.function, p.filename, p.line) == (self.function, self.filename, self.line)
                        and p.resumed_at is not None})

    @property
    def runs_on(self) -> str:
        where = {g.runs_on for g in self.graphs.values()}
        if where == {"modelpar"}:
            # What runs: the searched plan, the pipeline, or the placer.
            if self.search is not None:
                how = f"strategy auto: {self.search.candidates[self.search.chosen]['label']}"
            elif self.pipeline is not None or (self.options.pipeline is not None
                                               and self.joint is None):
                how = "pipeline"
            else:
                how = self.options.placer or "m-etf"
                if self.unpipelined is not None:
                    how += ", not pipelined"
            if self.options.planned and getattr(self.options, "world", False):
                return (f"modelpar rank executor, {self.options.devices} ranks of a process "
                        f"group ({how})")
            if self.options.planned:
                on = self.options.executor_device_map
                what = "CPU worker devices" if on == "cpu-workers" else f"devices on {on}"
                return f"modelpar executor, {self.options.devices} {what} ({how})"
            return "modelpar C++ interpreter, 1 device"
        if where == {"eager"}:
            return "eager PyTorch (fallback)"
        return "mixed: " + ", ".join(f"{k} on {g.runs_on}" for k, g in self.graphs.items())

    def ir(self, kind: str) -> str:
        """The IR text of one graph ("forward", "backward" or "inference")."""
        return self.graphs[kind].text

    def write_ir(self, folder: str | os.PathLike[str]) -> list[Path]:
        """Writes ``<name>.<kind>.txt`` for every imported graph; returns the paths."""
        out = Path(folder)
        out.mkdir(parents=True, exist_ok=True)
        paths = []
        for kind, rec in self.graphs.items():
            if rec.graph is not None:
                path = out / f"{self.name}.{kind}.txt"
                path.write_text(rec.text, encoding="utf-8")
                paths.append(path)
        return paths

    def place(self, devices: int | None = None, memory=None, placer: str = "m-etf",
              machine: str | os.PathLike[str] | None = None, *, coarsen: bool = True,
              trace_dir: str | os.PathLike[str] | None = None,
              dump_dir: str | os.PathLike[str] | None = None,
              lp_time_limit_s: float = 20.0) -> JointPlacement:
        """Plans this plan's graphs model-parallel on ``devices`` logical
        devices and simulates them, each graph on its own (the arguments are
        ``modelpar.plan_graph``'s; ``trace_dir`` receives
        ``<plan name>.<kind>.trace.json`` per graph). Returns a
        ``JointPlacement``: ``print()`` it for the summary of each graph.

        Raises:
            ConfigError: a bad option, or no graph of this plan was imported.
            PlanDoesNotFitError: a graph does not fit the memory.
        """
        out = JointPlacement(self.index, self.function)
        for kind, rec in self.graphs.items():
            if rec.graph is None:
                continue
            trace = None
            if trace_dir is not None:
                Path(trace_dir).mkdir(parents=True, exist_ok=True)
                trace = Path(trace_dir) / f"{self.name}.{kind}.trace.json"
            out.plans[kind] = plan_graph(rec.graph, devices=devices, memory=memory, placer=placer,
                                         machine=machine, trace=trace, coarsen=coarsen,
                                         dump_dir=dump_dir, lp_time_limit_s=lp_time_limit_s)
        if not out.plans:
            reasons = "; ".join(f"{k}: {r.reason}" for k, r in self.graphs.items())
            raise ConfigError(f"modelpar plan: plan {self.index} ({self.function}) has no graph "
                              f"modelpar imported, so there is nothing to place "
                              f"({reasons or 'no graphs'})")
        return out

    def summary(self) -> str:
        head = f"modelpar plan {self.index}: {self.function} ({self.filename}:{self.line})"
        if self.resumed_at is not None:
            head += f", the piece after the graph break at line {self.resumed_at}"
        lines = [head, f"  graph breaks in {self.function} so far: {self.graph_breaks}",
                 f"  runs on: {self.runs_on}"]
        if self.unpipelined is not None:
            lines.append(f"  not pipelined: {self.unpipelined}")
        opts = self.options.non_default()
        if opts:
            lines.append("  options: " + ", ".join(f"{k}={v!r}" for k, v in opts.items()))
        lines.append(f"  {'graph':<10} {'inputs':>6} {'params':>6} {'buffers':>7} {'nodes':>6} "
                     f"{'values':>6}  runs on")
        layers: dict[str, int] = collections.Counter()
        ops: dict[str, int] = collections.Counter()
        for kind, rec in self.graphs.items():
            if rec.graph is None:
                lines.append(f"  {kind:<10} {'-':>6} {'-':>6} {'-':>7} {'-':>6} {'-':>6}  "
                             f"eager: {rec.reason}")
                continue
            g = rec.graph
            roles = collections.Counter(graph_input_roles(g))
            lines.append(f"  {kind:<10} {len(g.input_names):>6} {roles['param']:>6} "
                         f"{roles['buffer']:>7} {g.num_nodes:>6} {g.num_values:>6}  "
                         + (rec.runs_on if rec.reason is None else f"{rec.runs_on}: {rec.reason}"))
            if rec.executor is not None:
                lines.append(f"  {'':<10} replay: {rec.executor.replay_status()['summary']}")
            for op, layer, _phase in graph_nodes(g):
                ops[op] += 1
                if layer:
                    layers[layer] += 1
        if layers:
            shown = ", ".join(f"{name} ({n})" for name, n in list(layers.items())[:12])
            more = f", ... {len(layers) - 12} more" if len(layers) > 12 else ""
            lines.append(f"  layers ({len(layers)}, nodes each): {shown}{more}")
        if ops:
            top = ", ".join(f"{op} x{n}" for op, n in ops.most_common(10))
            lines.append(f"  ops ({len(ops)} distinct, most used): {top}")
        placed = {k: r.placement for k, r in self.graphs.items() if r.placement is not None}
        if self.joint is not None:
            lines.append(f"  simulated step (forward and backward placed as one): "
                         f"{self.joint.step_time_us:.1f} us")
        elif placed:
            lines.append(f"  simulated step ({' + '.join(placed)}): "
                         f"{sum(p.step_time_us for p in placed.values()):.1f} us")
        if self.pipeline is not None:
            p = self.pipeline
            evicted = (f", {self.pipeline_evictions} older batch size"
                       f"{'s' if self.pipeline_evictions != 1 else ''} dropped from the cache"
                       if self.pipeline_evictions else "")
            lines.append(f"  pipeline ({self.pipeline_mode} mode; planned for batch sizes "
                         f"{sorted(self.pipeline_batches)} in {self.pipeline_seconds:.2f} s"
                         f"{evicted}): simulated step {p.step_time_us:.1f} us")
        if placed or self.joint is not None or self.pipeline is not None:
            if self.step_times_us:
                lines.append(f"  measured step: {self.measured_step_us:.1f} us (last), median "
                             f"{self.measured_median_us:.1f} us over the last "
                             f"{len(self.step_times_us)} "
                             f"step{'s' if len(self.step_times_us) != 1 else ''}")
            else:
                lines.append("  measured step: not run yet")
            if self.options.measure_memory:
                lines.append("  memory per device, measured (most any step held) / simulated: "
                             + self._memory_line())
            if self.data_parallel is not None:
                lines.append(f"  data parallel: {self.data_parallel.summary()}")
            if self.trace_path:
                lines.append(f"  traces: measured {self.trace_path}, simulated "
                             f"{self.simulated_trace_path}")
        for what, report in self.kernel_regions:
            lines.append(f"  {what}: " + str(report).replace("\n", "\n  "))
        if self.search is not None:
            chosen = self.search.candidates[self.search.chosen]
            lines.append(f"  strategy: auto, chose {chosen['label']} (simulated "
                         f"{chosen['step_us']:.1f} us) of {len(self.search.candidates)} "
                         f"candidates in {self.search.seconds:.2f} s")
            for batch, note in sorted(self.guard_batches.items()):
                lines.append(f"  run-time check at batch {batch}: {note}")
            lines.append("  [search]")
            lines.extend("    " + line for line in self.search.table().rstrip("\n").splitlines())
        if self.joint is not None:
            lines.append("  [joint]")
            lines.extend("    " + line for line in str(self.joint).rstrip("\n").splitlines())
        if self.pipeline is not None:
            lines.append("  [pipeline]")
            lines.extend("    " + line for line in str(self.pipeline).rstrip("\n").splitlines())
        for kind, p in placed.items():
            lines.append(f"  [{kind}]")
            lines.extend("    " + line for line in str(p).rstrip("\n").splitlines())
        return "\n".join(lines)

    def _memory_line(self) -> str:
        simulated = self.simulated_peak_bytes or []
        if not self.measured_peak_bytes:
            return "not run yet"
        cells = []
        for d in sorted(self.measured_peak_bytes):
            sim = f"{_mib(simulated[d])}" if d < len(simulated) else "-"
            cells.append(f"dev{d} {_mib(self.measured_peak_bytes[d])} / {sim}")
        return ", ".join(cells)

    def __str__(self) -> str:
        return self.summary()

    def __repr__(self) -> str:
        kinds = ", ".join(f"{k}={g.runs_on}" for k, g in self.graphs.items())
        return f"<modelpar.compile.records.PlanRecord {self.index} {self.function}: {kinds}>"


def _mib(n: int) -> str:
    return f"{n / 2**20:.2f} MiB" if n >= 2**20 else f"{n / 2**10:.1f} KiB"


_lock = threading.Lock()
_plans: list[PlanRecord] = []
_next_index = itertools.count()


def new_plan(function: str, filename: str, line: int, code_name: str,
             options: CompileOptions) -> PlanRecord:
    """Registers a plan for a Dynamo graph of code object ``code_name`` in
    the user's ``function`` (``filename:line``)."""
    m = _RESUME.match(code_name)
    resumed_at = int(m.group(2)) if m else None
    if m and function == code_name:  # the root was not found: take it from the name
        while m:
            function = m.group(1)
            m = _RESUME.match(function)
    with _lock:
        plan = PlanRecord(next(_next_index), function, filename, line, resumed_at, options)
        _plans.append(plan)
    return plan


def plans() -> list[PlanRecord]:
    """The plans compiled in this process, oldest first (newest last)."""
    with _lock:
        return list(_plans)


def clear_plans() -> None:
    """Forgets the recorded plans (compiled functions keep working)."""
    with _lock:
        _plans.clear()
    forget_step_traces()


def record_graph(plan: PlanRecord, rec: GraphRecord, dump_dir: str | None) -> None:
    """Keeps ``rec`` as ``plan``'s graph of its kind and, with ``dump_dir``,
    writes its IR text there (``<plan>.<kind>.txt``)."""
    plan.graphs[rec.kind] = rec
    if dump_dir and rec.graph is not None:
        out = Path(dump_dir)
        out.mkdir(parents=True, exist_ok=True)
        (out / f"{plan.name}.{rec.kind}.txt").write_text(rec.text, encoding="utf-8")


# Renamed after 0.1.0 (a record of a plan is not the plan: passes::Plan,
# PlacementPlan); the old names work for one release.
__getattr__ = renamed_names(__name__, {"Plan": "PlanRecord"})
