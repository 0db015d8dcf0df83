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
and broadcasts what it measured (a profile's text, the nodes' times); every
other rank waits for it and plans with the same numbers. A measurement that
fails on the first rank is broadcast as the error, and every rank raises it.

Note [JSON between ranks]: what rank 0 broadcasts is JSON, never a pickle:
unpickling runs whatever the bytes name, so a peer (or anyone who can reach
the group's port) could run code on every rank. Values are None, bool, int,
float, str, lists, tuples and dicts of them (a tuple and a dict with keys
other than strings are tagged, so they come back as they were sent); any
other value is a ConfigError on rank 0, sent to every rank like any failure.
Rank 0 returns the decoded value too, so every rank plans with the same
bits. Bytes that do not decode are an ExecutionError naming rank 0.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Callable
from pathlib import Path
from typing import Any, TypeVar

import torch

from .. import errors
from ..errors import ConfigError, ExecutionError

__all__ = ["from_first_rank", "machine_on_ranks", "measure_wait_s"]


def measure_wait_s(peer_timeout_s: float) -> float:
    """How long the other ranks wait for rank 0's measurements: calibrating
    a profile or timing a large step's nodes takes far longer than a
    transfer, so 20 times ``peer_timeout`` (10 minutes by default); a rank 0
    that fails while measuring sends its error at once."""
    return 20.0 * peer_timeout_s


T = TypeVar("T")


def _encode(value: Any, what: str) -> Any:
    """``value`` as plain JSON (Note [JSON between ranks]).

    Raises:
        ConfigError: a value JSON cannot carry.
    """
    if value is None or isinstance(value, (bool, int, float, str)):
        return value
    if isinstance(value, list):
        return [_encode(v, what) for v in value]
    if isinstance(value, tuple):
        return {"tuple": [_encode(v, what) for v in value]}
    if isinstance(value, dict):
        return {"dict": [[_encode(k, what), _encode(v, what)] for k, v in value.items()]}
    raise ConfigError(f"modelpar distributed: {what} holds a {type(value).__name__}, which "
                      "cannot be sent between ranks (they exchange JSON: None, bool, int, "
                      "float, str, and lists, tuples and dicts of them); convert it first "
                      "(Note [JSON between ranks] in distributed/first_rank.py)")


def _decode(value: Any) -> Any:
    """The value _encode was given.

    Raises:
        ValueError: not something _encode makes.
    """
    if value is None or isinstance(value, (bool, int, float, str)):
        return value
    if isinstance(value, list):
        return [_decode(v) for v in value]
    if isinstance(value, dict) and len(value) == 1 and isinstance(value.get("tuple"), list):
        return tuple(_decode(v) for v in value["tuple"])
    if isinstance(value, dict) and len(value) == 1 and isinstance(value.get("dict"), list):
        out = {}
        for pair in value["dict"]:
            if not (isinstance(pair, list) and len(pair) == 2):
                raise ValueError("a dict entry is not a [key, value] pair")
            key = _decode(pair[0])
            if isinstance(key, list):
                raise ValueError("a dict key is a list")
            out[key] = _decode(pair[1])
        return out
    raise ValueError(f"unexpected {type(value).__name__}")


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
                payload = json.dumps({"value": _encode(make(), what)}).encode()
            except Exception as e:  # sent to the other ranks, then raised here
                failure = e
                payload = json.dumps({"failed": [type(e).__name__, str(e)]}).encode()
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
        return _received(payload if first else data.cpu().numpy().tobytes(), what)


def _received(payload: bytes, what: str) -> Any:
    """The value (or the failure) in rank 0's broadcast ``payload``.

    Raises:
        ExecutionError: the payload is not what from_first_rank sends; or
            rank 0 failed (a modelpar error keeps its type).
    """
    try:
        got = json.loads(payload.decode("utf-8"))
        if not (isinstance(got, dict) and len(got) == 1 and ("value" in got or "failed" in got)):
            raise ValueError("neither a value nor a failure")
        if "value" in got:
            return _decode(got["value"])
        kind_name, message = got["failed"]
        if not (isinstance(kind_name, str) and isinstance(message, str)):
            raise ValueError("a failure that is not [kind, message]")
    except (ValueError, TypeError, UnicodeDecodeError) as e:
        raise ExecutionError(f"modelpar distributed: what rank 0 sent for {what} is not "
                             f"modelpar's JSON ({e}; {len(payload)} bytes); is every rank "
                             "running the same modelpar?") from e
    # modelpar's own errors keep their type (a plan that does not fit is
    # PlanDoesNotFitError on every rank); others become ExecutionError.
    kind = getattr(errors, kind_name, None)
    if not (isinstance(kind, type) and issubclass(kind, errors.Error)) \
            or kind is errors.PeerError:
        kind = ExecutionError
    raise kind(f"modelpar distributed: rank 0 failed to measure {what}, which every "
               f"rank plans with: {kind_name}: {message}")


def machine_on_ranks(make_path: Callable[[], str | None], group: Any,
                     timeout_s: float) -> str | None:
    """The machine profile every rank of ``group`` plans with: rank 0's
    (``make_path()``, a profile file or None: passes' default device), which
    the other ranks write to a file named by its hash in modelpar's cache
    directory."""
    from ..profiles.cache import cache_dir, write_profile
    made: list[str | None] = []

    def text() -> str | None:
        made.append(make_path())
        return Path(made[0]).read_text() if made[0] is not None else None

    shared = from_first_rank(text, group, "the machine profile", timeout_s)
    if made or shared is None:  # rank 0, or no profile
        return made[0] if made else None
    target = cache_dir() / f"shared-{hashlib.sha256(shared.encode()).hexdigest()[:16]}.json"
    if not target.exists() or target.read_text() != shared:
        write_profile(target, shared)  # atomic: ranks on one machine write the same bytes
    return str(target)
