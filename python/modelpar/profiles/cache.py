"""Where calibrated machine profiles are cached on disk, and how one is
written there so that concurrent readers never see half of it."""

from __future__ import annotations

import os
import stat
import tempfile
from pathlib import Path

from ..errors import ConfigError

__all__ = ["cache_dir", "write_profile"]


# Note [A cache directory only we write]: the cache holds machine profiles
# the planner trusts (a planted profile steers every plan), in a directory
# under the home, which containers and users may share. So the directory is
# made 0700, and one that is a symlink (which could point anywhere) or is
# owned by another user is refused rather than followed. Files are written
# to a temporary file of a unique name in the directory itself
# (tempfile.mkstemp: a PID is not unique across containers sharing a home)
# and renamed over the target (os.replace: atomic on one file system).


def cache_dir() -> Path:
    """``$XDG_CACHE_HOME/modelpar``, else ``~/.cache/modelpar``; made (0700)
    if it does not exist (Note [A cache directory only we write]).

    Raises:
        ConfigError: the directory is a symlink, not a directory, or owned
            by another user.
    """
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    path = Path(base) / "modelpar"
    try:
        Path(base).mkdir(parents=True, exist_ok=True)
        path.mkdir(mode=0o700)
    except FileExistsError:
        pass
    except OSError as e:
        raise ConfigError(f"modelpar cache: cannot create the cache directory {path}: {e}; "
                          "set XDG_CACHE_HOME to a directory you can write") from e
    check_cache_dir(path)
    return path


def check_cache_dir(path: Path) -> None:
    """Refuses a cache directory another user could have planted (Note [A
    cache directory only we write]).

    Raises:
        ConfigError: ``path`` is a symlink, not a directory, or not owned by
            the current user.
    """
    st = os.lstat(path)
    if stat.S_ISLNK(st.st_mode):
        raise ConfigError(f"modelpar cache: the cache directory {path} is a symlink (to "
                          f"{os.readlink(path)}); modelpar does not follow it. Remove it, or set "
                          "XDG_CACHE_HOME to a directory you own")
    if not stat.S_ISDIR(st.st_mode):
        raise ConfigError(f"modelpar cache: {path} is not a directory; remove it, or set "
                          "XDG_CACHE_HOME to a directory you own")
    if hasattr(os, "getuid") and st.st_uid != os.getuid():
        raise ConfigError(f"modelpar cache: the cache directory {path} is owned by user id "
                          f"{st.st_uid}, not by you ({os.getuid()}); profiles there could have "
                          "been written by anyone. Set XDG_CACHE_HOME to a directory you own")


def write_profile(path: Path, text: str) -> None:
    """Writes a profile into the cache atomically: a concurrent reader (another
    rank, another test process, another container sharing the home) sees all
    of it or nothing (Note [A cache directory only we write])."""
    path.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    try:
        with os.fdopen(fd, "w") as f:
            f.write(text)
        os.replace(tmp, path)
    except BaseException:
        try:
            os.unlink(tmp)
        except OSError:
            pass
        raise
