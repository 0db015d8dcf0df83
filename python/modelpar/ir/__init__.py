"""modelpar's IR from Python: :class:`Graph` and :class:`Program` (the C++
``ir::Graph`` / ``ir::Program``), parsed from text or a file."""

from .text import Graph, Program, load_graph, load_program, parse_graph, parse_program

__all__ = ["Graph", "Program", "load_graph", "load_program", "parse_graph", "parse_program"]
