"""Choosing the plan automatically: ``search_strategy`` plans and simulates
every candidate strategy for a training step (passes/search/strategy_search.h)
and keeps the fastest that fits. torch.compile's ``strategy="auto"`` (and
``mode="max-autotune"``) and ``python -m modelpar plan --strategy auto`` use it.

Example::

    s = modelpar.search_strategy("examples/ir/skip_step_symbolic.txt", devices=2, batch_size=64)
    print(s)                          # every candidate: step, peak memory, bound, status
    best = s.candidates[s.chosen]     # {"label": "pipeline 1f1b m=4 ...", "step_us": ...}
    plan = s.pipeline or s.placement  # the chosen plan; plan.program runs on Executor
"""

from __future__ import annotations

import os
from collections.abc import Mapping, Sequence
from typing import Any

from .. import _C
from ..errors import ConfigError
from ..ir.text import Graph, load_graph
from .option_names import STRATEGIES, check_devices, check_one_of

__all__ = ["STRATEGIES", "StrategySearch", "search_strategy"]

StrategySearch = getattr(_C, "StrategySearch", None)


def _names(option: str, values: Sequence[str]) -> list[str]:
    if isinstance(values, str):
        values = [values]
    for v in values:
        check_one_of("strategy-search", option, v)
    return [str(v) for v in values]


def search_strategy(graph: Graph | str | os.PathLike[str], devices: int, batch_size: int, *,
                    machine: str | os.PathLike[str] | None = None, memory: Any = None,
                    loss_reduction: str = "auto", allow_random: bool = True,
                    batch_norm: str = "refuse", portals: bool = True,
                    placers: Sequence[str] = (), schedules: Sequence[str] = (),
                    partitions: Sequence[str] = (), checkpoints: Sequence[str] = (),
                    microbatches: Sequence[int] = (), virtual_stages: Sequence[int] = (),
                    one_device: bool = True,
                    placements: bool = True, pipelines: bool = True, prune: bool = True,
                    lp_time_limit_s: float = 5.0,
                    microbatch_launch_us: Mapping[int, float] | None = None) -> Any:
    """Searches the strategies for ``graph`` on ``devices`` devices at batch
    size ``batch_size``: the one-device plan, each placer, and pipelines over
    schedules x micro-batches {N, 2N, 4N, ...} x partition methods x
    checkpoint modes (empty lists: every valid value), interleaved 1F1B
    with each of ``virtual_stages`` stages per device (empty: 2 and 3 where
    the step has N·v layers; Note [Schedules in the search],
    passes/search/strategy_search.h).
    Candidates are planned
    in order of a lower bound and those that cannot beat the best found are
    skipped (``prune``). ``microbatch_launch_us``: {m: per-op overhead} that
    pipelines of m micro-batches are planned with instead of the machine's
    (strategy="auto" measures it: Note [The searched step]).

    Returns:
        A ``StrategySearch``: ``candidates`` (dicts with label, status,
        step_us, peak_bytes, lower_bound_us, reason, chosen), ``chosen``,
        ``seconds``, ``placement`` / ``pipeline`` (the chosen plan), ``table()``.

    Raises:
        ConfigError: a bad option, named with its valid values.
        PlanDoesNotFitError: no candidate fits (lists each one's reason).
        ParseError, InvalidIrError, OSError: an unreadable or invalid graph.
    """
    from .placement import memory_list, require_passes
    require_passes()
    if not isinstance(graph, Graph):
        graph = load_graph(graph)
    check_devices("strategy-search", devices)
    if isinstance(batch_size, bool) or not isinstance(batch_size, int) or batch_size < 1:
        raise ConfigError(f"modelpar strategy-search: batch_size={batch_size!r} is not valid; "
                          "batch_size takes an int >= 1 (the step is costed at it)")
    ms = [int(m) for m in microbatches]
    vs = [int(v) for v in virtual_stages]
    launch = sorted((int(m), float(us)) for m, us in (microbatch_launch_us or {}).items())
    for m, us in launch:
        if m < 1 or not us >= 0 or us == float("inf"):
            raise ConfigError(f"modelpar strategy-search: microbatch_launch_us={{{m}: {us}}} is "
                              "not valid; it maps micro-batch counts >= 1 to finite "
                              "microseconds >= 0")
    return _C.search_strategy(
        graph, devices, batch_size, None if machine is None else os.fspath(machine),
        memory_list(memory), loss_reduction, bool(allow_random), batch_norm, bool(portals),
        _names("placer", placers), _names("schedule", schedules),
        _names("partition", partitions), _names("checkpoint", checkpoints), ms,
        bool(one_device), bool(placements), bool(pipelines), bool(prune), float(lp_time_limit_s),
        launch, vs)
