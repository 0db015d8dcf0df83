"""The ``modelpar`` device for eager PyTorch programs.

Tensors moved to ``"modelpar"`` are recorded into an IR graph instead of
running op by op; :func:`sync` (or reading a value: ``.item()``, printing,
``.to("cpu")``) runs the recorded step, and an identical next step replays
the plan built for the first. Backward and optimizer steps on modelpar
tensors are recorded too::

    model.to("modelpar")
    modelpar.attach(model)              # names parameters and layers
    for x, y in data:
        opt.zero_grad()
        loss = loss_fn(model(x.to("modelpar")), y.to("modelpar"))
        loss.backward()
        opt.step()
        print(loss.item())              # runs the step
    modelpar.device_counters()["captures"]   # 1: later steps were replays

The C++ side lives in libmodelpar.so (backend/), which ``modelpar._C`` loads;
this module renames PyTorch's PrivateUse1 backend to ``modelpar`` for Python
and adds the ``Tensor.modelpar()`` family of methods.
"""

from __future__ import annotations

import contextlib
import os
import types
from typing import Any, Iterator

import torch

from . import _C

#: Pass as ``CMAKE_PREFIX_PATH`` so that a LibTorch project's
#: ``find_package(modelpar)`` finds the ``modelpar::modelpar`` target.
cmake_prefix_path: str = os.path.join(os.path.dirname(os.path.abspath(__file__)), "share", "cmake")

DEVICE = "modelpar"


def sync() -> None:
    """Runs everything recorded on the modelpar device since the last sync.

    Raises:
        ExecutionError: an operator of the step failed (the message names it).
    """
    _C._device_sync()


def device_counters() -> dict[str, int]:
    """Capture statistics: ``captures`` (graphs built), ``replays`` (steps that
    reused a cached plan), ``syncs``, ``graph_breaks`` (ops run eagerly because
    they cannot be captured) and ``ops_recorded``."""
    return dict(_C._device_counters())


def reset_device_counters() -> None:
    _C._device_reset_counters()


def set_device_options(*, strict: bool | None = None, warn_on_graph_break: bool | None = None,
                       cache: bool | None = None) -> None:
    """Sets capture options; ``None`` keeps the current value.

    ``strict``: an op that cannot be captured (nonzero, unique, masked_select,
    ...) raises RuntimeError instead of running eagerly as a graph break.
    ``warn_on_graph_break``: warn once per op name. ``cache``: replay cached
    plans for identical steps.
    """
    cur = _C._device_options()
    _C._device_set_options(cur[0] if strict is None else strict,
                           cur[1] if warn_on_graph_break is None else warn_on_graph_break,
                           cur[2] if cache is None else cache)


def device_options() -> dict[str, bool]:
    strict, warn, cache = _C._device_options()
    return {"strict": strict, "warn_on_graph_break": warn, "cache": cache}


def device_plans() -> list[tuple[str, int]]:
    """The cached plans of the modelpar device: (IR text, steps run), in capture order."""
    return [tuple(p) for p in _C._device_plans()]


def clear_device_plans() -> None:
    _C._device_clear_plans()


def last_graph() -> str:
    """IR text of the graph the last sync ran."""
    return _C._device_last_graph()


@contextlib.contextmanager
def scope(name: str) -> Iterator[None]:
    """Ops recorded inside are in layer ``name``."""
    _C._device_push_scope(name)
    try:
        yield
    finally:
        _C._device_pop_scope()


def attach(module: torch.nn.Module, prefix: str = "") -> torch.nn.Module:
    """Names ``module``'s parameters and buffers by their paths (graph inputs
    ``%fc.weight``; ops reading them land in layer ``fc``) and adds forward
    hooks so that ops recorded inside a submodule are in its layer. Works
    before or after ``module.to("modelpar")``; calling it again replaces the
    hooks. Returns ``module``."""
    p = f"{prefix}." if prefix else ""
    for name, t in module.named_parameters():
        _C._device_name_tensor(t, p + name, "param")
    for name, t in module.named_buffers():
        _C._device_name_tensor(t, p + name, "buffer")
    for name, sub in module.named_modules():
        for h in getattr(sub, "_modelpar_hooks", ()):
            h.remove()
        if not name and not prefix:
            continue
        full = p + name if name else prefix
        sub._modelpar_hooks = (  # type: ignore[attr-defined]
            sub.register_forward_pre_hook(lambda _m, _a, _n=full: _C._device_push_scope(_n)),
            sub.register_forward_hook(lambda _m, _a, _o: _C._device_pop_scope()),
        )
    return module


def _torch_device_module() -> types.ModuleType:
    """``torch.modelpar``: what PyTorch asks of a device module."""
    mod = types.ModuleType("torch.modelpar")
    mod.is_available = lambda: True  # type: ignore[attr-defined]
    mod.device_count = lambda: 1  # type: ignore[attr-defined]
    mod.current_device = lambda: 0  # type: ignore[attr-defined]
    mod.set_device = lambda device: None  # type: ignore[attr-defined]
    mod.is_initialized = lambda: True  # type: ignore[attr-defined]
    mod.synchronize = lambda device=None: sync()  # type: ignore[attr-defined]
    # Random ops run on the CPU when a step is replayed: torch.manual_seed
    # seeds them already; these keep PyTorch from warning that it cannot.
    mod._is_in_bad_fork = lambda: False  # type: ignore[attr-defined]
    mod.manual_seed = lambda seed: None  # type: ignore[attr-defined]
    mod.manual_seed_all = lambda seed: None  # type: ignore[attr-defined]
    mod.sync = sync  # type: ignore[attr-defined]
    return mod


def _install_printing() -> None:
    # Printing formats a tensor with tensor ops (masked_select among them);
    # for modelpar tensors, format the materialised CPU copy instead.
    import torch._tensor_str as ts

    if getattr(ts._tensor_str, "_modelpar", False):
        return
    original = ts._tensor_str

    def _tensor_str(self: torch.Tensor, indent: int) -> Any:
        if self.device.type == DEVICE:
            self = self.to("cpu")
        return original(self, indent)

    _tensor_str._modelpar = True  # type: ignore[attr-defined]
    ts._tensor_str = _tensor_str


def _register() -> None:
    torch.utils.rename_privateuse1_backend(DEVICE)  # libmodelpar.so already named it
    if not hasattr(torch, DEVICE):
        torch._register_device_module(DEVICE, _torch_device_module())
    if not hasattr(torch.Tensor, DEVICE):
        torch.utils.generate_methods_for_privateuse1_backend()
    _install_printing()


_register()
