"""modelpar: run an unmodified PyTorch model split over several devices.

The public API is re-exported here: the IR (Graph, Program, parsing), the
reference interpreters and the exception classes."""

from __future__ import annotations

import torch  # noqa: F401  (loads libtorch before the extension that links it)

from .errors import (
    ConfigError,
    Error,
    ExecutionError,
    InternalError,
    InvalidIrError,
    ParseError,
    PlanDoesNotFitError,
    UnsupportedOpError,
)
from .interpreter import RuntimeValue, run_graph, run_program
from .ir import Graph, Program, load_graph, load_program, parse_graph, parse_program

__all__ = [
    "ConfigError",
    "Error",
    "ExecutionError",
    "Graph",
    "InternalError",
    "InvalidIrError",
    "ParseError",
    "PlanDoesNotFitError",
    "Program",
    "RuntimeValue",
    "UnsupportedOpError",
    "load_graph",
    "load_program",
    "parse_graph",
    "parse_program",
    "run_graph",
    "run_program",
]
