"""Where each parameter and buffer lives over the ranks: the rank whose
training step binds it (its home, Note [One home per parameter]), which
tensors this rank reads (Note [Parameters other ranks own]), and
:func:`release_unowned`, which gives back the memory of the rest."""

from __future__ import annotations

import weakref
from collections.abc import Sequence
from typing import Any

import torch

from .. import _C
from ..errors import ExecutionError
from .untouched import untouched_like

__all__ = ["homes_of", "keep_homes", "home_rank", "read_here", "note_inputs", "release_unowned",
           "Planned", "plan_only"]

# (user function) -> parameter or buffer input name -> the rank the training
# step binds it on (Note [One home per parameter]).
_homes: dict[Any, dict[str, int]] = {}


def homes_of(key: Any) -> dict[str, int]:
    """Parameter / buffer input name -> the rank that binds it, as the
    training steps of the user function ``key`` recorded (keep_homes)."""
    return dict(_homes.get(key, {}))


def keep_homes(plan: Any, key: Any, training: bool, gradients_go_home: bool = False) -> Any:
    """The plan to run for ``plan`` (a PlacementPlan or PipelinePlan of the
    user function ``key``). A training step records where its program binds
    each parameter and buffer (its home) and is returned as it is; any other
    graph (an inference graph under no_grad, planned apart) is returned with
    every parameter and buffer it binds elsewhere moved home and sent from
    there, and its step simulated again with those transfers
    (passes/plan_rehome.h; Note [One home per parameter]). With
    ``gradients_go_home`` (a whole step whose executors send each gradient to
    the rank that binds its parameter: compile/pipeline_step.py) a training step
    planned for another batch size moves what already has a home there too,
    and records homes only for the rest. Every rank holds the same plan
    (check_same_plan) and the same homes, so every rank rewrites alike."""
    graph = plan.program.graph
    places = zip(graph.input_names, _C.graph_input_roles(graph), _C.input_devices(plan.program))
    homes = _homes.setdefault(key, {})
    moves = []
    for name, role, device in places:
        if role == "input":
            continue
        home = homes.get(name)
        if training and (home is None or not gradients_go_home):
            homes[name] = device
        elif home is not None and home != device:
            moves.append((name, home))
    return plan.with_inputs_at_home(moves) if moves else plan


# Note [Parameters other ranks own]: the rank executor reads only the inputs
# bound on its own device. Every run notes which tensors it was given as an
# input it reads and which as one it does not; a parameter that only ever
# came as the latter belongs to other ranks, and release_unowned() gives its
# memory back. Identity is the tensor object (AOTAutograd passes the
# module's parameters themselves).
_read_here: dict[int, Any] = {}
_read_elsewhere: dict[int, Any] = {}


_bound_on: dict[int, tuple[Any, int]] = {}  # tensor input -> the rank that binds it


def home_rank(t: Any) -> int | None:
    """The rank whose compiled steps bind ``t`` (a parameter or buffer given
    to them as an input): the rank that updates it (its optimizer, or batch
    norm's running statistics in place), whose copy is current; None when
    no step took ``t`` (every rank's copy is the same)."""
    seen = _bound_on.get(id(t))
    return seen[1] if seen is not None and seen[0]() is t else None

#: Set by materialize(): RankExecutor.run notes its inputs, then raises Planned.
plan_only = False


class Planned(Exception):
    """Raised by RankExecutor.run under ``plan_only`` (distributed/materialize.py)."""


def read_here(t: Any) -> bool:
    """Whether this rank's compiled steps read ``t``, or no rank's do: the
    tensors a rank must hold (Note [Parameters other ranks own])."""
    seen_here = id(t) in _read_here and _read_here[id(t)]() is t
    seen_elsewhere = id(t) in _read_elsewhere and _read_elsewhere[id(t)]() is t
    return seen_here or not seen_elsewhere


