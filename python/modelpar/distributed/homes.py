"""Where each parameter and buffer lives over the ranks: the rank whose
training step binds it (its home, Note [One home per parameter]), which
tensors this rank reads (Note [Parameters other ranks own]), and
:func:`release_unowned`, which gives back the memory of the rest."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch
from torch.utils.weak import WeakIdKeyDictionary

from .. import _C
from ..errors import ConfigError, ExecutionError
from .untouched import untouched_like

__all__ = ["homes_of", "keep_homes", "home_rank", "read_here", "released", "tracked",
           "note_inputs", "release_unowned", "Planned", "plan_only"]

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
    each parameter and buffer (its home) and is returned as it is (so does
    any graph for the buffers it writes in place and that have no home yet);
    any other
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
    written = set(_C.graph_written_inputs(graph))
    homes = _homes.setdefault(key, {})
    moves = []
    for k, (name, role, device) in enumerate(places):
        if role == "input":
            continue
        home = homes.get(name)
        if training and (home is None or not gradients_go_home):
            homes[name] = device
        elif home is None and k in written:
            # A buffer an inference graph writes in place (batch norm's
            # running statistics under no_grad in train mode): its home is
            # where it was first written (Note [One home table]).
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
#
# Note [One home table]: what a rank knows of each parameter and buffer is
# one record, keyed weakly by the tensor object (torch.utils.weak's
# WeakIdKeyDictionary: an entry goes when its tensor dies, so a process that
# builds and drops models keeps no bookkeeping for the dead ones, and a new
# tensor at a dead one's address inherits nothing). A record holds whether
# this rank's steps read it, whether another rank's do, its home (the rank
# whose copy is current: the rank a training graph binds it on, or the rank
# any graph writes it on in place, such as batch norm's running statistics
# under no_grad), whether a graph writes it, and whether release_unowned()
# gave its memory back. Parameters and buffers are treated alike: a buffer
# written on its home rank is as stale elsewhere as an updated weight.


class _Record:
    __slots__ = ("here", "elsewhere", "home", "written", "released")

    def __init__(self) -> None:
        self.here = False
        self.elsewhere = False
        self.home: int | None = None
        self.written = False
        self.released = False


_table: "WeakIdKeyDictionary" = WeakIdKeyDictionary()


def _record(t: Any) -> _Record:
    r = _table.get(t)
    if r is None:
        r = _table[t] = _Record()
    return r


def tracked() -> int:
    """How many live tensors the home table holds (bench/bounded_resources.py)."""
    return len(_table)


def home_rank(t: Any) -> int | None:
    """The rank whose copy of ``t`` (a parameter or buffer given to the
    compiled steps as an input) is current: the rank that updates it (its
    optimizer, or batch norm's running statistics in place); None when no
    step updates ``t`` (every rank's copy is the same)."""
    r = _table.get(t)
    return r.home if r is not None else None


def released(t: Any) -> bool:
    """Whether release_unowned() gave back ``t``'s memory on this rank (its
    values here are not its values)."""
    r = _table.get(t)
    return r is not None and r.released

#: Set by materialize(): RankExecutor.run notes its inputs, then raises Planned.
plan_only = False


class Planned(Exception):
    """Raised by RankExecutor.run under ``plan_only`` (distributed/materialize.py)."""


def read_here(t: Any) -> bool:
    """Whether this rank's compiled steps read ``t``, or no rank's do: the
    tensors a rank must hold (Note [Parameters other ranks own])."""
    r = _table.get(t)
    return r is None or r.here or not r.elsewhere


def note_inputs(inputs: Sequence[Any], devices: Sequence[int], rank: int,
                trains: bool = True, state: Sequence[bool] = (),
                written: Sequence[int] = ()) -> None:
    """Notes what this run reads (Note [Parameters other ranks own]) and the
    homes it fixes (Note [One home table]): for a graph that ``trains``,
    where it binds each parameter and buffer; for any graph, where it binds
    the inputs it writes in place (``written``: their indices). ``state``
    says, per input, whether it is a parameter or buffer (a graph input of
    role param or buffer); left empty, every tensor is.

    Raises:
        ExecutionError: a parameter, or a buffer some graph writes, bound on
            another rank than its home (Note [One home per parameter]);
            nothing has run yet.
    """
    written_set = set(written)
    checked: list[tuple[Any, int, bool]] = []
    for k, (t, d) in enumerate(zip(inputs, devices)):
        if not isinstance(t, torch.Tensor):
            continue
        is_state = state[k] if k < len(state) else True
        writes = k in written_set
        r = _table.get(t)
        if is_state and r is not None and r.home is not None and r.home != d \
                and (isinstance(t, torch.nn.Parameter) or r.written or writes):
            what = "parameter" if isinstance(t, torch.nn.Parameter) else "buffer"
            raise ExecutionError(
                f"modelpar distributed: this graph binds a {what} of shape "
                f"{tuple(t.shape)} on rank {d}, but an earlier graph bound it on rank "
                f"{r.home}, which updates it; rank {d}'s copy is stale, so this "
                "graph would compute with old values (Note [One home per parameter]). "
                "modelpar moves parameters and buffers home for the graphs of the function "
                "it trained (an inference graph under torch.no_grad()), not for another "
                "torch.compile of the model: evaluate through the compiled function you "
                "train with")
        checked.append((t, d, is_state and (trains or writes), writes))
    for t, d, fixes_home, writes in checked:
        r = _record(t)
        if d == rank:
            r.here = True
        else:
            r.elsewhere = True
        if fixes_home:
            r.home = d
        r.written = r.written or writes


def _frees_memory(device: torch.device) -> bool:
    """Whether replacing a tensor's storage on ``device`` by untouched memory
    gives memory back (Note [Untouched memory]): only on the CPU. On a GPU
    a tensor of the same shape needs device memory of the same size (the
    old block goes to the caching allocator and the new one comes from it:
    nothing is freed), and on meta there is nothing to free."""
    return device.type == "cpu"


def release_unowned(module: torch.nn.Module, *, poison: bool = False) -> int:
    """Gives back the memory of the parameters and buffers of ``module``
    that this rank's compiled steps never read and whose home is another
    rank (Note [Parameters other ranks own]); call it after the first
    training step. Each keeps its shape, dtype and strides (so the compiled
    code's guards still hold), on fresh memory that is never written (Note
    [Untouched memory] in distributed/untouched.py), so resident memory
    drops by their size. A tensor read only by another rank's inference
    graphs, with no home, is kept (every rank's copy is current, and the
    state dicts take it from rank 0). With ``poison``, the fresh memory is
    filled with NaN instead (a test that nothing reads it). Returns the
    bytes released.

    Raises:
        ConfigError: the homes are not known yet (no training step ran: only
            inference graphs, or none), or a tensor to release is not on
            the CPU (on a GPU nothing would be freed); nothing is released.
    """
    entries = list({id(t): (n, t) for n, t in [*module.named_parameters(),
                                                *module.named_buffers()]}.values())
    unowned = [(n, t) for n, t in entries if not read_here(t)]
    if unowned and all(home_rank(t) is None for _, t in entries):
        raise ConfigError(
            f"modelpar release_unowned: the homes of the parameters and buffers are not known "
            f"yet ({len(unowned)} tensors, such as {unowned[0][0]!r}, are read only by other "
            "ranks, but no training step has fixed which rank's copy is current; after "
            "inference-only steps a released tensor would be missing from the state dicts); "
            "run a training step through the compiled function first, then call "
            "release_unowned (Note [One home per parameter])")
    to_release = [(n, t) for n, t in unowned if home_rank(t) is not None and not released(t)]
    elsewhere = [(n, t) for n, t in to_release if not _frees_memory(t.device)]
    if elsewhere:
        name, t = elsewhere[0]
        raise ConfigError(
            f"modelpar release_unowned: {name!r} (and {len(elsewhere) - 1} more) is on "
            f"{t.device}, where releasing frees nothing: a tensor of the same shape needs "
            f"device memory of the same size ({t.untyped_storage().nbytes()} bytes here), so "
            "memory would be reallocated, not given back. Build the model on the meta device "
            "and call modelpar.materialize(), which allocates only what this rank owns, or "
            "keep the whole model on every rank")
    freed = 0
    with torch.no_grad():
        for _name, t in to_release:
            fresh = untouched_like(t)
            if poison:
                fresh.fill_(float("nan"))
            freed += t.untyped_storage().nbytes()
            t.data = fresh
            _record(t).released = True
    return freed


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
