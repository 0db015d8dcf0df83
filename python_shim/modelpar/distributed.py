"""Plans over the ranks of a ``torch.distributed`` process group: one
logical device per process (``torchrun --nproc-per-node N``), rank r running
device r's instruction list on the C++ rank executor
(``runtime/rank_executor.h``), whose sends and receives are the group's
point-to-point calls (Gloo on CPU, NCCL on GPUs).

``torch.compile(model, backend="modelpar", options={"devices": "world"})``
plans over every rank of the default group; ``options={"process_group": g}``
over the ranks of ``g`` (``devices``, if given, must equal its size).

Before anything runs, every rank's plan is hashed and the hashes
all-gathered (:func:`check_same_plan`): ranks that planned differently
raise ``ConfigError`` naming them. A step that fails on one rank makes every
other rank raise ``ExecutionError`` naming the failed rank, within
``peer_timeout`` seconds (Note [Naming the failed rank]).

Example (``torchrun --nproc-per-node 2 train.py``)::

    dist.init_process_group("gloo")
    step = torch.compile(train_step, backend="modelpar", options={"devices": "world"})
    loss = step(model, x, y)          # every rank gets the loss
    # each parameter's .grad exists on the rank that owns it, None elsewhere
"""

from __future__ import annotations

import atexit
import contextlib
import gc
import hashlib
import re
import time
import weakref
from collections.abc import Iterator, Sequence
from datetime import timedelta
from typing import Any

import torch

from . import _C
from .errors import ConfigError, ExecutionError, PeerError
from .executor import outside_dispatch_modes

__all__ = ["WORLD", "group_of", "check_same_plan", "check_backend", "homes_of", "keep_homes",
           "RankExecutor", "release_unowned", "read_here", "Planned"]

#: The ``devices`` value that means "one device per rank of the group".
WORLD = "world"

_FAULT_PREFIX = "modelpar/fault/"


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


def _wait(work: Any, timeout_s: float, what: str) -> None:
    try:
        if not work.wait(timedelta(seconds=timeout_s)):
            raise ExecutionError(f"modelpar: {what} did not complete within {timeout_s:g} s")
    except ExecutionError:
        raise
    except Exception as e:  # c10d's errors: a peer died or timed out
        raise ExecutionError(f"modelpar: {what} failed within the {timeout_s:g} s timeout: "
                             f"{e}") from e


@contextlib.contextmanager
def outside_tracing() -> Iterator[None]:
    """Lifts what AOTAutograd's tracing leaves on for the compilers: its fake
    mode, Python dispatch modes and the Python dispatcher.

    Note [Collectives outside the tracer's dispatch]: the plans are made,
    and their hashes and measurements exchanged, inside the compilers, where
    AOTAutograd has the Python dispatcher on. A c10d call from there goes
    through it, which takes the GIL, and so holds the GIL while
    ProcessGroupGloo::enqueue waits for the group's work mutex; the group's
    worker thread holds that mutex while it destroys the previous
    collective's work, whose tensors Python made, and that wants the GIL:
    the process hung (1 in 3 runs of two broadcasts in a row, gdb: the main
    thread in enqueue under python_dispatcher, pt_gloo_runloop in
    ~AsyncBroadcastWork -> decref_pyobject -> gil_scoped_acquire)."""
    from torch._dispatch.python import no_python_dispatcher
    from torch._subclasses.fake_tensor import unset_fake_temporarily
    from torch.utils._python_dispatch import _disable_current_modes
    with unset_fake_temporarily(), _disable_current_modes(), no_python_dispatcher():
        yield


def wire_device(group: Any) -> torch.device:
    """Where the group's backend carries tensors: this rank's current GPU
    for NCCL, else the CPU."""
    import torch.distributed as dist
    if dist.get_backend(group) == "nccl":
        return torch.device("cuda", torch.cuda.current_device())
    return torch.device("cpu")


def check_same_plan(program_text: str, group: Any, what: str, timeout_s: float) -> None:
    """All-gathers a hash of ``program_text`` over ``group``.

    Raises:
        ConfigError: ranks planned differently; the message lists which ranks
            agree with which.
        ExecutionError: a rank did not take part within ``timeout_s``.
    """
    with outside_tracing():  # Note [Collectives outside the tracer's dispatch]
        _check_same_plan(program_text, group, what, timeout_s)


