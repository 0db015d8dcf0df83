"""A kernel region's nodes as an FX graph of ATen calls, the form Inductor
compiles, and which IR nodes may join a region.

The IR node calls come from ``_C.node_calls`` (op, overload, arguments with
values as ``{"v": id}``). A node may be compiled when it is a functional
ATen or prims operator on tensors that draws no random numbers
(Note [Kernel regions] in kernels/regions.py says why each rule holds); it
may read ints (a symbolic batch's sizes), which the region gets as values.
"""

from __future__ import annotations

import operator
from collections.abc import Mapping, Sequence
from typing import Any

import torch
import torch.fx

from ..ir.torch_names import TORCH_DTYPES, TORCH_LAYOUTS, TORCH_MEMORY_FORMATS

__all__ = ["NodeCall", "operator_of", "why_not_fusible", "region_module"]

NodeCall = Mapping[str, Any]  # one entry of _C.node_calls(graph)

_NAMESPACES = ("aten", "prims")


def operator_of(call: NodeCall) -> torch._ops.OpOverload | None:
    """The ``torch.ops`` overload an IR node calls, or None."""
    namespace, _, name = str(call["op"]).partition("::")
    packet = getattr(getattr(torch.ops, namespace, None), name, None)
    if packet is None:
        return None
    return getattr(packet, call["overload"] or "default", None)


def _returns_fit(op: torch._ops.OpOverload, num_outputs: int) -> bool:
    """Whether the node's outputs are the schema's results one to one
    (Tensor, ..., Tensor) or the elements of one Tensor[] result."""
    returns = op._schema.returns
    kinds = [str(r.type) for r in returns]
    if kinds and all(k == "Tensor" for k in kinds):
        return len(kinds) == num_outputs
    return kinds == ["List[Tensor]"] or kinds == ["Tensor[]"]


def why_not_fusible(call: NodeCall) -> str | None:
    """None when the node may be compiled in a kernel region, else why not."""
    namespace = str(call["op"]).partition("::")[0]
    if namespace not in _NAMESPACES:
        return f"{call['op']} is not an ATen operator"
    if not call["tensor_outputs"]:
        return "makes a number (a size), not a tensor"
    if call["reads_floats_or_bools"]:
        return "reads a float or bool value (a region passes tensors and sizes)"
    if call["random"]:
        return "draws random numbers (seeded per node: Note [Reproducible random ops over workers])"
    op = operator_of(call)
    if op is None:
        return "the dispatcher has no such operator"
    if op._schema.is_mutable:
        return "writes one of its inputs"
    if torch.Tag.nondeterministic_seeded in op.tags:
        return "draws random numbers"
    if not call["outputs"] or not _returns_fit(op, len(call["outputs"])):
        return "its results are not a list of tensors"
    return None


def _constant(arg: Any, device: torch.device | None) -> Any:
    """An IR constant as the Python value the operator takes."""
    if isinstance(arg, dict):
        (kind, value), = arg.items()
        if kind == "dtype":
            return TORCH_DTYPES[value]
        if kind == "layout":
            return TORCH_LAYOUTS[value]
        if kind == "memory_format":
            return TORCH_MEMORY_FORMATS[value]
        if kind == "device":  # Note [Factory ops follow their device]
            return device if device is not None else torch.device(value)
        raise AssertionError(f"not a constant: {arg!r}")
    return arg


def _argument(arg: Any, env: Mapping[int, Any], device: torch.device | None) -> Any:
    if isinstance(arg, list):
        return [_argument(a, env, device) for a in arg]
    if isinstance(arg, dict) and "v" in arg:
        return env[arg["v"]]
    return _constant(arg, device)


def region_module(calls: Sequence[NodeCall], nodes: Sequence[int], inputs: Sequence[int],
                  outputs: Sequence[int], device: torch.device | None = None,
                  sizes: Mapping[int, int] | None = None) -> torch.fx.GraphModule:
    """The FX graph computing ``outputs`` (value ids) from the tensors
    ``inputs`` by the calls of ``nodes`` (node ids, in order), with the int
    values in ``sizes`` (value id -> this call's value) written in as
    constants: a region compiles for its sizes, as Inductor specialises on
    shapes. Names are positional (``in0``, the op's name), so every
    micro-batch's region of a stage prints the same code and shares one
    compiled artifact. ``device`` replaces the device of factory ops (the
    worker's device, as the executor does)."""
    graph = torch.fx.Graph()
    env: dict[int, Any] = dict(sizes or {})
    for i, v in enumerate(inputs):
        env[v] = graph.placeholder(f"in{i}")
    for n in nodes:
        call = calls[n]
        op = operator_of(call)
        assert op is not None, call
        args = tuple(_argument(a, env, device) for a in call["args"])
        kwargs = {k: _argument(a, env, device) for k, a in call["kwargs"].items()}
        result = graph.call_function(op, args, kwargs)
        outs = call["outputs"]
        kinds = [str(r.type) for r in op._schema.returns]
        if len(outs) == 1 and kinds == ["Tensor"]:
            env[outs[0]] = result
        else:
            for i, v in enumerate(outs):
                env[v] = graph.call_function(operator.getitem, (result, i))
    graph.output(tuple(env[v] for v in outputs))
    return torch.fx.GraphModule(torch.nn.Module(), graph)
