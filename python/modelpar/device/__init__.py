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
    modelpar.device.device_counters()["captures"]   # 1: later steps were replays

:func:`configure` takes torch.compile's planning options (``devices``,
``device_map``, ``placer``, ``memory``): with ``devices=N`` every step is
placed over N CPU worker devices and replayed there; :func:`plans` prints
each cached plan's summary.

The C++ side lives in libmodelpar.so (backend/), which ``modelpar._C`` loads;
this module renames PyTorch's PrivateUse1 backend to ``modelpar`` for Python
and adds the ``Tensor.modelpar()`` family of methods.
"""

from __future__ import annotations

import contextlib
import os
import types
import warnings
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Iterator

import torch

from .. import _C
from ..deprecation import renamed_names

#: Pass as ``CMAKE_PREFIX_PATH`` so that a LibTorch project's
#: ``find_package(modelpar)`` finds the ``modelpar::modelpar`` target. The
#: CMake package config lives at the package root (``modelpar/share/cmake``),
#: one folder above this subpackage.
cmake_prefix_path: str = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))),
                                      "share", "cmake")

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
    they cannot be captured), ``ops_recorded`` and ``evictions`` (cached plans
    dropped for ``max_plans``)."""
    return dict(_C._device_counters())


def reset_device_counters() -> None:
    _C._device_reset_counters()


#: The keys of :func:`configure` that mean what they mean for ``torch.compile``
#: (checked by planning/options.py's resolve_options, with its words and errors).
_COMPILE_KEYS = ("strict", "devices", "device_map", "placer", "memory", "pipeline")
#: The keys only the device has, with their defaults.
_DEVICE_DEFAULTS: dict[str, Any] = {"warn_on_graph_break": True, "cache": True, "max_plans": 8}
CONFIGURE_KEYS = _COMPILE_KEYS + tuple(_DEVICE_DEFAULTS)


def configure(**options: Any) -> None:
    """Sets how the device captures and runs steps; keys not given take their
    defaults. The planning keys are ``torch.compile``'s (planning/options.py),
    with the same values, checks and errors:

    ``devices`` (1..64, default 1): with N >= 2 every captured step is placed
    over N logical devices (passes' planPlacement: forward, backward and
    optimizer update as one graph) and run by the multi-device Executor;
    ``device_map`` (None/``"cpu"``: one CPU worker thread per device,
    ``"cuda"``, ``"cuda:K"``, or a list of ``"cuda:K"``); ``placer``
    (``"m-topo"``, ``"m-etf"``, ``"m-sct"``; None: m-etf; needs devices > 1);
    ``memory`` (bytes per device, int or ``"16GiB"``: the plan must fit;
    plans even on one device); ``pipeline`` (torch.compile's dict:
    ``microbatches``, ``schedule``, ``partition``, ``checkpoint``,
    ``portals``, ``batch_norm``, ``allow_random``, ``loss_reduction``, plus
    ``batched_inputs``: the names of the inputs whose dim 0 is the batch;
    by default every data input whose leading size they all share): each
    step is micro-batched, cut into stages over ``devices`` and scheduled,
    and its first run is checked against the unpipelined step; ``strict``.
    Device keys: ``warn_on_graph_break`` (True), ``cache`` (True: replay
    identical steps), ``max_plans`` (8: cached plans kept, least recently used
    dropped first, counted as ``evictions``).

    Changing a planning key drops the cached plans (the next step plans again).
    Enables the device name (:func:`enable`).

    Raises:
        ConfigError: an unknown key or a bad value (the message names it and
            lists the valid ones); nothing is changed then.
    """
    from ..errors import ConfigError
    from ..planning.options import resolve_options

    unknown = sorted(repr(k) for k in options if k not in CONFIGURE_KEYS)
    if unknown:
        raise ConfigError(f"modelpar options: unknown key{'s' if len(unknown) > 1 else ''} "
                          f"{', '.join(unknown)}; valid keys: {', '.join(CONFIGURE_KEYS)}")
    shared = {k: options[k] for k in _COMPILE_KEYS if k in options}
    batched_inputs: list[str] = []
    if isinstance(shared.get("pipeline"), Mapping) and "batched_inputs" in shared["pipeline"]:
        pipeline = dict(shared["pipeline"])
        batched = pipeline.pop("batched_inputs")
        if (isinstance(batched, str) or not isinstance(batched, Sequence)
                or not all(isinstance(n, str) and n for n in batched)):
            raise ConfigError(f"modelpar options: pipeline['batched_inputs']={batched!r} is not "
                              "valid; batched_inputs takes a list of input names")
        batched_inputs = list(batched)
        shared["pipeline"] = pipeline
    compiled = resolve_options(shared)
    device = {**_DEVICE_DEFAULTS, **{k: options[k] for k in _DEVICE_DEFAULTS if k in options}}
    for key in ("warn_on_graph_break", "cache"):
        if not isinstance(device[key], bool):
            raise ConfigError(f"modelpar options: {key}={device[key]!r} is not valid; {key} takes "
                              "True or False")
    max_plans = device["max_plans"]
    if isinstance(max_plans, bool) or not isinstance(max_plans, int) or max_plans < 1:
        raise ConfigError(f"modelpar options: max_plans={max_plans!r} is not valid; max_plans "
                          "takes an int >= 1")
    device_map = compiled.device_map
    if device_map is None:
        device_map = "cpu"
    elif isinstance(device_map, list):
        device_map = ",".join(device_map)
    pipeline = compiled.pipeline
    if pipeline is not None:
        pipeline = {**pipeline, "batched_inputs": batched_inputs}
    enable()
    _C._device_configure(compiled.strict, device["warn_on_graph_break"], device["cache"],
                         compiled.devices, device_map, compiled.placer or "", compiled.memory,
                         max_plans, pipeline)