def _check_same_plan(program_text: str, group: Any, what: str, timeout_s: float) -> None:
    import torch.distributed as dist
    # The graph's name counts the functions this process compiled before
    # (`_lambda__1`), which may differ between ranks; the plan is the rest.
    text = re.sub(r"graph @[^(\s]*\(", "graph @step(", program_text, count=1)
    digest = hashlib.sha256(text.encode()).digest()
    wire = wire_device(group)
    mine = torch.tensor([int.from_bytes(digest[:7], "little")], dtype=torch.int64, device=wire)
    size = dist.get_world_size(group)
    everyone = [torch.zeros(1, dtype=torch.int64, device=wire) for _ in range(size)]
    _wait(dist.all_gather(everyone, mine, group=group, async_op=True), timeout_s,
          f"the plan check of {what} (an all-gather of each rank's plan hash)")
    hashes = [int(t.item()) for t in everyone]
    if len(set(hashes)) == 1:
        return
    groups: dict[int, list[int]] = {}
    for r, h in enumerate(hashes):
        groups.setdefault(h, []).append(r)
    me = dist.get_rank(group)
    parts = "; ".join(f"ranks {', '.join(map(str, rs))} have plan {h:014x}"
                      for h, rs in groups.items())
    raise ConfigError(f"modelpar distributed: the ranks planned {what} differently ({parts}; "
                      f"this is rank {me}); every rank must compile the same model with the same "
                      "options and input shapes")


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
    the rank that binds its parameter: compile_pipeline.py) a training step
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


# id(group) -> (group, the group carrying its transfers from higher to lower
# ranks); the group is kept so that its id is not reused by a new one
_reverse_groups: dict[int, tuple[Any, Any]] = {}


def _reverse_group(group: Any, backend: str) -> Any:
    """A second group of the same ranks for the transfers from a higher rank
    to a lower one (Note [One stream per direction] in
    runtime/rank_executor.cpp): over NCCL, where c10d runs both directions
    of a pair on one stream; on any backend with MODELPAR_REVERSE_GROUP=1 (to
    test it on Gloo); none with MODELPAR_REVERSE_GROUP=0. Made once per group,
    by every rank at its first executor (new_group is collective over the
    world, so only for the default group; None otherwise)."""
    import os

    import torch.distributed as dist
    wanted = os.environ.get("MODELPAR_REVERSE_GROUP")
    if wanted == "0" or (wanted != "1" and "nccl" not in backend):
        return None
    if group is not dist.distributed_c10d._get_default_group():
        return None
    if id(group) not in _reverse_groups:
        _reverse_groups[id(group)] = (group, dist.new_group(
            ranks=dist.get_process_group_ranks(group), backend=backend))
    return _reverse_groups[id(group)][1]


# Note [Letting go of the group at exit]
# A RankExecutor holds its process group (the Python object and, in C++, the
# c10d backend), and compiled functions keep their executors for the life of
# the process. So dist.destroy_process_group() does not destroy a group that
# modelpar ran on: it lived until the interpreter's final garbage collection,
# where a Gloo group's worker thread was sometimes torn down by a forced
# unwind and the process aborted after a successful run ("terminate called
# without an active exception"; 1 in 4 runs of the pipelined rank tests on a
# loaded 2-core machine). An atexit hook closes every live executor first, so
# the group goes while the interpreter is whole.
_live_executors: "weakref.WeakSet[RankExecutor]" = weakref.WeakSet()


@atexit.register
def _close_executors() -> None:
    for ex in list(_live_executors):
        ex.close()
    _reverse_groups.clear()  # made by modelpar: let go of them too
    gc.collect()


