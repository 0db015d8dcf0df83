"""The process group modelpar plans over and the small calls every rank
makes on it: finding the group (:func:`group_of`), waiting for a c10d work
item with a deadline (:func:`wait_for`), lifting the tracer's modes around a
collective (:func:`outside_tracing`), the device the backend carries tensors
on (:func:`wire_device`) and whether it can carry the step's tensors
(:func:`check_backend`)."""

from __future__ import annotations

from collections.abc import Sequence
from datetime import timedelta
from typing import Any

import torch

from ..errors import ConfigError, ExecutionError
from ..runtime.tracing_state import outside_tracing

__all__ = ["WORLD", "group_of", "wait_for", "outside_tracing", "wire_device", "check_backend"]

#: The ``devices`` value that means "one device per rank of the group".
WORLD = "world"


def group_of(process_group: Any, who: str = "modelpar options: devices='world'") -> Any:
    """``process_group``, or the default group when None; ``who`` starts
    the error messages.

    Raises:
        ConfigError: torch.distributed is not available or not initialised,
            or ``process_group`` is not a ProcessGroup.
    """
    import torch.distributed as dist
    if not dist.is_available():
        raise ConfigError(f"{who} needs torch.distributed, which this build of PyTorch lacks")
    if not dist.is_initialized():
        raise ConfigError(f"{who} needs an initialised process group; "
                          "call torch.distributed.init_process_group('gloo') (or 'nccl') first, "
                          "or launch with torchrun, which sets the environment it reads")
    if process_group is None:
        return dist.distributed_c10d._get_default_group()
    if not isinstance(process_group, dist.ProcessGroup):
        raise ConfigError(f"modelpar options: process_group={process_group!r} is not valid; "
                          "process_group takes a torch.distributed ProcessGroup or None (the "
                          "default group)")
    return process_group


def wait_for(work: Any, timeout_s: float, what: str) -> None:
    """Waits for the c10d ``work`` at most ``timeout_s`` seconds.

    Raises:
        ExecutionError: it failed (a peer died) or did not complete in time;
            the message names ``what`` was awaited.
    """
    try:
        if not work.wait(timedelta(seconds=timeout_s)):
            raise ExecutionError(f"modelpar: {what} did not complete within {timeout_s:g} s")
    except ExecutionError:
        raise
    except Exception as e:  # c10d's errors: a peer died or timed out
        raise ExecutionError(f"modelpar: {what} failed within the {timeout_s:g} s timeout: "
                             f"{e}") from e


def wire_device(group: Any) -> torch.device:
    """Where the group's backend carries tensors: this rank's current GPU
    for NCCL, else the CPU."""
    import torch.distributed as dist
    if dist.get_backend(group) == "nccl":
        return torch.device("cuda", torch.cuda.current_device())
    return torch.device("cpu")


def check_backend(group: Any, example_inputs: Sequence[Any]) -> str:
    """The device the rank's tensors live on (``"cpu"`` or ``"cuda:K"``).

    Raises:
        ConfigError: the group's backend cannot carry those tensors (CUDA
            tensors on a Gloo group, CPU tensors on an NCCL group), or they
            mix CPU and CUDA.
    """
    import torch.distributed as dist
    backend = str(dist.get_backend(group)).lower()
    kinds = sorted({t.device.type for t in example_inputs if isinstance(t, torch.Tensor)})
    if len(kinds) > 1:
        raise ConfigError(f"modelpar distributed: the compiled function's tensors are on "
                          f"{' and '.join(kinds)}; put the model and inputs of each rank on one "
                          "device (cpu with Gloo, the rank's GPU with NCCL)")
    kind = kinds[0] if kinds else "cpu"
    carries = {"gloo": {"cpu"}, "nccl": {"cuda"}}
    known = [b for b in carries if b in backend]
    if known and not any(kind in carries[b] for b in known):
        want = "cuda (the rank's GPU)" if "nccl" in backend else "cpu"
        raise ConfigError(f"modelpar distributed: the process group's backend is {backend!r} but "
                          f"the tensors are on {kind}; with {backend!r} put them on {want}, or "
                          f"create the group with a backend for {kind} "
                          f"({'nccl' if kind == 'cuda' else 'gloo'})")
    if kind == "cuda":
        return f"cuda:{torch.cuda.current_device()}"
    return "cpu"