def note_inputs(inputs: Sequence[Any], devices: Sequence[int], rank: int,
                 trains: bool = True) -> None:
    """Notes what this run reads (Note [Parameters other ranks own]) and,
    for a graph that ``trains``, where it binds each parameter (its home).

    Raises:
        ExecutionError: a parameter bound on another rank than an earlier
            training graph bound it (Note [One home per parameter]); nothing
            has run yet.
    """
    for t, d in zip(inputs, devices):
        if not isinstance(t, torch.Tensor):
            continue
        (_read_here if d == rank else _read_elsewhere)[id(t)] = weakref.ref(t)
        seen = _bound_on.get(id(t))
        if isinstance(t, torch.nn.Parameter) and seen is not None and seen[0]() is t \
                and seen[1] != d:
            raise ExecutionError(
                f"modelpar distributed: this graph binds a parameter of shape "
                f"{tuple(t.shape)} on rank {d}, but an earlier graph bound it on rank "
                f"{seen[1]}, whose optimizer updates it; rank {d}'s copy is stale, so this "
                "graph would compute with old weights (Note [One home per parameter]). "
                "modelpar moves parameters home for the graphs of the function it trained "
                "(an inference graph under torch.no_grad()), not for another "
                "torch.compile of the model: evaluate through the compiled function you "
                "train with")
        if trains:
            _bound_on[id(t)] = (weakref.ref(t), d)


def release_unowned(module: torch.nn.Module, *, poison: bool = False) -> int:
    """Gives back the memory of the parameters and buffers of ``module``
    that this rank's compiled steps never read (other ranks own them; Note
    [Parameters other ranks own]); call it after the first step. Each keeps
    its shape, dtype and strides (so the compiled code's guards still hold),
    on fresh memory that is never written (Note [Untouched memory] in
    distributed/untouched.py), so resident memory drops by their size. With
    ``poison``, the fresh memory is filled with NaN instead (a test that
    nothing reads it). Returns the bytes released.
    """
    released = 0
    with torch.no_grad():
        for _name, t in [*module.named_parameters(), *module.named_buffers()]:
            if read_here(t):
                continue
            fresh = untouched_like(t)
            if poison:
                fresh.fill_(float("nan"))
            released += t.untyped_storage().nbytes()
            t.data = fresh
    return released


# Note [One home per parameter]: a rank's optimizer updates only the
# parameters whose gradient it gets, those its programs bind; other ranks'
# copies go stale. Every graph compiled over the group must therefore bind a
# parameter on the same rank. The joint forward/backward plan and a
# pipeline's step guarantee it; a graph planned apart (an inference graph
# under no_grad, a pipeline's forward-only partition, which cuts the layers
# elsewhere) may not, and running it as planned would read stale weights.
# keep_homes() moves each such parameter to the rank the training step binds
# it on, at compile time, by input name, on every rank alike (their programs
# are the same): that rank sends it, first thing in the step, to the rank
# that computes with it (passes/lower/rehome_inputs.h), and the plan that
# plans() reports is simulated again with those transfers
# (passes/plan_rehome.h). Training steps planned again keep the homes too:
# a pipelined or searched step at a new batch size (strategy="auto" may
# choose another plan there) is moved the same way, its gradients sent home
# by the rank executor (keep_homes' gradients_go_home, compile/pipeline_step.py),
# and a training step Dynamo compiles again (a dynamic batch at the second
# size) is planned with the earlier plan's layers and homes pinned
# (plan_joint's pinned_layers / pinned_inputs, compile/backend.py), its
# gradients made at home. As a safety net the
# rank executor's wrapper also remembers where each parameter tensor was
# bound by a training graph and refuses a run that binds it elsewhere (a
# graph of another torch.compile of the model, whose training homes are not
# known). Graphs that do not train (inference under no_grad) fix no home:
# until a step trains, no rank's copy is stale, and a model that only
# decodes (model.generate: a graph for the prompt, others for the decode
# steps, each planned apart) may bind a parameter on a different rank in each
# (measured: Mistral's 1F1B decode graphs over 2 ranks had been refused).