class RankExecutor:
    """Runs rank ``rank``'s instruction list of ``program`` (a Program with
    one device per rank of ``group``) on the C++ rank executor.

    Raises:
        ConfigError: the group's size is not the program's device count.
        InvalidIrError / UnsupportedOpError: as :class:`modelpar.Executor`.
    """

    def __init__(self, program: Any, group: Any, *, device: str = "cpu",
                 timeout_s: float = 30.0, replicated_outputs: Sequence[int] = (),
                 output_homes: Sequence[tuple[int, int]] = (), verify: bool = True,
                 record_trace: bool = False, trains: bool = True) -> None:
        import torch.distributed as dist
        self.group = group
        self.trains = trains  # a training graph's bindings are its parameters' homes
        self.backend = str(dist.get_backend(group))
        self.timeout_s = timeout_s
        self.rank_now = dist.get_rank(group)
        self.input_devices = list(_C.input_devices(program))
        reverse = _reverse_group(group, self.backend)
        self._ex = _C.RankExecutor(program, group_name=group.group_name, timeout_s=timeout_s,
                                   device=device, replicated_outputs=list(replicated_outputs),
                                   output_homes=[tuple(h) for h in output_homes], verify=verify,
                                   record_trace=record_trace,
                                   reverse_group_name=reverse.group_name if reverse else "")
        _live_executors.add(self)

    def chrome_trace(self) -> str:
        """Chrome trace JSON of the last step on this rank: one process, this
        rank's device (needs ``record_trace=True``)."""
        return self._ex.chrome_trace()

    def close(self) -> None:
        """Drops this executor's hold on the process group (Note [Letting go
        of the group at exit]); run() raises afterwards."""
        self._ex = None
        self.group = None

    def run(self, inputs: Sequence[Any]) -> list[Any]:
        """One step: returns one value per graph output, None for the
        outputs that live on other ranks (and are not replicated).

        Raises:
            ExecutionError: a failing instruction here, or (PeerError) a
                transfer with another rank that did not complete; the message
                names the failed rank (Note [Naming the failed rank]).
        """
        if self._ex is None:
            raise ExecutionError("modelpar: this rank executor was closed (the process is exiting)")
        inputs = list(inputs)
        _note_inputs(inputs, self.input_devices, self.rank_now, self.trains)
        if plan_only:  # Note [Planning without running] in materialize.py
            raise Planned()
        try:
            return outside_dispatch_modes(self._ex.run, inputs)
        except PeerError as e:
            raise _name_failed_rank(self.group, self.rank, e) from e
        except ExecutionError as e:
            _report_failure(self.group, self.rank, f"failed: {e}")
            raise

    __call__ = run

    @property
    def rank(self) -> int:
        return self._ex.rank

    @property
    def num_devices(self) -> int:
        return self._ex.world_size

    @property
    def program(self) -> Any:
        return self._ex.program

    @property
    def last_step_wait_ns(self) -> int:
        """Nanoseconds the last step spent waiting for other ranks."""
        return self._ex.last_step_wait_ns

    @property
    def output_holders(self) -> list[int]:
        return list(self._ex.output_holders)

    def replay_status(self) -> dict:
        return {"requested": "streams", "steps": 0, "captured": False, "static_buffers": False,
                "graphs": 0, "issues": [],
                "summary": f"rank {self.rank} of {self.num_devices} over {self.backend} "
                           "(stream replay)"}

    def __repr__(self) -> str:
        return f"<modelpar.RankExecutor rank {self.rank} of {self.num_devices} over {self.backend}>"


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
    """Raised by RankExecutor.run under ``plan_only`` (materialize.py)."""


def read_here(t: Any) -> bool:
    """Whether this rank's compiled steps read ``t``, or no rank's do: the
    tensors a rank must hold (Note [Parameters other ranks own])."""
    seen_here = id(t) in _read_here and _read_here[id(t)]() is t
    seen_elsewhere = id(t) in _read_elsewhere and _read_elsewhere[id(t)]() is t
    return seen_here or not seen_elsewhere


