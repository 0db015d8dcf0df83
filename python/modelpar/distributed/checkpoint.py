"""Checkpoints of a model trained over ranks, in torch.distributed.checkpoint
(DCP) format: :func:`save` and :func:`load`.

Each parameter, buffer and optimizer state is current on its home rank only
(Note [One home per parameter] in homes.py); the other ranks' copies are
stale, or released (``release_unowned``). So each rank hands DCP only the
entries whose current copy it holds (Note [Saved from home]); DCP writes
each once (replicas of a mesh's dp dimension hold equal copies, and DCP
keeps one) and the checkpoint is a plain DCP checkpoint of flat keys,
``model/<name>``, ``optimizer/<name>/<state key>`` and
``optimizer/param_groups/<i>/<key>`` (the groups' ``params`` as names),
which loads into any layout: another mesh, one
process (no process group: DCP's ``no_dist``), or an eager model.

Example (every rank calls both)::

    modelpar.distributed.checkpoint.save(model, opt, f"ckpt/step{step}")
    ...
    modelpar.distributed.checkpoint.load(model, opt, "ckpt/step100")  # before the first step
"""

from __future__ import annotations

import os
from typing import Any

import torch

from ..errors import ConfigError

__all__ = ["save", "load", "state_to_save"]

MODEL = "model/"
OPTIMIZER = "optimizer/"
PARAM_GROUPS = "optimizer/param_groups/"


# Note [Saved from home]: a rank's copy of a tensor is current when its
# compiled steps read it, or when no rank's steps do (homes.read_here: a
# training step binds a parameter on its home rank only, and moves it there
# for the graphs that read it elsewhere). The optimizer holds state only for
# parameters that got a gradient here, which are the ones at home. So
# state_to_save takes exactly those: the union over the ranks covers the
# model, and no stale or released copy is ever written. A tensor every rank
# holds (no step took it) is handed over by every rank; DCP's planner writes
# one copy.


def _check(model: Any, optimizer: Any) -> None:
    if not isinstance(model, torch.nn.Module):
        raise ConfigError(f"modelpar checkpoint: expected a torch.nn.Module, got "
                          f"{type(model).__name__}")
    if optimizer is not None and not isinstance(optimizer, torch.optim.Optimizer):
        raise ConfigError(f"modelpar checkpoint: expected a torch.optim.Optimizer or None, got "
                          f"{type(optimizer).__name__}")


def _names(model: torch.nn.Module) -> dict[int, str]:
    """id(parameter) -> its first name in the model (a tied weight: once)."""
    return {id(p): n for n, p in model.named_parameters()}


def state_to_save(model: torch.nn.Module, optimizer: Any = None) -> dict[str, Any]:
    """The flat DCP state dict this rank writes (Note [Saved from home]).

    Raises:
        ConfigError: not a module or optimizer; an optimizer over tensors
            that are not the model's parameters.
    """
    from .homes import read_here
    _check(model, optimizer)
    state: dict[str, Any] = {}
    for name, t in model.state_dict(keep_vars=True).items():
        if isinstance(t, torch.Tensor) and read_here(t):
            state[MODEL + name] = t.detach()
    if optimizer is None:
        return state
    names = _names(model)
    groups = []
    for group in optimizer.param_groups:
        missing = [tuple(p.shape) for p in group["params"] if id(p) not in names]
        if missing:
            raise ConfigError(f"modelpar checkpoint: the optimizer updates tensors that are not "
                              f"parameters of the model (shapes {missing[:4]}); give the optimizer "
                              "of this model")
        for key, value in group.items():
            state[f"{PARAM_GROUPS}{len(groups)}/{key}"] = (
                [names[id(p)] for p in value] if key == "params" else value)
        groups.append(group)
    for p, values in optimizer.state.items():
        if id(p) not in names or not read_here(p):
            continue
        for key, value in values.items():
            state[f"{OPTIMIZER}{names[id(p)]}/{key}"] = (
                value.detach() if isinstance(value, torch.Tensor) else value)
    return state


def _distributed() -> bool:
    import torch.distributed as dist
    return dist.is_available() and dist.is_initialized()


