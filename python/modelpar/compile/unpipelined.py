"""Whether the pipeline option can cut a captured graph, and the warning
when it cannot (Note [A graph the pipeline cannot cut])."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch
import torch.fx

from .. import _C
from ..planning.options import CompileOptions
from .fx_import import InputRole
from .graph_breaks import last_graph_break, warn_once
from .records import PlanRecord

__all__ = ["why_not_pipelined"]

# Note [A graph the pipeline cannot cut]: a graph break cuts the user's
# function into pieces (a data-dependent branch, a call Dynamo cannot trace,
# an op whose backward reads tensor data: transformers' T5 and BART under
# torch 2.11, its Mixtral experts' fallback backward in transformers 5.17),
# and each piece is planned on its own. A piece may hold fewer layers than
# there are devices (the embedding before a break), none at all (the mask
# built between two breaks), or no input with a batch dimension: the
# pipeline cannot cut it into one stage per device or into micro-batches. It
# is placed by m-ETF on the same devices instead, with a warning naming the
# graph, why, and the last graph break, so the rest of the model still
# pipelines. The same holds for a whole model with fewer layers than devices,
# and under strategy="auto" for a training graph that does not return the
# loss, for which the search has only GPipe pipelines to try (no candidate
# fitted such a piece before).
# A graph that does not return the loss runs fill-drain (GPipe) where 1F1B
# was asked for (compile/pipeline_step.py), with a warning saying how to compile
# the loss in: AOTAutograd starts its backward only after the whole forward
# (and, for a piece, after the pieces after it). Dynamo itself only says
# which frames it traced, and after a break it traces the frames the rest
# calls (a decoder layer's __call__) as graphs of their own, so "a piece"
# cannot be told from "a whole function" here: both get the same rule.


def why_not_pipelined(opts: CompileOptions, plan: PlanRecord, gm: torch.fx.GraphModule, graph: Any,
                      describe_input: Callable[[torch.fx.Node], tuple[InputRole, str | None]],
                      returns_loss: bool = True) -> str | None:
    """Why the pipeline option cannot cut ``graph`` (the forward or
    inference graph AOTAutograd traced, ``gm``, imported), warned once
    per graph; None when it can (Note [A graph the pipeline cannot
    cut]). strategy="auto" decides for itself, except for a training
    graph that does not return the loss (``returns_loss``), where it
    searches only GPipe pipelines."""
    if not opts.pipeline_by_hand and (opts.strategy != "auto" or returns_loss):
        return None
    data = [n for n in gm.graph.nodes if n.op == "placeholder"
            and describe_input(n)[0] is InputRole.INPUT
            and isinstance(n.meta.get("val"), torch.Tensor) and n.meta["val"].dim() > 0]
    layers = list(dict.fromkeys(layer for layer in _C.node_layers(graph) if layer))
    devices = opts.devices
    if not data:
        reason = "it has no input with a batch dimension to split into micro-batches"
    elif len(layers) < devices:
        named = ", ".join(layers[:8]) + (", ..." if len(layers) > 8 else "")
        reason = (f"it has {len(layers)} layer{'' if len(layers) == 1 else 's'}"
                  f"{f' ({named})' if layers else ''}, fewer than the {devices} stages "
                  f"devices={devices} asks for")
    else:
        return None
    key = f"unpipelined {plan.name}"
    piece = (f"the piece of {plan.function} after the graph break at line "
             f"{plan.resumed_at}" if plan.resumed_at is not None
             else f"a graph of {plan.function}")
    searched = ("" if opts.pipeline_by_hand else
                " (strategy='auto' searches only GPipe pipelines for a graph that does "
                "not return the loss)")
    warn_once(
        key, f"modelpar pipeline: {piece} ({plan.filename}:{plan.line}, @{graph.name}) is "
        f"placed by m-ETF on the {devices} devices instead of pipelined{searched}: "
        f"{reason}"
        + last_graph_break()
        + " (Note [A graph the pipeline cannot cut]; modelpar.plans() shows each graph)",
        stacklevel=2)
    plan.unpipelined = reason
    return reason
