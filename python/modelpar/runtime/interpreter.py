"""The reference interpreters: run a Graph node by node, or a Program's
per-device schedules interleaved on one real device, calling each ATen
operator by name through the dispatcher."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Union

import torch

from .._C import Graph, Program
from .._C import run_graph as _run_graph
from .._C import run_program as _run_program

__all__ = ["run_graph", "run_program", "RuntimeValue"]

RuntimeValue = Union[torch.Tensor, int, float, bool]


def run_graph(graph: Graph, inputs: Sequence[RuntimeValue]) -> list[RuntimeValue]:
    """Runs ``graph`` on ``inputs`` (one per graph input, in order) and returns
    one value per graph output. The GIL is released while it runs.

    Raises:
        InvalidIrError: the graph breaks an invariant, or a node's arguments do
            not fit its operator's schema.
        UnsupportedOpError: a node calls an operator the dispatcher does not know.
        ExecutionError: an input does not have its declared type, an operator
            fails, or a result does not have the type the IR declares.
        TypeError: an input is not a tensor, int, float or bool.
    """
    return _run_graph(graph, list(inputs))


def run_program(program: Program, inputs: Sequence[RuntimeValue]) -> list[RuntimeValue]:
    """Runs ``program`` with every logical device on the inputs' device and
    returns one value per graph output. Inputs are bound on the device their
    ``device`` attribute names (0 if unset). The GIL is released while it runs.

    Raises:
        InvalidIrError: the program fails verification.
        UnsupportedOpError: a node calls an operator the dispatcher does not know.
        ExecutionError: a bad input, a deadlock at run time, or a failing
            instruction (the message starts ``device D, instruction I (...)``).
        TypeError: an input is not a tensor, int, float or bool.
    """
    return _run_program(program, list(inputs))
