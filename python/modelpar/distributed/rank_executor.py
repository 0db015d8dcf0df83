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
import gc
import time
import weakref
from collections.abc import Sequence
from typing import Any

from .. import _C
from ..errors import ExecutionError, PeerError
from ..kernels import with_kernel_regions
from ..runtime.executor import outside_dispatch_modes
from . import homes
from .data_parallel import GradientReducer
from .faults import name_failed_rank, report_failure
from .input_check import AgreementCheck
from .plan_check import check_same_plan

__all__ = ["RankExecutor"]


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


def _mixed_batches(names: str, detail: str) -> str:
    return (f"modelpar distributed: the ranks of one plan were given different data for "
            f"{names} {detail}. Each rank reads only the inputs placed on its own device, so "
            "the step would train on inputs mixed from several ranks' batches (Note [Inputs "
            "every rank must agree on]). Feed every rank of a pipeline the same batch: with "
            "torch.utils.data.DistributedSampler give num_replicas and rank of the mesh's dp "
            "dimension (its dp size and mesh.get_local_rank('dp'); without a mesh, "
            "num_replicas=1), not the world size and global rank; or to train data-parallel "
            "replicas on different batches, give options['mesh'] = {'pp': P, 'dp': D}")


def _replicas_differ(names: str, detail: str) -> str:
    return (f"modelpar distributed: the data-parallel replicas of the mesh start from different "
            f"values of {names} {detail}; they average their gradients, so they must hold the "
            "same parameters: seed every rank alike before building the model "
            "(torch.manual_seed), or load the same checkpoint on every rank")


#: Seconds a rank waits for a peer beyond ``peer_timeout`` when regions
#: compile in the step (Note [Peers wait for a compiling rank]).
COMPILE_WAIT_S = 600.0


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
                 record_trace: bool = False, trains: bool = True, what: str = "a step",
                 check_inputs: int | None = None, replicas: Any = None,
                 data_parallel: GradientReducer | None = None, kernels: str = "aten",
                 measure_memory: bool = False) -> None:
        import torch.distributed as dist
        #: With ``kernels="inductor"``: the kernel regions (Note [Kernel
        #: regions], kernels/regions.py); else None.
        self.kernel_regions = None
        planned = program  # what the ranks compare: region keys are this process's own
        if kernels == "inductor":
            program, self.kernel_regions = with_kernel_regions(program)
        self.group = group
        self.trains = trains  # a training graph's bindings are its parameters' homes
        self.backend = str(dist.get_backend(group))
        self.timeout_s = timeout_s
        self.rank_now = dist.get_rank(group)
        self.input_devices = list(_C.input_devices(program))
        # Note [One home table] (distributed/homes.py): which inputs are
        # parameters or buffers, and which the program writes in place.
        self.state_inputs = [role != "input" for role in _C.graph_input_roles(program.graph)]
        self.written_inputs = list(_C.graph_written_inputs(program.graph))
        reverse = _reverse_group(group, self.backend)
        # Note [Peers wait for a compiling rank]: with kernels="inductor" a
        # rank compiles each of its regions at their first call (seconds to a
        # minute each on a small CPU), in the middle of the step, while its
        # peers wait at a recv; they wait up to COMPILE_WAIT_S longer than
        # peer_timeout. A rank that raises still closes its connections and
        # is named at once; only a hung rank is found later.
        wait_s = timeout_s + (COMPILE_WAIT_S if kernels == "inductor" else 0.0)
        self._ex = _C.RankExecutor(program, group_name=group.group_name, timeout_s=wait_s,
                                   device=device, replicated_outputs=list(replicated_outputs),
                                   output_homes=[tuple(h) for h in output_homes], verify=verify,
                                   record_trace=record_trace,
                                   reverse_group_name=reverse.group_name if reverse else "",
                                   measure_memory=measure_memory)
        _live_executors.add(self)
        # Note [Inputs every rank must agree on] (input_check.py): the data
        # inputs, checked over the group at the first run and every
        # ``check_inputs`` runs (None: never; a backward's inputs are its
        # forward's saved values, placeholders on the ranks that do not hold them).
        graph = program.graph
        roles = list(_C.graph_input_roles(graph))
        names = list(graph.input_names)
        data = [i for i, r in enumerate(roles) if r == "input"]
        self.input_check = None if check_inputs is None else AgreementCheck(
            group, data, [names[i] for i in data], check_inputs, timeout_s, what,
            _mixed_batches)
        # Note [Gradients averaged over the replicas] (data_parallel.py): the
        # replicas (``replicas``: this rank's dp group) must run the same
        # plan, and start from the same parameters (checked at the first run).
        self.data_parallel = data_parallel
        self._run_start_ns = 0
        self.replica_check = None
        if replicas is not None and dist.get_world_size(replicas) > 1:
            check_same_plan(str(planned), replicas,
                            f"{what} (over the data-parallel replicas of the mesh)", timeout_s)
            mine = [i for i, (r, d) in enumerate(zip(roles, self.input_devices))
                    if r != "input" and d == self.rank_now]
            self.replica_check = AgreementCheck(replicas, mine, [names[i] for i in mine], 0,
                                                timeout_s, what, _replicas_differ)

    def memory_report(self) -> dict:
        """This rank's measured memory (needs ``measure_memory=True``): as
        :meth:`modelpar.Executor.memory_report`, one entry per device of
        the program with only this rank's (``rank_now``) filled: what its
        value slots held, a received tensor's strides header included
        (Note [Measured memory]).

        Raises:
            ConfigError: the executor was built without ``measure_memory``.
        """
        return self._ex.memory_report()

    def chrome_trace(self) -> str:
        """Chrome trace JSON of the last step on this rank: one process, this
        rank's device (needs ``record_trace=True``); under a mesh, with the
        data-parallel all-reduce of each bucket on a track of its own."""
        text = self._ex.chrome_trace()
        if self.data_parallel is None or not self.data_parallel.stats.spans:
            return text
        from .data_parallel import trace_events
        return trace_events(text, self.data_parallel.stats.spans, self._run_start_ns)

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
        homes.note_inputs(inputs, self.input_devices, self.rank_now, self.trains,
                          self.state_inputs, self.written_inputs)
        if homes.plan_only:  # Note [Planning without running] in distributed/materialize.py
            raise homes.Planned()
        if self.input_check is not None:
            self.input_check.maybe_check(inputs)
        if self.replica_check is not None:
            self.replica_check.maybe_check(inputs)
        self._run_start_ns = time.perf_counter_ns()  # the step's clock, near enough (traces)
        try:
            outs = outside_dispatch_modes(self._ex.run, inputs)
            if self.data_parallel is not None:
                self.data_parallel.reduce(outs)
            return outs
        except PeerError as e:
            raise name_failed_rank(self.group, self.rank, e) from e
        except ExecutionError as e:
            report_failure(self.group, self.rank, f"failed: {e}")
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
