"""modelpar: run an unmodified PyTorch model split over several devices.

The public API is these 30 names (``modelpar.__all__``); everything else is
reached through the subpackage that holds it:

- errors: :class:`Error` and its subclasses (more in :mod:`modelpar.errors`);
- the IR: :class:`Graph`, :class:`Program`, :func:`parse_graph`,
  :func:`parse_program` (files: :mod:`modelpar.ir`);
- running it: :class:`Executor`, :func:`run_graph`, :func:`run_program`
  (:mod:`modelpar.runtime`);
- planning: :func:`plan_graph`, :func:`plan_pipeline`, :func:`search_strategy`,
  :func:`microbatch`, :func:`checkpoint` (:mod:`modelpar.planning`);
- torch.compile: :func:`modelpar_backend` (``torch.compile(model,
  backend="modelpar")`` finds it through the ``torch_dynamo_backends`` entry
  point, without ``import modelpar``), :func:`plans`, :func:`clear_plans`
  (:mod:`modelpar.compile`);
- over ranks: :func:`release_unowned`, :func:`materialize`,
  :func:`owned_state_dict`, :func:`gather_state_dict`, :func:`clip_grad_norm_`,
  :class:`GradScaler` (:mod:`modelpar.distributed`);
- the ``modelpar`` device: :func:`sync`, :func:`attach` (the rest in
  :mod:`modelpar.device`).

Names this module exported before the subpackages (``modelpar.load_graph``,
``modelpar.resolve_options``, ...) still work for one release, with a
``DeprecationWarning`` naming where each lives now."""

from __future__ import annotations

import importlib
import warnings
from typing import Any

import torch  # noqa: F401  (loads libtorch before the extension that links it)

from .errors import (ConfigError, Error, ExecutionError, InvalidIrError, ParseError,
                     PlanDoesNotFitError, UnsupportedOpError)
from .compile.backend import modelpar_backend
from .compile.records import clear_plans, plans
from .device import attach, sync
from .distributed.gradients import GradScaler, clip_grad_norm_
from .distributed.homes import release_unowned
from .distributed.materialize import materialize
from .distributed.state_dict import gather_state_dict, owned_state_dict
from .ir import Graph, Program, parse_graph, parse_program
from .planning.pipeline import checkpoint, microbatch, plan_pipeline
from .planning.placement import plan_graph
from .planning.strategy import search_strategy
from .runtime.executor import Executor
from .runtime.interpreter import run_graph, run_program

__all__ = [
    # errors
    "Error", "ConfigError", "ExecutionError", "InvalidIrError", "ParseError",
    "PlanDoesNotFitError", "UnsupportedOpError",
    # the IR
    "Graph", "Program", "parse_graph", "parse_program",
    # running it
    "Executor", "run_graph", "run_program",
    # planning
    "plan_graph", "plan_pipeline", "search_strategy", "microbatch", "checkpoint",
    # torch.compile
    "modelpar_backend", "plans", "clear_plans",
    # over ranks
    "release_unowned", "materialize", "owned_state_dict", "gather_state_dict",
    "clip_grad_norm_", "GradScaler",
    # the modelpar device
    "sync", "attach",
]

# Old top-level name -> the module that holds it now, and its new name after
# a colon where it was renamed (Note [Deprecated names]).
_MOVED = {
    "PeerError": "modelpar.errors", "InternalError": "modelpar.errors",
    "load_graph": "modelpar.ir", "load_program": "modelpar.ir",
    "RuntimeValue": "modelpar.runtime.interpreter",
    "capture_issues": "modelpar.runtime.executor:cuda_graph_issues",
    "cuda_devices_built": "modelpar.runtime.executor",
    "CompileOptions": "modelpar.planning.options", "resolve_options": "modelpar.planning.options",
    "PLACERS": "modelpar.planning.placement",
    "CapturedPlacement": "modelpar.planning.placement:JointPlacement",
    "PlacementPlan": "modelpar.planning.placement", "parse_bytes": "modelpar.planning.placement",
    "plan_joint": "modelpar.planning.placement",
    "CHECKPOINT_MODES": "modelpar.planning.pipeline",
    "PARTITION_METHODS": "modelpar.planning.pipeline",
    "PIPELINE_SCHEDULES": "modelpar.planning.pipeline",
    "CheckpointResult": "modelpar.planning.pipeline", "PipelinePlan": "modelpar.planning.pipeline",
    "microbatch_sizes": "modelpar.planning.pipeline",
    "STRATEGIES": "modelpar.planning.strategy",
    "GraphRecord": "modelpar.compile.records", "Plan": "modelpar.compile.records:PlanRecord",
    "materialize_all": "modelpar.distributed.materialize",
    "Materialized": "modelpar.distributed.materialize",
    "clear_device_plans": "modelpar.device", "cmake_prefix_path": "modelpar.device",
    "device_counters": "modelpar.device", "device_options": "modelpar.device",
    "device_plans": "modelpar.device", "last_graph": "modelpar.device",
    "reset_device_counters": "modelpar.device", "scope": "modelpar.device",
    "set_device_options": "modelpar.device",
}


# Note [Deprecated names]: the public surface shrank to __all__ when the
# package moved into subpackages. Code written against the old names keeps
# working for one release: a module-level __getattr__ (PEP 562) finds the
# name where it lives now and warns once per name with the new spelling.
# Names that meant two things were renamed in the same release (a record of
# a plan is `PlanRecord`, not `Plan`; CUDA graphs are recorded, not
# "captured": `cuda_graph_issues`; the placement of a joint forward and
# backward is `JointPlacement`); their modules answer the old names the same
# way (modelpar/deprecation.py).
def __getattr__(name: str) -> Any:
    where = _MOVED.get(name)
    if where is None:
        raise AttributeError(f"module 'modelpar' has no attribute {name!r}")
    module, _, new = where.partition(":")
    new = new or name
    warnings.warn(f"modelpar.{name} is deprecated and will be removed in the next release; "
                  f"use {module}.{new}", DeprecationWarning, stacklevel=2)
    return getattr(importlib.import_module(module), new)
