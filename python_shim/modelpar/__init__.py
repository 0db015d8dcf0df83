"""modelpar: run an unmodified PyTorch model split over several devices.

The public API is re-exported here: the IR (Graph, Program, parsing), the
reference interpreters, the exception classes, model-parallel planning
(``plan_graph``, ``Plan.place``), the pipeline rewrites
(``microbatch``, ``checkpoint``), and the torch.compile backend
(``torch.compile(model, backend="modelpar")`` finds it through the
``torch_dynamo_backends`` entry point, without ``import modelpar``)."""

from __future__ import annotations

import torch  # noqa: F401  (loads libtorch before the extension that links it)

from .errors import (
    ConfigError,
    Error,
    ExecutionError,
    PeerError,
    InternalError,
    InvalidIrError,
    ParseError,
    PlanDoesNotFitError,
    UnsupportedOpError,
)
from .compile_backend import modelpar_backend
from .device import (
    attach,
    clear_device_plans,
    cmake_prefix_path,
    device_counters,
    device_options,
    device_plans,
    last_graph,
    reset_device_counters,
    scope,
    set_device_options,
    sync,
)
from .executor import Executor, capture_issues, cuda_devices_built
from .interpreter import RuntimeValue, run_graph, run_program
from .ir import Graph, Program, load_graph, load_program, parse_graph, parse_program
from .options import CompileOptions, resolve_options
from .distributed import release_unowned
from .materialize import Materialized, materialize, materialize_all
from .state_dict import gather_state_dict, owned_state_dict
from .rank_gradients import GradScaler, clip_grad_norm_
from .pipeline_passes import (
    CHECKPOINT_MODES,
    PARTITION_METHODS,
    PIPELINE_SCHEDULES,
    CheckpointResult,
    PipelinePlan,
    checkpoint,
    microbatch,
    microbatch_sizes,
    plan_pipeline,
)
from .plan import GraphRecord, Plan, clear_plans, plans
from .planning import (
    PLACERS,
    CapturedPlacement,
    PlacementPlan,
    parse_bytes,
    plan_graph,
    plan_joint,
)
from .strategy import STRATEGIES, search_strategy

__all__ = [
    "STRATEGIES",
    "search_strategy",
    "CHECKPOINT_MODES",
    "CapturedPlacement",
    "CheckpointResult",
    "CompileOptions",
    "ConfigError",
    "Error",
    "ExecutionError",
    "PeerError",
    "Executor",
    "Graph",
    "GraphRecord",
    "InternalError",
    "InvalidIrError",
    "PLACERS",
    "ParseError",
    "PlacementPlan",
    "Plan",
    "PlanDoesNotFitError",
    "Program",
    "RuntimeValue",
    "UnsupportedOpError",
    "attach",
    "capture_issues",
    "clear_device_plans",
    "clear_plans",
    "checkpoint",
    "cmake_prefix_path",
    "cuda_devices_built",
    "device_counters",
    "device_options",
    "device_plans",
    "last_graph",
    "load_graph",
    "load_program",
    "microbatch",
    "microbatch_sizes",
    "plan_pipeline",
    "PipelinePlan",
    "PIPELINE_SCHEDULES",
    "PARTITION_METHODS",
    "modelpar_backend",
    "parse_bytes",
    "parse_graph",
    "parse_program",
    "plan_graph",
    "plan_joint",
    "plans",
    "reset_device_counters",
    "resolve_options",
    "release_unowned",
    "Materialized",
    "materialize",
    "materialize_all",
    "gather_state_dict",
    "clip_grad_norm_",
    "GradScaler",
    "owned_state_dict",
    "run_graph",
    "run_program",
    "scope",
    "set_device_options",
    "sync",
]
