"""Every rank must run the same plan: :func:`check_same_plan` all-gathers a
hash of each rank's program and names the ranks that differ."""

from __future__ import annotations

import hashlib
import re
from typing import Any

import torch

from ..errors import ConfigError
from .groups import outside_tracing, wait_for, wire_device

__all__ = ["check_same_plan"]


def check_same_plan(program_text: str, group: Any, what: str, timeout_s: float) -> None:
    """All-gathers a hash of ``program_text`` over ``group``.

    Raises:
        ConfigError: ranks planned differently; the message lists which ranks
            agree with which.
        ExecutionError: a rank did not take part within ``timeout_s``.
    """
    with outside_tracing():  # Note [Collectives outside the tracer's dispatch]
        _check_same_plan(program_text, group, what, timeout_s)


def _check_same_plan(program_text: str, group: Any, what: str, timeout_s: float) -> None:
    import torch.distributed as dist
    # The graph's name counts the functions this process compiled before
    # (`_lambda__1`), which may differ between ranks; the plan is the rest.
    text = re.sub(r"graph @[^(\s]*\(", "graph @step(", program_text, count=1)
    digest = hashlib.sha256(text.encode()).digest()
    wire = wire_device(group)
    mine = torch.tensor([int.from_bytes(digest[:7], "little")], dtype=torch.int64, device=wire)
    size = dist.get_world_size(group)
    everyone = [torch.zeros(1, dtype=torch.int64, device=wire) for _ in range(size)]
    wait_for(dist.all_gather(everyone, mine, group=group, async_op=True), timeout_s,
          f"the plan check of {what} (an all-gather of each rank's plan hash)")
    hashes = [int(t.item()) for t in everyone]
    if len(set(hashes)) == 1:
        return
    groups: dict[int, list[int]] = {}
    for r, h in enumerate(hashes):
        groups.setdefault(h, []).append(r)
    me = dist.get_rank(group)
    parts = "; ".join(f"ranks {', '.join(map(str, rs))} have plan {h:014x}"
                      for h, rs in groups.items())
    raise ConfigError(f"modelpar distributed: the ranks planned {what} differently ({parts}; "
                      f"this is rank {me}); every rank must compile the same model with the same "
                      "options and input shapes")
