"""Naming the rank that failed first when a step dies on another rank
(Note [Naming the failed rank]): notes in the group's store, followed from
the peer a transfer lost."""

from __future__ import annotations

import time
from datetime import timedelta
from typing import Any

from ..errors import ExecutionError, PeerError

__all__ = ["report_failure", "name_failed_rank"]

_FAULT_PREFIX = "modelpar/fault/"


# Note [Naming the failed rank]: a rank whose own step fails (an operator
# raised, a bad input) writes `modelpar/fault/<rank>` = "failed: <message>"
# into the group's store before it raises; a rank whose transfer with peer p
# fails (PeerError: p closed the connection, or the timeout passed) writes
# "lost <p>". A rank that sees a PeerError follows these notes from p: a
# "failed" note names the culprit, a "lost q" note leads on to q, and a rank
# with no note (killed: it could write nothing) is itself the culprit. Notes
# of ranks still finding out get two seconds to appear; a "failed" note of
# any rank wins, since it is the first failure. Under
# torchrun the store lives in the agent, so it outlives any worker; store
# calls get a short timeout of their own and are best effort.

def _store(group: Any) -> Any:
    try:
        import torch.distributed as dist
        return dist.distributed_c10d._get_process_group_store(group)
    except Exception:  # no store for this group: the peer's name must do
        return None


def report_failure(group: Any, rank: int, note: str) -> None:
    store = _store(group)
    if store is None:
        return
    try:
        old = store.timeout
        store.set_timeout(timedelta(seconds=2))
        try:
            store.set(f"{_FAULT_PREFIX}{rank}", note)
        finally:
            store.set_timeout(old)
    except Exception:  # the store is gone (its host died): nothing to tell
        pass


def _read_note(store: Any, rank: int) -> str | None:
    key = f"{_FAULT_PREFIX}{rank}"
    try:
        if not store.check([key]):
            return None
        return store.get(key).decode(errors="replace")
    except Exception:
        return None


def _follow(store: Any, rank: int, peer: int, world: int) -> tuple[int, str | None]:
    """One look at the notes: (culprit, its "failed" note) when a rank wrote
    one; else the end of the "lost" chain from ``peer`` and None."""
    notes = {r: _read_note(store, r) for r in range(world) if r != rank}
    for r, note in notes.items():
        if note is not None and note.startswith("failed"):
            return r, note
    culprit, seen = peer, {rank}
    while culprit not in seen:
        seen.add(culprit)
        note = notes.get(culprit)
        if note is None or not note.startswith("lost "):
            break
        culprit = int(note.split()[1])
    return culprit, None


def name_failed_rank(group: Any, rank: int, error: PeerError, grace_s: float = 2.0) -> ExecutionError:
    """The ExecutionError of a PeerError, naming the rank that failed first
    (Note [Naming the failed rank]). The notes of ranks that are still
    finding out are given ``grace_s`` to appear."""
    import torch.distributed as dist
    report_failure(group, rank, f"lost {error.peer}")
    culprit, why = error.peer, None
    store = _store(group)
    if store is not None:
        world = dist.get_world_size(group)
        try:
            old = store.timeout
            store.set_timeout(timedelta(seconds=2))
        except Exception:
            old = None
        try:
            deadline = time.monotonic() + grace_s
            while True:
                culprit, why = _follow(store, rank, error.peer, world)
                if why is not None or time.monotonic() >= deadline:
                    break
                time.sleep(0.1)
        finally:
            if old is not None:
                try:
                    store.set_timeout(old)
                except Exception:
                    pass
    why = why or "raised outside modelpar, was killed, or hangs"
    return ExecutionError(f"modelpar distributed: rank {culprit} failed ({why}); rank {rank} "
                          f"stops: {error}")
