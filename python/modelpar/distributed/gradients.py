"""Gradient clipping and loss scaling for a model whose gradients are split
over ranks (GradScaler at the end).

Over a process group (``devices="world"``) each gradient lives on one rank
only, the home of its parameter (Note [One home per parameter] in
distributed/homes.py): ``torch.nn.utils.clip_grad_norm_`` on a rank would see that
rank's share of the gradients, compute a norm of its own and scale by it, so
every rank clips differently and training leaves eager's path.
``modelpar.clip_grad_norm_`` takes every rank's share into the one norm of the
whole model's gradient: each rank computes its own gradients' ``sum |g|^p``
(``max |g|`` for the inf norm), the group adds them up (or takes the max), and
every rank scales its gradients by the same ``max_norm / (norm + 1e-6)``,
exactly what ``torch.nn.utils.clip_grad_norm_`` does in one process. A
parameter counts on its home rank only (the rank 0 for one no compiled step
takes), so a gradient is never counted twice.

In one process (one device, or several logical devices of one process) every
gradient is local and it is ``torch.nn.utils.clip_grad_norm_``.

Example (every rank calls it, between backward and the optimizer step)::

    loss = step(x, y)
    loss.backward()
    norm = modelpar.clip_grad_norm_(model, max_norm=1.0)   # the same on every rank
    opt.step()
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

import torch

from ..errors import ConfigError

__all__ = ["clip_grad_norm_", "GradScaler"]


def _parameters(parameters: Any) -> list[torch.Tensor]:
    if isinstance(parameters, torch.nn.Module):
        return list(parameters.parameters())
    if isinstance(parameters, torch.Tensor):
        return [parameters]
    if not isinstance(parameters, Iterable):
        raise ConfigError("modelpar clip_grad_norm_: expected a module, a tensor or an iterable "
                          f"of tensors, got {type(parameters).__name__}")
    out = list(parameters)
    for p in out:
        if not isinstance(p, torch.Tensor):
            raise ConfigError("modelpar clip_grad_norm_: expected tensors, got "
                              f"{type(p).__name__}")
    return out


def _over_ranks(params: list[torch.Tensor]) -> bool:
    """Whether a compiled step binds any of ``params`` over a process group."""
    from .homes import home_rank
    return any(home_rank(p) is not None for p in params)


def clip_grad_norm_(parameters: Any, max_norm: float, norm_type: float = 2.0,
                    error_if_nonfinite: bool = False, foreach: bool | None = None, *,
                    process_group: Any = None, timeout_s: float = 30.0) -> torch.Tensor:
    """Clips the gradients of ``parameters`` (a module, a tensor or an
    iterable of tensors) in place to a total ``norm_type`` norm of at most
    ``max_norm``, the norm taken over every rank's gradients when a compiled
    step binds them over a process group (see the module docstring), and
    returns that total norm (a 0-d tensor, the same on every rank). The
    arguments are ``torch.nn.utils.clip_grad_norm_``'s; over ranks every rank
    of the group must call it.

    Raises:
        ConfigError: parameters that are not tensors; ``max_norm`` or
            ``norm_type`` not a number.
        RuntimeError: with ``error_if_nonfinite``, a total norm that is nan
            or inf (on every rank), as torch's does.
        ExecutionError: the group did not complete the sum within
            ``timeout_s`` (a rank did not call it, or died).
    """
    params = _parameters(parameters)
    for name, value in (("max_norm", max_norm), ("norm_type", norm_type)):
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            raise ConfigError(f"modelpar clip_grad_norm_: {name} must be a number, got "
                              f"{value!r}")
    if not _over_ranks(params):
        return torch.nn.utils.clip_grad_norm_(params, max_norm, norm_type, error_if_nonfinite,
                                              foreach)
    import torch.distributed as dist

    from .groups import wait_for, group_of, wire_device
    from .state_dict import home_of
    group = group_of(process_group, "modelpar clip_grad_norm_")
    rank = dist.get_rank(group)
    norm_type = float(norm_type)
    mine = [p.grad for p in params if p.grad is not None and home_of(p) == rank]
    wire = wire_device(group)
    if mine:
        local = torch.nn.utils.get_total_norm(mine, norm_type, False, foreach).to(
            wire, torch.float64)
    else:
        local = torch.zeros((), dtype=torch.float64, device=wire)
    inf = norm_type == float("inf")
    # This rank's share: max |g| for the inf norm, sum |g|^p otherwise.
    share = local if inf else local ** norm_type
    op = dist.ReduceOp.MAX if inf else dist.ReduceOp.SUM
    wait_for(dist.all_reduce(share, op=op, group=group, async_op=True), timeout_s,
          "clip_grad_norm_'s sum of the gradient norms over the ranks")
    total = share if inf else share ** (1.0 / norm_type)
    grads = [p.grad for p in params if p.grad is not None]
    out_device = grads[0].device if grads else wire
    dtype = grads[0].dtype if grads else torch.float32
    total = total.to(out_device, dtype)
    if error_if_nonfinite and not bool(torch.isfinite(total)):
        raise RuntimeError(
            f"The total norm of order {norm_type} for gradients from `parameters` is "
            "non-finite, so it cannot be clipped. To disable this error and scale the "
            "gradients by the non-finite norm anyway, set `error_if_nonfinite=False`")
    if grads:
        torch.nn.utils.clip_grads_with_norm_([p for p in params if p.grad is not None],
                                             max_norm, total, foreach)
    return total


class GradScaler(torch.amp.GradScaler):
    """``torch.amp.GradScaler`` for a model whose gradients are split over
    ranks: the check for inf / nan gradients covers every rank's.

    A scaler skips the optimizer step and backs off its scale when any
    gradient overflowed. Over a process group each rank holds only its own
    parameters' gradients, so torch's scaler would decide per rank: the rank
    whose gradient overflowed skips the step and halves its scale, the
    others step and keep theirs, and the ranks leave eager's path for good.
    This one all-reduces the found-inf flag in ``unscale_`` (which ``step``
    calls), so every rank skips or steps alike and keeps the same scale;
    every rank of the group must call ``step`` (or ``unscale_``) together.
    In one process it is torch's. Arguments are torch's, plus
    ``process_group`` (default: the default group) and ``timeout_s``.

    Raises (from ``unscale_`` / ``step``):
        ExecutionError: the group did not complete the all-reduce within
            ``timeout_s``.
    """

    def __init__(self, device: str = "cuda", init_scale: float = 2.0 ** 16,
                 growth_factor: float = 2.0, backoff_factor: float = 0.5,
                 growth_interval: int = 2000, enabled: bool = True, *,
                 process_group: Any = None, timeout_s: float = 30.0) -> None:
        super().__init__(device, init_scale=init_scale, growth_factor=growth_factor,
                         backoff_factor=backoff_factor, growth_interval=growth_interval,
                         enabled=enabled)
        self._modelpar_group = process_group
        self._modelpar_timeout_s = timeout_s

    def unscale_(self, optimizer: torch.optim.Optimizer) -> None:
        super().unscale_(optimizer)
        if not self._enabled:
            return
        if not _over_ranks([p for g in optimizer.param_groups for p in g["params"]]):
            return
        import torch.distributed as dist

        from .groups import wait_for, group_of, wire_device
        group = group_of(self._modelpar_group, "modelpar GradScaler")
        found = self._per_optimizer_states[id(optimizer)]["found_inf_per_device"]
        flag = torch.zeros((), dtype=torch.float32, device=wire_device(group))
        for f in found.values():
            flag = torch.maximum(flag, f.to(flag.device, torch.float32))
        wait_for(dist.all_reduce(flag, op=dist.ReduceOp.MAX, group=group, async_op=True),
              self._modelpar_timeout_s, "GradScaler's inf check over the ranks")
        # Every device of this rank's gradients, and the scale's (update()
        # needs at least one check on a rank that holds no gradient), sees it.
        if self._scale is not None and self._scale.device not in found:
            found[self._scale.device] = torch.zeros((), dtype=torch.float32,
                                                    device=self._scale.device)
        for device in list(found):
            found[device] = flag.to(device)
