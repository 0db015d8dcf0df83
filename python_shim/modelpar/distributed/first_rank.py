"""What the first rank of a process group measures, every rank plans with.

Note [Measured once, planned everywhere]: every rank of a group plans the
same step and must arrive at the same plan (check_same_plan in
distributed/rank_executor.py refuses one that differs). Planning is deterministic given
its inputs, but two of those inputs are measured on the machine: the CPU or
GPU profile the costs come from (calibrated at the first use and cached on
disk, where two ranks calibrating at once, or two machines with other CPUs,
get different numbers) and, under ``strategy="auto"``, the time of every
node of the step (compile/step_search.py). Measured on each rank, they differ in the
last digits and so do the plans. So the first rank of the group measures,
and broadcasts what it measured (a picklable object: a profile's text, the
nodes' times); every other rank waits for it and plans with the same
numbers. A measurement that fails on the first rank is broadcast as the
error, and every rank raises it.
"""

from __future__ import annotations

import hashlib
import os
import pickle
from collections.abc import Callable
from pathlib import Path
from typing import Any, TypeVar

import torch

from .. import errors
from ..errors import ExecutionError

__all__ = ["from_first_rank", "machine_on_ranks", "measure_wait_s"]


def measure_wait_s(peer_timeout_s: float) -> float:
    """How long the other ranks wait for rank 0's measurements: calibrating
    a profile or timing a large step's nodes takes far longer than a
    transfer, so 20 times ``peer_timeout`` (10 minutes by default); a rank 0
    that fails while measuring sends its error at once."""
    return 20.0 * peer_timeout_s


T = TypeVar("T")


class _Failed:
    """What the first rank broadcasts when its measurement raised."""

    def __init__(self, error: BaseException) -> None:
        self.kind = type(error).__name__
        self.message = str(error)


def from_first_rank(make: Callable[[], T], group: Any, what: str, timeout_s: float) -> T:
    """``make()`` run on rank 0 of ``group``, its result on every rank (Note
    [Measured once, planned everywhere]). The other ranks wait up to
    ``timeout_s`` seconds for it.

    Raises:
        ExecutionError: rank 0 failed to make it (the message is rank 0's
            error; a modelpar error keeps its type), or did not send it
            within ``timeout_s``.
        Exception: on rank 0, what ``make`` raised.
    """
    import torch.distributed as dist

    from .groups import wait_for, outside_tracing, wire_device
    with outside_tracing():  # Note [Collectives outside the tracer's dispatch]
        first = dist.get_rank(group) == 0
        failure: BaseException | None = None
        payload = b""
        if first:
            try:
                value = make()
                payload = pickle.dumps(value)
            except Exception as e:  # sent to the other ranks, then raised here
                failure = e
                payload = pickle.dumps(_Failed(e))
        src = dist.get_global_rank(group, 0)
        wire = wire_device(group)  # NCCL carries GPU tensors only
        size = torch.tensor([len(payload)], dtype=torch.int64, device=wire)
        wait_for(dist.broadcast(size, src=src, group=group, async_op=True), timeout_s,
              f"{what} (rank 0 measures it, then sends it to every rank)")
        data = (torch.frombuffer(bytearray(payload), dtype=torch.uint8).to(wire) if first
                else torch.empty(int(size.item()), dtype=torch.uint8, device=wire))
        wait_for(dist.broadcast(data, src=src, group=group, async_op=True), timeout_s,
              f"{what} (rank 0 sends it to every rank)")
        if failure is not None:
            raise failure
        if first:
            return value
        got = pickle.loads(data.cpu().numpy().tobytes())
        if isinstance(got, _Failed):
            # modelpar's own errors keep their type (a plan that does not fit
            # is PlanDoesNotFitError on every rank); others become ExecutionError.
            kind = getattr(errors, got.kind, None)
            if not (isinstance(kind, type) and issubclass(kind, errors.Error)) \
                    or kind is errors.PeerError:
                kind = ExecutionError
            raise kind(f"modelpar distributed: rank 0 failed to measure {what}, which every "
                       f"rank plans with: {got.kind}: {got.message}")
        return got


def machine_on_ranks(make_path: Callable[[], str | None], group: Any,
                     timeout_s: float) -> str | None:
    """The machine profile every rank of ``group`` plans with: rank 0's
    (``make_path()``, a profile file or None: passes' default device), which
    the other ranks write to a file named by its hash in modelpar's cache
    directory."""
    from ..profiles.cache import cache_dir
    made: list[str | None] = []

    def text() -> str | None:
        made.append(make_path())
        return Path(made[0]).read_text() if made[0] is not None else None

    shared = from_first_rank(text, group, "the machine profile", timeout_s)
    if made or shared is None:  # rank 0, or no profile
        return made[0] if made else None
    target = cache_dir() / f"shared-{hashlib.sha256(shared.encode()).hexdigest()[:16]}.json"
    if not target.exists() or target.read_text() != shared:
        target.parent.mkdir(parents=True, exist_ok=True)
        tmp = target.with_suffix(f".{os.getpid()}.tmp")
        tmp.write_text(shared)
        tmp.replace(target)  # atomic: ranks on one machine write the same bytes
    return str(target)
