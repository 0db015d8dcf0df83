"""The IR from Python: parse and load Graphs and Programs (text format in
ir/README.md)."""

from __future__ import annotations

import os
from pathlib import Path

from .._C import Graph, Program
from .._C import parse_graph as _parse_graph
from .._C import parse_program as _parse_program

__all__ = ["Graph", "Program", "parse_graph", "parse_program", "load_graph", "load_program"]


def parse_graph(text: str) -> Graph:
    """Parses the text of one ``graph @name(...) { ... }``.

    Raises:
        ParseError: the text is malformed; ``.line``/``.column`` locate it.
        InvalidIrError: the text parses but breaks a graph invariant.
    """
    return _parse_graph(text)


def parse_program(text: str) -> Program:
    """Parses ``program devices=N``, a graph and its ``device K { ... }`` blocks.

    Raises:
        ParseError: the text is malformed; ``.line``/``.column`` locate it.
        InvalidIrError: the text parses but breaks an invariant.
    """
    return _parse_program(text)


def load_graph(path: str | os.PathLike[str]) -> Graph:
    """Reads and parses a graph text file.

    Raises:
        OSError: the file cannot be read.
        ParseError: the text is malformed.
    """
    return _parse_graph(Path(path).read_text(encoding="utf-8"))


def load_program(path: str | os.PathLike[str]) -> Program:
    """Reads and parses a program text file.

    Raises:
        OSError: the file cannot be read.
        ParseError: the text is malformed.
    """
    return _parse_program(Path(path).read_text(encoding="utf-8"))
