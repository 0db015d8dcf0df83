"""The Chrome traces the ``trace`` option writes: one measured and one
simulated file per step, over every graph of the step.

Note [One trace for the pieces of a step]
~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~
A graph break cuts the compiled function into pieces, each a Dynamo graph
with a plan of its own (compile/records.py), and every piece has the same ``trace``
option. Each piece wrote its own step to that path, so the file held the
last piece to finish (the first graph's, whose backward runs last) and the
rest of the step was lost. Now the plans that share a path share one
``StepTrace``, which gathers the runs of every piece and rewrites the file
each time a piece completes (a backward or an inference run, or a
pipelined step), so after the step the file holds all of it:

* measured (``step.json``): each run's executor events at their real
  times (the runs of a step follow each other: A's forward, B's forward,
  B's backward, A's backward), ``args.graph`` the run's kind ("forward",
  "backward", "inference", "step") and ``args.piece`` its plan's name;
* simulated (``step.simulated.json``): each piece's simulated step, one
  after the other in the order the pieces first ran (the simulator plans a
  piece's forward and backward together, so the pieces cannot interleave
  as the real step does), ``args.piece`` naming it.

A new step begins when a piece that has already completed in the gathered
step runs again: the gathered runs are dropped then. Over a process group
each rank writes its own measured file (``step.rank<r>.json``); rank 0
writes the simulated one (the plan is the same on every rank).
"""

from __future__ import annotations

import json
import threading
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

__all__ = ["StepTrace", "step_trace_for", "forget_step_traces"]


@dataclass
class _Run:
    piece: str
    kind: str
    start_ns: int
    events: list[dict[str, Any]]


@dataclass
class StepTrace:
    """The runs of one step gathered for one ``trace`` path (Note [One
    trace for the pieces of a step])."""
    path: Path
    simulated_path: Path | None  # None: another rank writes it
    runs: list[_Run] = field(default_factory=list)
    completed: set[str] = field(default_factory=set)
    #: piece name -> its simulated plan (has ``trace()`` and ``step_time_us``)
    simulated: dict[str, Any] = field(default_factory=dict)
    #: piece name -> (its plan, the plan's trace events): a plan's simulated
    #: step does not change, so it is read once, not after every step
    _simulated_events: dict[str, tuple[Any, list[dict[str, Any]]]] = field(default_factory=dict)
    #: the pieces and plans of the simulated file last written
    _simulated_written: tuple[tuple[str, int], ...] = ()

    def add(self, piece: str, kind: str, executor: Any, start_ns: int) -> None:
        """Keeps one run's executor events (read now: the executor's trace
        is of its last run)."""
        if piece in self.completed:  # the piece runs again: a new step
            self.runs.clear()
            self.completed.clear()
        self.runs.append(_Run(piece, kind, start_ns,
                              json.loads(executor.chrome_trace())["traceEvents"]))

    def complete(self, piece: str, simulated: Any | None) -> None:
        """A piece finished its step: rewrites the files with what the step
        holds so far."""
        self.completed.add(piece)
        if simulated is not None:
            self.simulated[piece] = simulated
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self.path.write_text(json.dumps({"traceEvents": self._measured()}), encoding="utf-8")
        if self.simulated_path is not None and self.simulated:
            # The same pieces and plans as the file holds: nothing to rewrite
            # (writing it after every step cost a pipeline's 8,000 events
            # each time, ten times the step of a small model).
            key = tuple((piece, id(self.simulated[piece])) for piece in self._pieces())
            if key != self._simulated_written or not self.simulated_path.exists():
                self.simulated_path.write_text(json.dumps({"traceEvents": self._simulated()}),
                                               encoding="utf-8")
                self._simulated_written = key

    def _measured(self) -> list[dict[str, Any]]:
        t0 = min(r.start_ns for r in self.runs)
        out: list[dict[str, Any]] = []
        seen: set[str] = set()
        for run in self.runs:  # each run's events at its own start
            _append(out, seen, run.events, (run.start_ns - t0) / 1e3,
                    {"graph": run.kind, "piece": run.piece})
        return out

    def _simulated(self) -> list[dict[str, Any]]:
        out: list[dict[str, Any]] = []
        seen: set[str] = set()
        at = 0.0
        for piece in self._pieces():  # in the order they first ran in this step
            plan = self.simulated[piece]
            cached = self._simulated_events.get(piece)
            if cached is None or cached[0] is not plan:
                cached = (plan, json.loads(plan.trace())["traceEvents"])
                self._simulated_events[piece] = cached
            end = _append(out, seen, cached[1], at, {"piece": piece})
            at = max(end, at + plan.step_time_us)
        return out

    def _pieces(self) -> list[str]:
        """The pieces of this step that have a simulated plan, in the order
        they first ran."""
        return list(dict.fromkeys(r.piece for r in self.runs if r.piece in self.simulated))


def _append(out: list[dict[str, Any]], seen: set[str], events: list[dict[str, Any]],
            shift_us: float, args: dict[str, str]) -> float:
    """Appends ``events`` to ``out``: timed ones ``shift_us`` later with
    ``args`` added, metadata (process and thread names) once. Returns the
    end of the last timed event (``shift_us`` if none)."""
    end = shift_us
    for e in events:
        e = dict(e)
        if e.get("ph") == "M":
            key = json.dumps(e, sort_keys=True)
            if key in seen:
                continue
            seen.add(key)
        elif "ts" in e:
            e["ts"] = e["ts"] + shift_us
            e["args"] = {**e.get("args", {}), **args}
            end = max(end, e["ts"] + e.get("dur", 0.0))
        out.append(e)
    return end


_lock = threading.Lock()
_traces: dict[str, StepTrace] = {}


def step_trace_for(trace: str, rank: int | None) -> StepTrace:
    """The StepTrace of the ``trace`` option's path on this rank (None: not
    over a process group), made at its first use."""
    path = Path(trace)
    simulated = path.with_name(path.stem + ".simulated.json")
    if rank is not None:  # each rank its own file: step.json -> step.rank1.json
        path = path.with_name(f"{path.stem}.rank{rank}{path.suffix}")
    key = str(path)
    with _lock:
        if key not in _traces:
            _traces[key] = StepTrace(path, simulated if rank in (None, 0) else None)
        return _traces[key]


def forget_step_traces() -> None:
    """Drops the gathered steps (clear_plans: the next step starts afresh)."""
    with _lock:
        _traces.clear()
