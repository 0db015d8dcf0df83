"""Values that must agree over the ranks of a plan: each rank of a plan over
ranks binds only the inputs placed on its own device (runtime/rank_executor.h),
so ranks given different batches would train on pairs mixed from them, with
no error (Note [Inputs every rank must agree on]). :func:`fingerprint` is a
cheap summary of a value; :class:`AgreementCheck` all-gathers the summaries
of a step's values over a group and raises ``ConfigError`` on every rank,
naming the values and the ranks that differ, before anything runs."""

from __future__ import annotations

import hashlib
from collections.abc import Callable, Sequence
from typing import Any

import torch

from ..errors import ConfigError
from .groups import outside_tracing, wait_for, wire_device

__all__ = ["SAMPLES", "fingerprint", "AgreementCheck"]

#: Elements of a tensor that its fingerprint reads, evenly strided.
SAMPLES = 64


# Note [Inputs every rank must agree on]: a plan over ranks (a placement or
# a pipeline, devices="world") reads each data input on the rank whose
# device the plan put it on: under a 1F1B pipeline x is read by stage 0 and
# y (the target) by the last stage. Ranks fed their own batches, as a
# DistributedSampler over all ranks makes them, train on x from one rank's
# batch and y from another's: the loss is finite, every rank gets the same
# value, nothing fails. So on the first step of every executor over ranks
# (and every `input_check_every` steps after) each rank hashes every data
# input (shape, dtype and SAMPLES evenly strided elements: cheap on any
# size, one device-to-host copy of SAMPLES elements on a GPU) and the
# hashes are all-gathered over the plan's group; any difference is a
# ConfigError on every rank (all see the same hashes), raised before the
# step runs, so no parameter has changed. A sample can miss a difference
# between two batches that agree on every sampled element (the same batch
# with a few rows changed): the check catches the habit, not every
# possible mistake. With a mesh, ranks of different data-parallel replicas
# feed different batches and are not compared; their parameters, which
# must start equal, are compared once the same way (data_parallel.py).


def fingerprint(value: Any) -> tuple[int, int]:
    """(hash of the shape and dtype, hash of those and of SAMPLES evenly
    strided elements) of a tensor; of the repr of a number or None. Each
    fits in 63 bits."""
    if not isinstance(value, torch.Tensor):
        h = _hash(repr(value).encode())
        return h, h
    meta = f"{tuple(value.shape)} {value.dtype}".encode()
    t = value.detach()
    n = t.numel()
    if n == 0 or t.device.type == "meta":
        return _hash(meta), _hash(meta)
    flat = t.reshape(-1)
    sample = flat[::max(1, n // SAMPLES)][:SAMPLES].contiguous().cpu()
    if sample.dtype == torch.bool:
        sample = sample.to(torch.uint8)
    data = sample.view(torch.uint8).numpy().tobytes()
    return _hash(meta), _hash(meta + b"|" + data)


def _hash(data: bytes) -> int:
    return int.from_bytes(hashlib.blake2b(data, digest_size=8).digest(), "little") >> 1


def describe(value: Any) -> str:
    """How a value reads in a message: its shape and dtype, or its repr."""
    if isinstance(value, torch.Tensor):
        return f"shape {tuple(value.shape)} {str(value.dtype).replace('torch.', '')}"
    return repr(value)


class AgreementCheck:
    """Checks that every rank of ``group`` holds the same values at the
    positions ``indices`` of a step's inputs (named ``names``): at the first
    call of :meth:`maybe_check` and then every ``every`` calls (0: the first
    only). ``problem(names, detail)`` words the ConfigError.

    Raises (from :meth:`maybe_check`):
        ConfigError: some ranks hold other values; on every rank alike.
        ExecutionError: a rank did not take part within ``timeout_s``.
    """

    def __init__(self, group: Any, indices: Sequence[int], names: Sequence[str], every: int,
                 timeout_s: float, what: str,
                 problem: Callable[[str, str], str]) -> None:
        import torch.distributed as dist
        self.group = group
        self.indices = list(indices)
        self.names = list(names)
        self.every = every
        self.timeout_s = timeout_s
        self.what = what
        self.problem = problem
        self.size = dist.get_world_size(group)
        self.calls = 0
        self.checks = 0  # how many all-gathers ran (tests and summaries)

    def due(self) -> bool:
        """Whether the next call checks."""
        return self.calls == 0 or (self.every > 0 and self.calls % self.every == 0)

    def maybe_check(self, inputs: Sequence[Any]) -> None:
        if self.size > 1 and self.indices and self.due():
            with outside_tracing():  # Note [Collectives outside the tracer's dispatch]
                self._check(inputs)
            self.checks += 1
        self.calls += 1  # not counted when the check raised: the next call checks again

    def _check(self, inputs: Sequence[Any]) -> None:
        import torch.distributed as dist
        prints = [fingerprint(inputs[i]) for i in self.indices]
        wire = wire_device(self.group)
        mine = torch.tensor([h for pair in prints for h in pair], dtype=torch.int64, device=wire)
        everyone = [torch.empty_like(mine) for _ in range(self.size)]
        wait_for(dist.all_gather(everyone, mine, group=self.group, async_op=True),
                 self.timeout_s, f"the input check of {self.what} (an all-gather of each "
                 "rank's input fingerprints)")
        table = [t.view(-1, 2).tolist() for t in everyone]
        bad = [k for k in range(len(self.indices))
               if len({tuple(row[k]) for row in table}) > 1]
        if not bad:
            return
        me = dist.get_rank(self.group)
        parts = []
        for k in bad:
            groups: dict[tuple[int, int], list[int]] = {}
            for r, row in enumerate(table):
                groups.setdefault(tuple(row[k]), []).append(r)
            shapes_differ = len({h[0] for h in groups}) > 1
            ranks = " vs ".join("[" + ", ".join(map(self._global, rs)) + "]"
                                for rs in groups.values())
            kind = "shape or dtype" if shapes_differ else "values"
            parts.append(f"{self.names[k]!r} differs in {kind} between ranks {ranks} (this "
                         f"rank's: {describe(inputs[self.indices[k]])})")
        detail = (f"in {self.what}: " + "; ".join(parts)
                  + f" (global ranks; this is rank {self._global(me)})")
        raise ConfigError(self.problem(", ".join(repr(self.names[k]) for k in bad), detail))

    def _global(self, r: int) -> str:
        import torch.distributed as dist
        try:
            return str(dist.get_global_rank(self.group, r))
        except Exception:  # a group torch no longer maps (destroyed): its own rank
            return str(r)