def _note_inputs(inputs: Sequence[Any], devices: Sequence[int], rank: int,
                 trains: bool = True) -> None:
    """Notes what this run reads (Note [Parameters other ranks own]) and,
    for a graph that ``trains``, where it binds each parameter (its home).

    Raises:
        ExecutionError: a parameter bound on another rank than an earlier
            training graph bound it (Note [One home per parameter]); nothing
            has run yet.
    """
    import weakref
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
    materialize.py), so resident memory drops by their size. With
    ``poison``, the fresh memory is filled with NaN instead (a test that
    nothing reads it). Returns the bytes released.
    """
    from .materialize import untouched_like
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
# by the rank executor (keep_homes' gradients_go_home, compile_pipeline.py),
# and a training step Dynamo compiles again (a dynamic batch at the second
# size) is planned with the earlier plan's layers and homes pinned
# (plan_joint's pinned_layers / pinned_inputs, compile_backend.py), its
# gradients made at home. As a safety net the
# rank executor's wrapper also remembers where each parameter tensor was
# bound by a training graph and refuses a run that binds it elsewhere (a
# graph of another torch.compile of the model, whose training homes are not
# known). Graphs that do not train (inference under no_grad) fix no home:
# until a step trains, no rank's copy is stale, and a model that only
# decodes (model.generate: a graph for the prompt, others for the decode
# steps, each planned apart) may bind a parameter on a different rank in each
# (measured: Mistral's 1F1B decode graphs over 2 ranks had been refused).

# Note [Naming the failed rank]: a rank whose own step fails (an operator
# raised, a bad input) writes `modelpar/fault/<rank>` = "failed: <message>"
# into the group's store before it raises; a rank whose transfer with peer p
# fails (PeerError: p closed the connection, or the timeout passed) writes
# "lost <p>". A rank that sees a PeerError follows these notes from p: a
# "failed" note names the culprit, a "lost q" note leads on to q, and a rank
# with no note (killed: it could write nothing) is itself the culprit. Notes
# of ranks still finding out get two seconds to appear; a "failed" note of
# any rank wins, since it is the first failure. Under
# torchrun the store lives in the agent, so it outlives any worker; store
# calls get a short timeout of their own and are best effort.

def _store(group: Any) -> Any:
    try:
        import torch.distributed as dist
        return dist.distributed_c10d._get_process_group_store(group)
    except Exception:  # no store for this group: the peer's name must do
        return None


def _report_failure(group: Any, rank: int, note: str) -> None:
    store = _store(group)
    if store is None:
        return
    try:
        old = store.timeout
        store.set_timeout(timedelta(seconds=2))
        try:
            store.set(f"{_FAULT_PREFIX}{rank}", note)
        finally:
            store.set_timeout(old)
    except Exception:  # the store is gone (its host died): nothing to tell
        pass


def _read_note(store: Any, rank: int) -> str | None:
    key = f"{_FAULT_PREFIX}{rank}"
    try:
        if not store.check([key]):
            return None
        return store.get(key).decode(errors="replace")
    except Exception:
        return None


def _follow(store: Any, rank: int, peer: int, world: int) -> tuple[int, str | None]:
    """One look at the notes: (culprit, its "failed" note) when a rank wrote
    one; else the end of the "lost" chain from ``peer`` and None."""
    notes = {r: _read_note(store, r) for r in range(world) if r != rank}
    for r, note in notes.items():
        if note is not None and note.startswith("failed"):
            return r, note
    culprit, seen = peer, {rank}
    while culprit not in seen:
        seen.add(culprit)
        note = notes.get(culprit)
        if note is None or not note.startswith("lost "):
            break
        culprit = int(note.split()[1])
    return culprit, None


def _name_failed_rank(group: Any, rank: int, error: PeerError, grace_s: float = 2.0) -> ExecutionError:
    """The ExecutionError of a PeerError, naming the rank that failed first
    (Note [Naming the failed rank]). The notes of ranks that are still
    finding out are given ``grace_s`` to appear."""
    import torch.distributed as dist
    _report_failure(group, rank, f"lost {error.peer}")
    culprit, why = error.peer, None
    store = _store(group)
    if store is not None:
        world = dist.get_world_size(group)
        try:
            old = store.timeout
            store.set_timeout(timedelta(seconds=2))
        except Exception:
            old = None
        try:
            deadline = time.monotonic() + grace_s
            while True:
                culprit, why = _follow(store, rank, error.peer, world)
                if why is not None or time.monotonic() >= deadline:
                    break
                time.sleep(0.1)
        finally:
            if old is not None:
                try:
                    store.set_timeout(old)
                except Exception:
                    pass
    why = why or "raised outside modelpar, was killed, or hangs"
    return ExecutionError(f"modelpar distributed: rank {culprit} failed ({why}); rank {rank} "
                          f"stops: {error}")
