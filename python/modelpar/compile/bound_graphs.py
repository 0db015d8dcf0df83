"""Compiled graphs bound to their executors: what AOTAutograd calls.

:class:`MultiDeviceGraph` is a graph placed on several devices of this
process (an ``Executor``), with one capture per input signature under graph
replay; :class:`RankGraph` is one bound to this rank's ``RankExecutor``.
Both are called boxed (``f(args)``) and record each step's wall time in the
plan. The helpers say which inputs vary between calls, where AOTAutograd
expects each output, and which outputs are scalars."""

from __future__ import annotations

import collections
import time
from collections.abc import Callable, Sequence
from typing import Any

import torch
import torch.fx

from .. import _C
from .fx_import import GraphKind
from .records import PlanRecord

__all__ = ["MAX_CAPTURES", "MultiDeviceGraph", "RankGraph", "output_homes", "scalar_outputs",
           "varying_inputs"]


class MultiDeviceGraph:
    """A graph bound to a multi-device Executor, called boxed by
    AOTAutograd (``f(args)``, args emptied); per call only the arguments
    are passed on and the outputs picked, and the step's wall time goes to
    the plan (``PlanRecord.record_run``)."""

    def __init__(self, executor: Any, output_map: Sequence[int],
                 constants: Sequence[torch.Tensor], plan: PlanRecord, kind: GraphKind,
                 homes: Sequence[torch.device | None] | None = None,
                 make_executor: Callable[[], Any] | None = None,
                 varying: Sequence[int] = ()) -> None:
        # In the instance __dict__: Dynamo's wrapper of the backward copies
        # it with functools.wraps, which misses class attributes.
        self._boxed_call = True
        self.executor = executor
        self.output_map = list(output_map)
        self.constants = list(constants)
        self.plan = plan
        self.kind = kind.value
        self.homes = list(homes) if homes is not None else None
        # Note [One capture per signature]: with graph replay, the executor of
        # each input signature met (at most MAX_CAPTURES, least recently used
        # dropped), made by make_executor; the signature reads only the
        # inputs whose value or shape can change (``varying``).
        self.make_executor = make_executor
        self.varying = list(varying)
        self.captures: collections.OrderedDict[Any, Any] = collections.OrderedDict()

    def __call__(self, args: list[Any]) -> list[Any]:
        inputs = list(args)
        args.clear()
        inputs.extend(self.constants)
        if self.make_executor is not None:
            self.executor = self.captured(inputs)
        start = time.perf_counter_ns()
        outs = self.executor.run(inputs)
        picked = [None if o < 0 else outs[o] for o in self.output_map]
        if self.homes is not None:  # Note [Outputs go home]
            picked = [v.to(h) if h is not None and isinstance(v, torch.Tensor) and v.device != h else v
                      for v, h in zip(picked, self.homes)]
        self.plan.record_run(self.kind, self.executor, start, time.perf_counter_ns())
        return picked

    def captured(self, inputs: Sequence[Any]) -> Any:
        """The executor whose capture takes ``inputs`` (Note [One capture
        per signature]): the first one for the first signature, a new one
        for each new signature."""
        key = tuple(tuple(v.shape) if isinstance(v, torch.Tensor) else repr(v)
                    for v in (inputs[i] for i in self.varying))
        if not self.captures:
            self.captures[key] = self.executor
        elif key in self.captures:
            self.captures.move_to_end(key)
        else:
            self.captures[key] = self.make_executor()
            while len(self.captures) > MAX_CAPTURES:
                self.captures.popitem(last=False)
        return self.captures[key]


# Note [One capture per signature]: a captured step replays fixed shapes and
# bakes its non-tensor inputs in (the executor refuses anything else), but a
# graph Dynamo traced with a dynamic batch takes any batch size: its size
# symbol is an int input and its tensors change shape. Like torch's own
# CUDA graph trees, a graph under graph replay keeps one executor, and so
# one capture, per signature it has met (each tensor's shape, dtype and
# device; each other input's value), the least recently used of more than
# MAX_CAPTURES dropped. It failed at the third batch size before: the
# second one met was the first the dynamic graph captured. Only the inputs
# that can change take part (varying_inputs: a tensor with a symbolic size,
# a number), found once at planning; dtypes and devices are Dynamo's guards.
MAX_CAPTURES = 8


def varying_inputs(graph: Any) -> list[int]:
    """Indices of ``graph``'s inputs whose shape or value may differ between
    calls: numbers, and tensors with a symbolic dimension."""
    return [i for i, spec in enumerate(_C.graph_input_specs(graph))
            if spec["kind"] != "tensor" or any(isinstance(d, str) for d in spec["shape"])]


def output_homes(gm: torch.fx.GraphModule, kind: GraphKind,
                 num_fwd_outputs: int | None) -> list[torch.device | None]:
    """Where AOTAutograd expects each output of ``gm``: the device of its
    fake value, or None where it does not matter.

    Note [Outputs go home]: on GPUs the executor leaves each output on the
    GPU of the logical device that made it, but the caller traced with its own
    devices: a CPU model compiled with device_map="cuda:0" must get its
    outputs on the CPU, and the autograd engine rejects a gradient on another
    device than its parameter's. So user-visible outputs and gradients go to
    the device of their fake value; a forward's saved activations (outputs
    past ``num_fwd_outputs``) stay where they were made, since only the
    backward, on the same executor's devices, reads them."""
    out_node = next(n for n in reversed(gm.graph.nodes) if n.op == "output")
    outs = out_node.args[0] if isinstance(out_node.args[0], (list, tuple)) else [out_node.args[0]]
    homes: list[torch.device | None] = []
    for i, n in enumerate(outs):
        val = n.meta.get("val") if isinstance(n, torch.fx.Node) else None
        saved = kind is GraphKind.FORWARD and num_fwd_outputs is not None and i >= num_fwd_outputs
        homes.append(val.device if isinstance(val, torch.Tensor) and not saved else None)
    return homes


def scalar_outputs(gm: torch.fx.GraphModule, output_map: Sequence[int]) -> list[int]:
    """IR output indices of the graph's scalar outputs (SymInt / SymFloat
    values, or Python numbers): ``output_map`` maps FX outputs to IR ones."""
    outs = gm.graph.output_node().args[0]
    outs = outs if isinstance(outs, (list, tuple)) else [outs]
    scalars = []
    for node, o in zip(outs, output_map):
        val = node.meta.get("val") if isinstance(node, torch.fx.Node) else node
        if o >= 0 and isinstance(val, (torch.SymInt, torch.SymFloat, int, float)) \
                and not isinstance(val, bool):
            scalars.append(o)
    return scalars


class RankGraph(MultiDeviceGraph):
    """A graph bound to this rank's RankExecutor (distributed/rank_executor.py). Outputs
    that live on another rank come back as None; in a forward
    (``placeholders``) they become 0-element tensors, since AOTAutograd saves
    them for the backward, which only reads the ones on its own rank."""

    def __init__(self, executor: Any, output_map: Sequence[int],
                 constants: Sequence[torch.Tensor], plan: PlanRecord, kind: GraphKind,
                 placeholders: bool) -> None:
        super().__init__(executor, output_map, constants, plan, kind)
        self.placeholders = placeholders

    def __call__(self, args: list[Any]) -> list[Any]:
        picked = super().__call__(args)
        if not self.placeholders:
            return picked
        empty = torch.empty(0)
        return [empty if (v is None and o >= 0) else v for v, o in zip(picked, self.output_map)]
