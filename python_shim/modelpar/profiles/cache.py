"""Where calibrated machine profiles are cached on disk, and how one is
written there so that concurrent readers never see half of it."""

from __future__ import annotations

import os
from pathlib import Path

__all__ = ["cache_dir", "write_profile"]


def cache_dir() -> Path:
    """``$XDG_CACHE_HOME/modelpar``, else ``~/.cache/modelpar``."""
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return Path(base) / "modelpar"


def write_profile(path: Path, text: str) -> None:
    """Writes a profile into the cache atomically: a concurrent reader (another
    rank, another test process) sees all of it or nothing."""
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(f".{os.getpid()}.tmp")
    tmp.write_text(text)
    os.replace(tmp, path)
