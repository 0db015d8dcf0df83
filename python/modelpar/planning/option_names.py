"""The planning options' valid values, read from C++ (``passes/option_names.h``
through ``modelpar._C.option_names()``): one definition for C++ and Python,
so both accept and refuse the same values with the same words.

Example::

    from .option_names import PLACERS, check_devices
    PLACERS                       # ('m-topo', 'm-etf', 'm-sct')
    check_devices("options", 0)   # ConfigError: ... devices takes an int from 1 to 64
"""

from __future__ import annotations

from typing import Any

from .. import _C
from ..errors import ConfigError

__all__ = ["PLACERS", "PIPELINE_SCHEDULES", "PARTITION_METHODS", "CHECKPOINT_MODES",
           "BATCH_NORM_MODES", "LOSS_REDUCTIONS", "STRATEGIES", "DEVICE_WORDS", "MAX_DEVICES", "KERNELS",
           "check_one_of", "check_devices"]

# A build without passes/ (MODELPAR_WITH_PASSES=OFF) has no names: every
# planning option is then refused (planning/placement.py says why).
_NAMES: dict[str, Any] = dict(_C.option_names()) if hasattr(_C, "option_names") else {}

PLACERS: tuple[str, ...] = tuple(_NAMES.get("placer", ()))
PIPELINE_SCHEDULES: tuple[str, ...] = tuple(_NAMES.get("schedule", ()))
PARTITION_METHODS: tuple[str, ...] = tuple(_NAMES.get("partition", ()))
CHECKPOINT_MODES: tuple[str, ...] = tuple(_NAMES.get("checkpoint", ()))
BATCH_NORM_MODES: tuple[str, ...] = tuple(_NAMES.get("batch_norm", ()))
LOSS_REDUCTIONS: tuple[str, ...] = tuple(_NAMES.get("loss_reduction", ()))
STRATEGIES: tuple[str, ...] = tuple(_NAMES.get("strategy", ()))
#: Words ``devices`` takes besides a count: ``"world"`` (one device per rank).
DEVICE_WORDS: tuple[str, ...] = tuple(_NAMES.get("devices", ()))
MAX_DEVICES: int = int(_NAMES.get("max_devices", 64))
#: What runs each device's operators (Note [Kernel regions], kernels/regions.py);
#: Python-only: no C++ pass reads it.
KERNELS: tuple[str, ...] = ("aten", "inductor")


def check_one_of(who: str, option: str, value: Any) -> None:
    """ConfigError unless ``value`` is a valid value of ``option`` ("placer",
    "schedule", "partition", "checkpoint", "batch_norm", "loss_reduction"),
    worded as passes/ words it (a renamed value names its new name)."""
    if isinstance(value, str) and hasattr(_C, "check_option"):
        _C.check_option(who, option, value)
        return
    valid = tuple(_NAMES.get(option, ()))
    if value not in valid:
        raise ConfigError(f"modelpar {who}: {option}={value!r} is not valid; {option} takes one "
                          f"of " + ", ".join(repr(v) for v in valid))


def check_devices(who: str, devices: Any) -> None:
    """ConfigError unless ``devices`` is an int from 1 to MAX_DEVICES (the rule of
    passes/option_names.h's checkDevices)."""
    if isinstance(devices, bool) or not isinstance(devices, int) or not 1 <= devices <= MAX_DEVICES:
        raise ConfigError(f"modelpar {who}: devices={devices!r} is not valid; devices takes an "
                          f"int from 1 to {MAX_DEVICES}")