def set_device_options(*, strict: bool | None = None, warn_on_graph_break: bool | None = None,
                       cache: bool | None = None) -> None:
    """Sets capture options; ``None`` keeps the current value (the other
    options too; :func:`configure` sets them all).

    ``strict``: an op that cannot be captured (nonzero, unique, masked_select,
    ...) raises RuntimeError instead of running eagerly as a graph break.
    ``warn_on_graph_break``: warn once per op name. ``cache``: replay cached
    plans for identical steps.
    """
    cur = device_options()
    given = {"strict": strict, "warn_on_graph_break": warn_on_graph_break, "cache": cache}
    cur.update({k: v for k, v in given.items() if v is not None})
    if cur["pipeline"] is None:
        del cur["pipeline"]
    configure(**cur)


def device_options() -> dict[str, Any]:
    """The device's options, every key of :func:`configure`."""
    return dict(_C._device_options())


def device_plans() -> list[tuple[str, int]]:
    """The cached plans of the modelpar device: (IR text, steps run), in capture order."""
    return [(p[0], p[1]) for p in _C._device_plans()]


@dataclass(frozen=True)
class DevicePlanRecord:
    """The record of a cached plan of the modelpar device: ``graph`` (IR text), ``runs``
    (steps that ran it) and ``summary``, the layout of ``torch.compile``'s
    ``modelpar.plans()`` (with planning options the placement report:
    devices, simulated step, memory per device); ``print(plan)`` shows it."""
    graph: str
    runs: int
    summary: str

    def __str__(self) -> str:
        return self.summary


def plans() -> list[DevicePlanRecord]:
    """The cached plans of the modelpar device, in capture order (``print``
    one for its summary; ``modelpar::plans()`` in C++)."""
    return [DevicePlanRecord(*p) for p in _C._device_plans()]


def last_plan() -> str:
    """The summary of the plan the last sync ran ("" before the first;
    ``modelpar::lastPlan()`` in C++)."""
    return _C._device_last_plan()


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
    hooks. Returns ``module``. Enables the device name (:func:`enable`)."""
    enable()
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
    # Named, the device is PyTorch's accelerator on a machine without a GPU:
    # torch.utils.checkpoint's recompute then enters autocast for it, which
    # asks its module for the dtypes autocast may use (the CPU ones: a step
    # replays on CPU workers).
    mod.get_amp_supported_dtype = lambda: [torch.bfloat16, torch.float16]  # type: ignore[attr-defined]
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


_enabled = False


def enable() -> None:
    """Names PyTorch's PrivateUse1 backend ``"modelpar"`` and adds the
    ``torch.modelpar`` module and ``Tensor.modelpar()`` methods, after which
    ``x.to("modelpar")`` works. Idempotent.

    Importing modelpar does this where no GPU is visible. Where one is, it
    waits for this call (or :func:`configure` / :func:`attach`), because a
    named PrivateUse1 backend becomes PyTorch's one accelerator for the whole
    process and from then on the backward of CUDA tensors fails inside
    PyTorch's autograd engine (Note [Naming the device is not free] in
    backend/device.cpp): CUDA models train through
    ``torch.compile(backend="modelpar")``, which needs no device name."""
    global _enabled
    if _enabled:
        return
    if torch.cuda.is_available():
        warnings.warn(
            "modelpar: the modelpar device is now PyTorch's accelerator in this process; "
            "backward of CUDA tensors outside modelpar fails from here on (PyTorch allows "
            "one accelerator per process). Train CUDA models with "
            "torch.compile(model, backend=\"modelpar\") instead.", stacklevel=2)
    torch.utils.rename_privateuse1_backend(DEVICE)
    if not hasattr(torch, DEVICE):
        torch._register_device_module(DEVICE, _torch_device_module())
    if not hasattr(torch.Tensor, DEVICE):
        torch.utils.generate_methods_for_privateuse1_backend()
    _install_printing()
    _enabled = True


def enabled() -> bool:
    """Whether the ``"modelpar"`` device name is registered in this process."""
    return _enabled


# Renamed after 0.1.0 (a record of a plan, as modelpar.compile.records.PlanRecord).
__getattr__ = renamed_names(__name__, {"DevicePlan": "DevicePlanRecord"})


if not torch.cuda.is_available():
    enable()
