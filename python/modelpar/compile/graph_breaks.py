"""What the compile front end tells the user once per process: warnings
keyed so each shows once (:func:`warn_once`), and the last graph break Dynamo
recorded (:func:`last_graph_break`), which explains most of them."""

from __future__ import annotations

import warnings

__all__ = ["warn_once", "forget_warnings", "last_graph_break"]

_shown: set[str] = set()


def warn_once(key: str, message: str, stacklevel: int = 2) -> None:
    """Warns ``message`` unless a warning with ``key`` was shown before in
    this process (``stacklevel`` as for ``warnings.warn``, counted from the
    caller)."""
    if key in _shown:
        return
    _shown.add(key)
    warnings.warn(message, stacklevel=stacklevel + 1)


def forget_warnings() -> None:
    """Shows every warning again (tests)."""
    _shown.clear()


def last_graph_break() -> str:
    """The reason (and Dynamo's hint) of the last graph break Dynamo has
    recorded in this process, for an error about a loss a graph break split
    off; "" when there is none. (transformers' GPT-2 given labels breaks at
    a logger.warning_once before its loss, which the hint removes.)"""
    try:
        from torch._dynamo.utils import counters
    except ImportError:
        return ""
    reasons = list(counters.get("graph_break", {}))
    if not reasons:
        return ""
    lines = [line.strip() for line in str(reasons[-1]).splitlines() if line.strip()]
    hint = next((line for line in lines if line.startswith("Hint:")), "")
    return (f". The last graph break Dynamo recorded in this process: {lines[0]}"
            + (f" ({hint})" if hint else ""))
