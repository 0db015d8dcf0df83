"""A captured graph's placed Program bound to this rank's RankExecutor
(``devices="world"``): which outputs every rank gets, which gradients a mesh
averages over its data-parallel replicas."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from ..planning.options import CompileOptions
from .bound_graphs import RankGraph
from .fx_import import GraphKind, InputRole
from .records import PlanRecord

__all__ = ["bind_on_ranks"]


def bind_on_ranks(opts: CompileOptions, plan: PlanRecord, program: Any, kind: GraphKind, imported: Any,
                  rank_device: str, fw_input_roles: Sequence[InputRole],
                  num_fwd_outputs: int | None, scalars: Sequence[int] = ()
                  ) -> tuple[Any, RankGraph]:
    """``program`` bound to this rank's RankExecutor (distributed/rank_executor.py),
    after every rank has checked it planned the same program. Every
    rank gets the forward's user-visible outputs (the loss), which their
    holder broadcasts, and its scalar outputs (``scalars``, IR output
    indices: a size saved for the backward, which AOTAutograd checks is
    an int on every rank, where a tensor saved elsewhere may be a
    placeholder); saved activations and gradients stay where the plan put
    them.

    Returns the RankExecutor and the graph bound to it.

    Raises:
        ConfigError: the ranks planned differently.
    """
    from ..distributed.data_parallel import gradient_reducer
    from ..distributed.rank_executor import RankExecutor
    from ..distributed.plan_check import check_same_plan
    check_same_plan(str(program), opts.process_group,
                    f"the {kind.value} graph of {plan.function}", opts.peer_timeout)
    if kind is GraphKind.BACKWARD:
        # Note [Input gradients over ranks]: AOTAutograd's backward
        # returns one gradient per forward input, in order. A parameter's
        # stays on the rank that made it (its home: placement puts it
        # there); a data input's goes to every rank, because after a
        # graph break it is the tangent of the graph before, whose ranks
        # bind it where that graph made the value, not where this one
        # made its gradient (it was None there: the earlier graph's
        # gradients came out wrong).
        replicated = sorted({o for k, o in enumerate(imported.output_map)
                             if o >= 0 and k < len(fw_input_roles)
                             and fw_input_roles[k] is InputRole.INPUT})
    elif kind is GraphKind.FORWARD and num_fwd_outputs is not None:
        replicated = sorted({o for o in imported.output_map[:num_fwd_outputs] if o >= 0}
                            | set(scalars))
    else:  # inference, or a forward planned alone: every output
        replicated = list(range(len(program.graph.output_names)))
    what = f"the {kind.value} graph of {plan.function}"
    # Under a mesh the backward's parameter gradients are averaged over
    # the dp group (Note [Gradients averaged over the replicas]).
    grads = [o for k, o in enumerate(imported.output_map)
             if kind is GraphKind.BACKWARD and o >= 0 and k < len(fw_input_roles)
             and fw_input_roles[k] is InputRole.PARAM]
    ex = RankExecutor(program, opts.process_group, device=rank_device,
                      timeout_s=opts.peer_timeout, replicated_outputs=replicated,
                      record_trace=opts.trace is not None,
                      trains=kind is not GraphKind.INFERENCE, what=what,
                      # a backward's inputs are saved values, held where made
                      check_inputs=(None if kind is GraphKind.BACKWARD
                                    else opts.input_check_every),
                      replicas=opts.dp_group, kernels=opts.kernels,
                      measure_memory=opts.measure_memory,
                      data_parallel=gradient_reducer(opts, plan, grads, what))
    return ex, RankGraph(ex, imported.output_map, imported.constants, plan, kind,
                    placeholders=kind is GraphKind.FORWARD)
