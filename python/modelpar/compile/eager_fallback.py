"""A captured graph the modelpar runtime cannot run: run eagerly with a
warning, or refused (``strict``, and always over ranks)."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch
import torch.fx

from ..errors import UnsupportedOpError
from ..planning.options import CompileOptions
from .fx_import import GraphKind
from .graph_breaks import warn_once
from .records import GraphRecord, PlanRecord, record_graph

__all__ = ["eager_fallback"]


def eager_fallback(opts: CompileOptions, plan: PlanRecord, gm: torch.fx.GraphModule, kind: GraphKind,
                   graph: Any, what: str, detail: str, error: Exception) -> Callable[..., Any]:
    """The graph ``gm`` run eagerly instead of on the modelpar runtime, with
    a one-time warning naming ``what`` stopped it; an error instead under
    ``strict`` and over ranks (Note [No eager fallback over ranks]).

    Raises:
        UnsupportedOpError: ``strict``, or ``devices="world"``.
    """
    where = f"the {kind.value} graph of {plan.function} ({plan.filename}:{plan.line})"
    if opts.strict:
        raise UnsupportedOpError(f"modelpar strict: {where} cannot run on the modelpar "
                                 f"runtime: {detail}") from error
    if opts.world:
        # Note [No eager fallback over ranks]: each rank would run the
        # whole graph eagerly with its own copies of the parameters, which
        # only their home rank updates (or release_unowned has freed), and
        # a mesh's gradients would not be averaged: a silent wrong answer.
        # Every rank compiles the same graph and raises here alike.
        raise UnsupportedOpError(
            f"modelpar distributed: {where} cannot run on the modelpar runtime: {detail}; "
            "over ranks (devices='world') a graph is never run eagerly instead, since each "
            "rank would compute with its own stale (or released) copies of the parameters "
            "other ranks own. Move what stops it out of the compiled function (or behind "
            "torch.compiler.disable, which makes it a graph break), or compile this model "
            "without devices='world'") from error
    warn_once(what, f"modelpar: {detail}; {where} runs eagerly instead of on the modelpar "
                  "runtime (this warning is shown once; options={'strict': True} makes "
                  "it an error)", stacklevel=2)
    record_graph(plan, GraphRecord(kind.value, graph, "eager", reason=detail), opts.dump_dir)
    if opts.dump_dir and graph is None:  # no IR: dump the FX graph that runs instead
        out = Path(opts.dump_dir)
        out.mkdir(parents=True, exist_ok=True)
        (out / f"{plan.name}.{kind.value}.eager-fx.txt").write_text(
            f"# runs eagerly: {detail}\n{gm.print_readable(print_output=False)}",
            encoding="utf-8")
    from functorch.compile import make_boxed_func
    return make_boxed_func(gm.forward)
