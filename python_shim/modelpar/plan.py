"""Plans: what modelpar compiled in this process, one per Dynamo graph.

A ``Plan`` holds the IR of the graphs AOTAutograd produced for one Dynamo
graph (forward and backward for training, inference for no-grad calls),
where each runs, and where it came from in the user's code. ``print(plan)``
shows a summary; ``plan.write_ir(folder)`` writes the IR text.
``modelpar.plans()`` lists them, newest last.
"""

from __future__ import annotations

import collections
import itertools
import os
import re
import threading
from dataclasses import dataclass, field
from pathlib import Path

from ._C import Graph, graph_input_roles, graph_nodes
from .options import CompileOptions

__all__ = ["Plan", "GraphRecord", "plans", "clear_plans"]

_RESUME = re.compile(r"^torch_dynamo_resume_in_(.+)_at_(\d+)$")


@dataclass
class GraphRecord:
    """One captured graph of a plan."""
    kind: str                   # "forward", "backward" or "inference"
    graph: Graph | None         # None when it could not be imported
    runs_on: str                # "modelpar" or "eager"
    reason: str | None = None   # why it runs eagerly
    compile_seconds: float = 0.0
    #: With options devices > 1: the PlacementPlan it runs (placement, program,
    #: simulated step); None on one device.
    placement: object | None = None
    #: The modelpar.Executor running it, when there is one; the summary shows
    #: its replay status (stream replay, or CUDA graphs and why not).
    executor: object | None = None

    @property
    def text(self) -> str:
        return str(self.graph) if self.graph is not None else ""


@dataclass
class Plan:
    """One Dynamo graph as modelpar compiled it."""
    index: int
    function: str               # the user's function (resume functions mapped back)
    filename: str
    line: int                   # where the function starts
    resumed_at: int | None      # the line of the graph break this piece starts after
    options: CompileOptions
    graphs: dict[str, GraphRecord] = field(default_factory=dict)

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
            if self.options.devices > 1:
                return (f"modelpar executor, {self.options.devices} CPU worker devices "
                        f"({self.options.placer or 'm-etf'})")
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
              machine: str | os.PathLike[str] | None = None, **kwargs):
        """Plans this plan's graphs model-parallel on ``devices`` logical
        devices and simulates them (``modelpar.planning.place_captured``;
        the arguments are ``modelpar.plan_graph``'s). Returns a
        ``CapturedPlacement``: ``print()`` it for the summary of each graph.

        Raises:
            ConfigError: a bad option, or no graph of this plan was imported.
            PlanDoesNotFitError: a graph does not fit the memory.
        """
        from .planning import place_captured
        return place_captured(self, devices=devices, memory=memory, placer=placer,
                              machine=machine, **kwargs)

    def summary(self) -> str:
        head = f"modelpar plan {self.index}: {self.function} ({self.filename}:{self.line})"
        if self.resumed_at is not None:
            head += f", the piece after the graph break at line {self.resumed_at}"
        lines = [head, f"  graph breaks in {self.function} so far: {self.graph_breaks}",
                 f"  runs on: {self.runs_on}"]
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
        if placed:
            step = sum(p.step_time_us for p in placed.values())
            lines.append(f"  simulated step ({' + '.join(placed)}): {step:.1f} us")
            for kind, p in placed.items():
                lines.append(f"  [{kind}]")
                lines.extend("    " + line for line in str(p).rstrip("\n").splitlines())
        return "\n".join(lines)

    def __str__(self) -> str:
        return self.summary()

    def __repr__(self) -> str:
        kinds = ", ".join(f"{k}={g.runs_on}" for k, g in self.graphs.items())
        return f"<modelpar.Plan {self.index} {self.function}: {kinds}>"


_lock = threading.Lock()
_plans: list[Plan] = []
_next_index = itertools.count()


def new_plan(function: str, filename: str, line: int, code_name: str,
             options: CompileOptions) -> Plan:
    """Registers a plan for a Dynamo graph of code object ``code_name`` in
    the user's ``function`` (``filename:line``)."""
    m = _RESUME.match(code_name)
    resumed_at = int(m.group(2)) if m else None
    if m and function == code_name:  # the root was not found: take it from the name
        while m:
            function = m.group(1)
            m = _RESUME.match(function)
    with _lock:
        plan = Plan(next(_next_index), function, filename, line, resumed_at, options)
        _plans.append(plan)
    return plan


def plans() -> list[Plan]:
    """The plans compiled in this process, oldest first (newest last)."""
    with _lock:
        return list(_plans)


def clear_plans() -> None:
    """Forgets the recorded plans (compiled functions keep working)."""
    with _lock:
        _plans.clear()
