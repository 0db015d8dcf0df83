"""Pipeline-parallel graph rewrites from Python: ``microbatch`` splits a
training-step graph into micro-batches whose combined result is the full
batch's (passes/pipeline/microbatch.h), and ``checkpoint`` makes the backward of
chosen (stage, micro-batch) pairs read recomputed forward values instead of
stored ones (passes/pipeline/checkpoint.h).

Example::

    g = modelpar.ir.load_graph("examples/ir/mlp_step_symbolic.txt")   # x: f32[B, 16]
    mb = modelpar.microbatch(g, microbatches=4, batch_size=32)      # 4 copies, mb=0..3
    stages = {"fc1": 0, "fc2": 1, "loss": 1}
    ck = modelpar.checkpoint(mb, stages, mode="except_last")
    ck.graph, ck.stage_of_node, ck.groups                          # recompute nodes per (stage, mb)
    modelpar.run_graph(ck.graph, inputs)                             # == run_graph(g, inputs)
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import NamedTuple, Optional, Union

from .. import _C
from ..errors import ConfigError
from ..ir.text import Graph

__all__ = ["CHECKPOINT_MODES", "CheckpointResult", "PARTITION_METHODS", "PIPELINE_SCHEDULES",
           "PipelinePlan", "checkpoint", "microbatch", "microbatch_sizes", "plan_pipeline"]

# The option values, defined once in C++ (passes/option_names.h).
from .option_names import CHECKPOINT_MODES, PARTITION_METHODS, PIPELINE_SCHEDULES  # noqa: E402


def _require() -> None:
    if not hasattr(_C, "microbatch"):
        raise ConfigError("modelpar pipeline passes: this build has no passes/ "
                          "(MODELPAR_WITH_PASSES=OFF); rebuild with it")


def microbatch_sizes(batch: int, microbatches: int) -> list[int]:
    """The micro-batch sizes ``microbatch`` uses: torch.chunk's rule (each
    ``ceil(batch / microbatches)``, the last the rest; may be fewer than asked).

    Raises:
        ConfigError: microbatches < 1, batch < 1, or microbatches > batch.
    """
    _require()
    return _C.microbatch_sizes(int(batch), int(microbatches))


def microbatch(graph: Graph, microbatches: int, batch_size: int, *, batch_symbol: str = "",
               batch_dims: Mapping[str, int] | None = None, loss: str = "", seed: str = "",
               loss_reduction: str = "auto", allow_random: bool = True,
               batch_norm: str = "refuse") -> Graph:
    """Splits a training-step graph with a symbolic batch dimension into
    micro-batches (passes/pipeline/microbatch.h): per micro-batch copies (``mb=k``)
    of every node that depends on the batch, inputs sliced with
    ``aten::narrow``, outputs with the batch dimension concatenated,
    parameter gradients accumulated and the loss combined as Σ w_k·loss_k
    (w_k = b_k/B for a mean loss, 1 for a sum; the backward seed of each
    micro-batch is scaled alike), so results equal the full batch's.

    Args:
        graph: the step; its ``input`` tensors carry the batch symbol
            (``f32[B, 16]``, or ``s0`` from ``torch.compile(dynamic=True)``).
        microbatches: m >= 1.
        batch_size: B, the batch the graph will run on.
        batch_symbol: the batch symbol; "" finds it at dim 0 of the inputs.
        batch_dims: input name -> batch dim, or -1 for "not batched".
        loss: name of the loss output ("" finds it).
        seed: name of the backward seed ("" finds ``ones_like(loss)`` or a
            scalar tangent input).
        loss_reduction: "auto", "mean" or "sum".
        allow_random: accept random ops (dropout) drawing per micro-batch
            (True, the default everywhere: Note [Random ops per micro-batch]);
            False refuses them.
        batch_norm: "refuse" (training-mode batch norm raises) or "deferred"
            (torchgpipe's DeferredBatchNorm: each micro-batch is normalised
            with its own statistics; the new running mean / var are computed
            once from the whole batch's mean and unbiased variance, as the
            full-batch step would).

    Raises:
        ConfigError: a bad option, or a static batch dimension.
        UnsupportedOpError: the split cannot equal the full batch (batch
            norm statistics without batch_norm="deferred", random ops, a loss
            that is not a weighted sum, ...).
    """
    _require()
    return _C.microbatch(graph, int(microbatches), int(batch_size), batch_symbol,
                         list((batch_dims or {}).items()), loss, seed, loss_reduction,
                         bool(allow_random), batch_norm)


class CheckpointResult(NamedTuple):
    """What ``checkpoint`` returns: the graph, the stage of each of its
    nodes, and per checkpointed (stage, micro-batch) the names of its
    recompute nodes in graph order (``[(stage, mb, [name, ...]), ...]``)."""

    graph: Graph
    stage_of_node: list[int]
    groups: list[tuple[int, int, list[str]]]


def checkpoint(graph: Graph, stages: Union[Sequence[int], Mapping[str, int]],
               mode: str = "except_last",
               layers: Optional[Sequence[str]] = None) -> CheckpointResult:
    """Checkpointing of a micro-batched graph (passes/pipeline/checkpoint.h): for each
    checkpointed (stage, micro-batch), the forward nodes whose results its
    backward reads are recomputed (``phase=recompute``) from the stage's
    inputs, and the backward reads the copies; random ops (dropout masks)
    are kept, not recomputed, so the recomputation is exact.

    Args:
        graph: a graph from ``microbatch``.
        stages: the stage of every node (a list, one per node), or a dict
            layer -> stage (every node's layer must be in it).
        mode: "always", "except_last" (every micro-batch but the last,
            torchgpipe's default) or "never".
        layers: only these layers' forwards are recomputed (in the
            micro-batches ``mode`` checkpoints); values of the other layers
            stay stored and the copies read them. None: every layer.

    Raises:
        ConfigError: a bad mode or stage list, a layer missing from ``stages``.
    """
    _require()
    if isinstance(stages, Mapping):
        per_node = []
        for i, layer in enumerate(_C.node_layers(graph)):
            if layer not in stages:
                raise ConfigError(f"modelpar checkpoint: node {i} has layer '{layer}', which the "
                                  f"stages dict does not map (it maps {sorted(stages)})")
            per_node.append(int(stages[layer]))
    else:
        per_node = [int(s) for s in stages]
    g, stage_of_node, groups = _C.checkpoint(
        graph, per_node, mode, None if layers is None else [str(x) for x in layers])
    return CheckpointResult(g, stage_of_node, groups)


#: The pipeline schedules and partition methods plan_pipeline knows.


#: A pipeline plan (C++ passes::PipelinePlan): ``str(p)`` is its summary; see
#: ``program``, ``num_stages``, ``stage_of_layer``, ``stage_device``,
#: ``microbatch_sizes``, ``step_time_us``, ``single_device_us``, ``speedup``,
#: ``ideal_speedup``, ``bubble_fraction``, ``peak_bytes``, ``num_transfers``,
#: ``trace()``, ``write_trace(path)``.
PipelinePlan = getattr(_C, "PipelinePlan", None)


def plan_pipeline(graph: Graph | str, devices: int, microbatches: int, batch_size: int, *,
                  schedule: str = "gpipe", partition: str = "balance-time",
                  checkpoint: str = "except_last", portals: bool = True,
                  memory=None, machine: str | None = None, loss_reduction: str = "auto",
                  allow_random: bool = True, batch_norm: str = "refuse",
                  trace: str | None = None, virtual_stages: int = 0,
                  receive_in_send_order: bool = False):
    """Plans a training step pipeline-parallel (passes/plan_pipeline.h):
    the step is split into ``microbatches`` micro-batches, its layers are
    cut into stages by ``partition`` (torchgpipe's balance by time or size,
    PipeDream's DP, or MadPipe's memory-aware DP), ``checkpoint`` decides
    which (stage, micro-batch) pairs recompute their forward in the backward,
    ``schedule`` orders each device's work (GPipe fill-drain, 1F1B,
    MadPipe's 1F1B*, Megatron's interleaved 1F1B over ``virtual_stages``
    stages per device, or zero bubble's ZB-H1 and ZB-V), and the result is lowered to a Program with a send per
    micro-batch and simulated. Run ``p.program`` with ``modelpar.Executor``
    on the step's inputs at full batch: its outputs equal the step's.

    Args:
        graph: a training-step graph with a symbolic batch dimension
            (``f32[B, 16]``; ``examples/ir/skip_step_symbolic.txt``), or its path.
        devices: devices (stages <= devices).
        microbatches: m (torch.chunk's rule may give fewer).
        batch_size: B, the full batch size.
        schedule: ``"gpipe"``, ``"1f1b"``, ``"1f1b*"`` (``madpipe`` needs
            ``"1f1b*"``), ``"interleaved"``, ``"zb-h1"`` (zero bubble's
            ZB-H1, one stage per device) or ``"zb-v"`` (zero bubble's ZB-V, 2
            stages per device placed in a V: stage s on device s for s <
            devices, 2·devices-1-s after).
        partition: ``"balance-time"``, ``"balance-size"``, ``"balance-time-comm"`` or ``"madpipe"``.
        checkpoint: ``"always"``, ``"except_last"`` or ``"never"`` for every
            layer, or ``"per_layer"``: the fewest layers recomputed that make
            each device's simulated peak fit ``memory`` (nothing where it
            fits without; ``p.recomputed_layers`` lists them; Note
            [Recompute per layer]).
        portals: skip values go straight to their readers (True) or through
            every stage between (False, torchgpipe without portals).
        memory: capacity per device (``"16GiB"``, bytes, or one per device).
        machine: a machine profile JSON path (``modelpar.calibrated_machine``).
        loss_reduction: ``"auto"``, ``"mean"`` or ``"sum"``.
        allow_random: accept random ops (per-micro-batch masks; True, as in
            ``microbatch``).
        batch_norm: ``"refuse"`` (training-mode batch norm is an error) or
            ``"deferred"`` (torchgpipe's DeferredBatchNorm: each micro-batch is
            normalised with its own statistics, the running statistics are
            updated once from the whole mini-batch; see ``microbatch``).
        trace: write the Chrome trace of the simulated step there.
        virtual_stages: stages per device, v (0: 2 for ``"interleaved"`` and
            ``"zb-v"``, 1 otherwise; more than 1 only with ``"interleaved"``,
            exactly 2 with ``"zb-v"``): the layers are cut into devices x v
            stages, stage s on device s % devices, and the bubble of uniform
            stages is (p-1)/(v·m + p-1) instead of 1F1B's (p-1)/(m + p-1), for
            v times the transfers (zb-v: placed in a V).
        receive_in_send_order: plan for the ranks of a process group: each
            device's receives in their senders' order, as the rank
            executor runs them (ir/receive_order.h), before the simulation,
            so that the simulated peaks and the memory check are of what runs.

    Raises:
        ConfigError: a bad option, named with its valid values (before any
            pass runs), or a step whose batch size is static.
        UnsupportedOpError: a step that cannot be split exactly (named node).
        PlanDoesNotFitError: the stages do not fit the memory.
    """
    _require()
    from ..ir.text import load_graph
    from .placement import memory_list
    if not isinstance(graph, Graph):
        graph = load_graph(graph)
    for name, value, least in (("devices", devices, 1), ("microbatches", microbatches, 1),
                               ("batch_size", batch_size, 1), ("virtual_stages", virtual_stages, 0)):
        if isinstance(value, bool) or not isinstance(value, int):
            raise ConfigError(f"modelpar pipeline: {name}={value!r} is not valid; {name} takes "
                              f"an int >= {least}")
    p = _C.plan_pipeline(graph, devices, microbatches, batch_size, schedule, partition,
                         checkpoint, bool(portals), memory_list(memory), machine,
                         loss_reduction, bool(allow_random), batch_norm, virtual_stages,
                         bool(receive_in_send_order))
    if trace is not None:
        p.write_trace(str(trace))
    return p