def save(model: torch.nn.Module, optimizer: Any, path: str | os.PathLike) -> None:
    """Writes the model's (and ``optimizer``'s, unless None) state to the
    folder ``path`` in DCP format, each entry from the rank whose copy is
    current. Under a process group every rank of the default group must call
    it; without one it saves this process's model.

    Raises:
        ConfigError: not a module or optimizer.
    """
    import torch.distributed.checkpoint as dcp
    state = state_to_save(model, optimizer)
    # DCP's default writer copies tensors ahead through the device module of
    # the PrivateUse1 backend when one is registered, which modelpar's
    # device is (torch.modelpar has no streams): the serial loader instead
    # (per_thread_copy_ahead=0), which copies each tensor as it writes it.
    writer = dcp.FileSystemWriter(os.fspath(path), per_thread_copy_ahead=0)
    dcp.save(state, storage_writer=writer, no_dist=not _distributed())


def load(model: torch.nn.Module, optimizer: Any, path: str | os.PathLike) -> None:
    """Reads the checkpoint at ``path`` (written by :func:`save` in any
    layout) into ``model`` (in place) and ``optimizer`` (its
    ``load_state_dict``), on every rank: call it before the first compiled
    step, on every rank of the default group (or in one process).

    Raises:
        ConfigError: not a module or optimizer; the checkpoint lacks an entry
            of the model or of the optimizer's parameters (named), or holds
            one of another shape.
    """
    import torch.distributed.checkpoint as dcp
    from torch.distributed.checkpoint.metadata import TensorStorageMetadata
    from .homes import read_here
    _check(model, optimizer)
    path = os.fspath(path)
    try:
        metadata = dcp.FileSystemReader(path).read_metadata()
    except (OSError, FileNotFoundError) as e:
        raise ConfigError(f"modelpar checkpoint: cannot read a DCP checkpoint at {path!r}: "
                          f"{e}") from e
    saved = metadata.state_dict_metadata
    state: dict[str, Any] = {}
    for name, t in model.state_dict(keep_vars=True).items():
        if not isinstance(t, torch.Tensor):
            continue
        key = MODEL + name
        meta = saved.get(key)
        if not isinstance(meta, TensorStorageMetadata):
            raise ConfigError(f"modelpar checkpoint: {path!r} has no tensor {name!r} of the model "
                              f"(it has {sum(k.startswith(MODEL) for k in saved)} model entries); "
                              "load a checkpoint of the same model")
        if tuple(meta.size) != tuple(t.shape):
            raise ConfigError(f"modelpar checkpoint: {name!r} has shape {tuple(meta.size)} in "
                              f"{path!r} but {tuple(t.shape)} in the model")
        # A released tensor (release_unowned) is read into a scratch copy and
        # dropped: every rank asks DCP for the same keys.
        state[key] = t.detach() if read_here(t) else torch.empty(t.shape, dtype=t.dtype)
    names = _names(model)
    if optimizer is not None:
        for key, meta in saved.items():
            if not key.startswith(OPTIMIZER):
                continue
            if isinstance(meta, TensorStorageMetadata):
                state[key] = torch.empty(tuple(meta.size), dtype=meta.properties.dtype)
            else:
                state[key] = None  # an object: DCP puts it in place
        if not any(k.startswith(PARAM_GROUPS) for k in state):
            raise ConfigError(f"modelpar checkpoint: {path!r} holds no optimizer state; pass "
                              "optimizer=None to load the model alone")
    dcp.load(state, checkpoint_id=path, no_dist=not _distributed())
    if optimizer is None:
        return
    index = {names[id(p)]: i for i, p in enumerate(
        p for group in optimizer.param_groups for p in group["params"]) if id(p) in names}
    by_index: dict[int, dict[str, Any]] = {}
    for key, value in state.items():
        if key.startswith(PARAM_GROUPS):
            i, _, field = key[len(PARAM_GROUPS):].partition("/")
            by_index.setdefault(int(i), {})[field] = value
    groups = [by_index[i] for i in sorted(by_index)]
    for group in groups:
        unknown = [n for n in group["params"] if n not in index]
        if unknown:
            raise ConfigError(f"modelpar checkpoint: the optimizer in {path!r} updates "
                              f"{unknown[:4]}, which this optimizer does not; build the optimizer "
                              "over the same parameters")
        group["params"] = [index[n] for n in group["params"]]
    per_param: dict[int, dict[str, Any]] = {}
    for key, value in state.items():
        if not key.startswith(OPTIMIZER) or key.startswith(PARAM_GROUPS):
            continue
        name, _, field = key[len(OPTIMIZER):].rpartition("/")
        if name in index:
            per_param.setdefault(index[name], {})[field] = value
    optimizer.load_state_dict({"state": per_param, "param_groups": groups})
