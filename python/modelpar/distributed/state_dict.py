"""A model's state over a process group: each parameter and buffer is current
on one rank only, the one whose compiled steps bind it (its optimizer
updates it; batch norm writes its running statistics there). These collect
it for checkpoints.

- ``owned_state_dict(model)``: the entries this rank is home to (and those
  no step takes, identical everywhere, on rank 0 only): a shard each rank
  saves without any communication, for a model no process can hold.
- ``gather_state_dict(model, dst=0)``: the whole ``state_dict()`` on rank
  ``dst``, each entry sent by its home rank (point-to-point on the group),
  an empty dict on the other ranks.

Example (every rank calls it, after training steps)::

    state = modelpar.gather_state_dict(model)          # rank 0: the full state
    if dist.get_rank() == 0:
        torch.save(state, "model.pt")
    torch.save(modelpar.owned_state_dict(model), f"model.rank{dist.get_rank()}.pt")
"""

from __future__ import annotations

from collections import OrderedDict
from typing import Any

import torch

from ..errors import ConfigError, ExecutionError

__all__ = ["owned_state_dict", "gather_state_dict"]


def _entries(module: torch.nn.Module) -> list[tuple[str, torch.Tensor]]:
    if not isinstance(module, torch.nn.Module):
        raise ConfigError(f"modelpar state dict: expected a torch.nn.Module, got "
                          f"{type(module).__name__}")
    return [(n, t) for n, t in module.state_dict(keep_vars=True).items()
            if isinstance(t, torch.Tensor)]


def _group(process_group: Any, who: str) -> tuple[Any, int, int]:
    """The group, this process's rank in it and its size.

    Raises:
        ConfigError: no initialised process group.
    """
    import torch.distributed as dist

    from .groups import group_of
    group = group_of(process_group, f"modelpar {who}")
    return group, dist.get_rank(group), dist.get_world_size(group)


def home_of(t: torch.Tensor) -> int:
    """The rank whose copy of ``t`` is current; 0 for a tensor no step updates."""
    from .homes import home_rank
    home = home_rank(t)
    return 0 if home is None else home


def _current(name: str, t: torch.Tensor, rank: int, who: str) -> torch.Tensor:
    """``t`` as this rank, its home, holds it.

    Raises:
        ExecutionError: this rank released ``t`` (release_unowned): its
            values here are not the model's, and a state dict never returns
            them.
    """
    from .homes import released
    if released(t):
        raise ExecutionError(
            f"modelpar {who}: {name!r} is homed on rank {rank}, but rank {rank} released its "
            "memory (release_unowned), so its values here are gone; this is a modelpar bug "
            "(release_unowned keeps what a rank is home to): please report it, and save "
            "before calling release_unowned meanwhile")
    return t.detach()


def owned_state_dict(module: torch.nn.Module, *, process_group: Any = None
                     ) -> "OrderedDict[str, torch.Tensor]":
    """The entries of ``module.state_dict()`` whose current copy is this
    rank's (detached, on their device); the union over the ranks is the
    whole state, each entry in exactly one shard (a tied weight under each
    of its names).

    Raises:
        ConfigError: not a module, or no initialised process group.
    """
    _, rank, _ = _group(process_group, "owned_state_dict")
    return OrderedDict((n, _current(n, t, rank, "owned_state_dict")) for n, t in _entries(module)
                       if home_of(t) == rank)


def gather_state_dict(module: torch.nn.Module, dst: int = 0, *, process_group: Any = None,
                      timeout_s: float = 30.0) -> "OrderedDict[str, torch.Tensor]":
    """The whole ``module.state_dict()`` on rank ``dst`` of the group (each
    entry a CPU copy of its home rank's), an empty dict on the others.
    Every rank of the group must call it, with the same ``dst``.

    Raises:
        ConfigError: not a module, no initialised group, ``dst`` not a rank.
        ExecutionError: a transfer did not complete within ``timeout_s``
            (a rank did not call it, or died).
    """
    import torch.distributed as dist

    from .groups import wait_for, wire_device
    group, rank, size = _group(process_group, "gather_state_dict")
    if isinstance(dst, bool) or not isinstance(dst, int) or not 0 <= dst < size:
        raise ConfigError(f"modelpar gather_state_dict: dst={dst!r} is not a rank of the "
                          f"group (0 to {size - 1})")
    out: OrderedDict[str, torch.Tensor] = OrderedDict()
    first_of: dict[int, str] = {}  # a tied tensor travels once, under its first name
    for index, (name, t) in enumerate(_entries(module)):
        if id(t) in first_of:
            if rank == dst:
                out[name] = out[first_of[id(t)]]
            continue
        first_of[id(t)] = name
        home = home_of(t)
        if rank == dst and home == dst:
            out[name] = _current(name, t, rank, "gather_state_dict").to("cpu", copy=True)
        elif rank == dst:
            value = torch.empty(t.shape, dtype=t.dtype, device=wire_device(group))
            wait_for(dist.irecv(value, src=dist.get_global_rank(group, home), group=group,
                             tag=index), timeout_s,
                  f"gather_state_dict: receiving {name} from rank {home}")
            out[name] = value.cpu()
        elif rank == home:
            data = _current(name, t, rank, "gather_state_dict").contiguous().to(wire_device(group))
            wait_for(dist.isend(data, dst=dist.get_global_rank(group, dst), group=group,
                             tag=index), timeout_s,
                  f"gather_state_dict: sending {name} to rank {dst}")
    return out
