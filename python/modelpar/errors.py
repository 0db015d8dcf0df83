"""The exceptions modelpar raises. Each mirrors a C++ class of ir/error.h;
the extension translates a C++ error into the class of the same name and keeps
its message."""

from __future__ import annotations

__all__ = [
    "Error",
    "InvalidIrError",
    "ParseError",
    "UnsupportedOpError",
    "PlanDoesNotFitError",
    "ConfigError",
    "ExecutionError",
    "PeerError",
    "InternalError",
]


class Error(RuntimeError):
    """Base of every error modelpar raises on purpose."""


class InvalidIrError(Error, ValueError):
    """IR that breaks an invariant: an undefined value, a bad device, an
    unmatched send, arguments that do not fit an operator's schema."""


class ParseError(InvalidIrError):
    """Malformed IR text. ``line`` and ``column`` (1-based) locate the error;
    the message says ``line:column: expected X, found Y``."""

    def __init__(self, message: str, line: int = 0, column: int = 0) -> None:
        super().__init__(message)
        self.line = line
        self.column = column


class UnsupportedOpError(Error):
    """An operator modelpar cannot call or does not model."""


class PlanDoesNotFitError(Error):
    """A plan needs more memory than the devices have."""


class ConfigError(Error, ValueError):
    """A bad option or option combination."""


class ExecutionError(Error):
    """A failure while running a graph or program: wrong inputs, a failing
    operator (named with its node, and in a program its device and
    instruction), a deadlock at run time."""


class PeerError(ExecutionError):
    """A transfer with another rank of a process group that did not complete
    within the timeout: that rank (``peer``) raised, was killed, or waits on
    a rank that did. modelpar's distributed runs turn it into an
    ExecutionError naming the failed rank (distributed/rank_executor.py)."""

    def __init__(self, message: str, peer: int = -1) -> None:
        super().__init__(message)
        self.peer = peer


class InternalError(Error):
    """A broken invariant inside modelpar itself: a bug to report."""
