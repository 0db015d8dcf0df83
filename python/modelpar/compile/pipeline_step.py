"""Pipeline parallelism under ``torch.compile``:
``torch.compile(f, backend="modelpar", options={"devices": 4, "pipeline": {...}})``.

AOTAutograd hands the backend a forward graph (it returns the user's
outputs, then the values it saves) and a backward graph (saved values and
the outputs' gradients, the tangents, in; one gradient per input out), and
calls them separately: the user's code runs between them. The pipeline
passes (passes/plan_pipeline.h) need the training step as one graph, so the
partitioner hook joins the two (``_C.join_step``: a saved value *is* the
forward value of its name) and pipelines the joint graph per batch size, at
the first call with that size (its symbol is the value the passes split):

* **step** mode, when the forward returns one scalar the backward starts
  from (the loss: the compiled function computes it): the tangent becomes
  ``ones_like(loss)``, and the whole pipelined step (every micro-batch's
  forward and backward, in the schedule's order: GPipe, 1F1B or 1F1B*) runs
  at the forward call. The gradients are kept; the backward call returns
  them times the real tangent (the backward is linear in it), so
  ``loss.backward()`` and ``(2 * loss).backward()`` are both exact. If no
  backward follows (an evaluation under grad mode), the work was wasted, not
  wrong.
* **split** mode, when the loss is computed outside (the forward returns
  predictions): only fill-drain is possible (GPipe): the tangents stay
  inputs, the pipelined step is split into the part before the backward and
  the rest (passes/pipeline/split_phases.h); the forward call runs the first and keeps
  the values the second reads (on the devices that made them); the backward
  call runs the second with the tangents. 1F1B needs the loss inside, and
  asking for it here is a ConfigError saying so.

Both modes keep what the backward needs in this module, keyed by a small
tensor that AOTAutograd saves in place of every saved tensor; the entry is
dropped when autograd frees that tensor (after the backward, or with the
graph). Inference graphs (``torch.no_grad``) are micro-batched and pipelined
forward only.

The batch dimension must be symbolic. Users need not say so: with a static
batch the backend asks Dynamo to trace again with dim 0 of the batched
inputs dynamic (Note [A static batch under the pipeline option] in
compile/backend.py).

Constant tensors the graphs read (lifted attributes, ``_tensor_constant*``)
are bound by name on every call, as on one device.
"""

from __future__ import annotations

import collections
import itertools
import os
import time
import weakref
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import torch
import torch.fx

from .. import _C
from ..profiles.cpu import machine_for_options
from ..errors import ConfigError, ExecutionError, PlanDoesNotFitError
from ..planning.options import CompileOptions, pipeline_options
from .graph_breaks import last_graph_break, warn_once
from .plan_guard import PlanGuard

__all__ = ["PipelineStep", "MAX_BATCH_SIZES"]

#: Training-mode batch norm as AOTAutograd functionalises it.
_TRAINING_BATCH_NORM = "aten::_native_batch_norm_legit_functional"

#: Pipelined steps kept per compiled graph, one per batch size, least recently
#: used dropped first: each holds executors and their worker threads, so a
#: training loop with many batch sizes keeps threads and memory bounded.
MAX_BATCH_SIZES = 8

@dataclass
class _Stash:
    """What one forward call leaves for its backward."""
    values: dict[str, Any]
    args: list[Any] = field(default_factory=list)
    built: Any = None  # the _Built the forward ran (the backward runs its second part)


class _StashTable:
    """Stashes keyed by a one-element int64 tensor that AOTAutograd saves for
    the backward; an entry lives as long as that tensor."""

    def __init__(self) -> None:
        self.entries: dict[int, _Stash] = {}
        self.counter = itertools.count(1)

    def put(self, stash: _Stash) -> torch.Tensor:
        key = next(self.counter)
        self.entries[key] = stash
        token = torch.tensor([key], dtype=torch.int64)
        weakref.finalize(token, self.entries.pop, key, None)
        return token

    def get(self, token: Any) -> _Stash:
        key = int(token[0]) if isinstance(token, torch.Tensor) and token.numel() == 1 else -1
        stash = self.entries.get(key)
        if stash is None:
            raise RuntimeError("modelpar pipeline: the backward found nothing its forward kept "
                               "(the graph was already freed: call backward once per forward, or "
                               "pass retain_graph=True)")
        return stash


@dataclass
class _Built:
    """The pipelined step for one batch size."""
    plan: Any                         # PipelinePlan
    executors: list[Any]              # step: [whole]; split: [first, second]
    output_index: list[dict[str, int]]  # per executor: output name -> index
    input_names: list[list[str]]      # per executor: its graph inputs


class PipelineStep:
    """One Dynamo graph's training step, pipelined (see the module docstring).

    Built by the partitioner hook from the imported forward and backward
    graphs; ``forward()`` / ``backward()`` / ``inference()`` are what the
    AOTAutograd compilers return.
    """

    def __init__(self, opts: CompileOptions, plan_record: Any, name: str) -> None:
        self.opts = opts
        # Note [Searched pipelines keep the pipeline option's defaults]
        # (compile/step_search.py): under strategy="auto" the pipeline option
        # gives only what every searched pipeline keeps (batch_norm, ...).
        self.options = pipeline_options(opts.pipeline or {})
        self.record = plan_record
        self.name = name
        self.stash = _StashTable()
        self.built: collections.OrderedDict[int, _Built] = collections.OrderedDict()
        # strategy="auto": batch size -> the guard timing its chosen plan against
        # the one-device plan (Note [Never slower than one device]).
        self.guards: dict[int, PlanGuard] = {}
        self.mode = "step"
        self.graph: Any = None
        self.tangents_checked = False  # step mode: the other outputs' tangents read once
        # The step holds recompute nodes of its own (Note [A model that
        # checkpoints itself]): decided once, where the step is joined.
        self.checkpoints_itself = False
        self.fw_out_names: list[str] = []
        self.bw_out_names: list[str] = []
        self.fw_input_names: list[str] = []
        self.tangent_names: list[str] = []
        self.saved_kinds: list[str] = []  # per saved forward output: "tensor" / "int"
        self.tangent_positions: list[int] = []
        self.loss_tangent_index = 0  # step: the loss's among the tangents (the rest are zero)
        self.graph_kind = "training"
        self.batch_input = -1  # the forward input whose dim 0 is the batch
        # every forward input split along dim 0 (Note [One batch symbol] in compile/fx_import.py)
        self.batched_inputs: list[int] = []
        self.constants: dict[str, torch.Tensor] = {}  # joint graph input name -> lifted constant
        self.rank_device = "cpu"  # world: where this rank's tensors live

    # -- building --------------------------------------------------------

    def join(self, fw_graph: Any, bw_graph: Any, fw_module: torch.fx.GraphModule,
             bw_module: torch.fx.GraphModule, num_fwd_outputs: int,
             saved: list[tuple[str, str]], tangents: list[tuple[str, str]],
             fw_output_map: Sequence[int], bw_output_map: Sequence[int],
             loss_tangent: tuple[int, str] | None, fw_constants: Sequence[torch.Tensor] = (),
             bw_constants: Sequence[torch.Tensor] = ()) -> None:
        """Joins the two graphs and decides the mode: step when the backward
        starts from one scalar loss (``loss_tangent``: its index among the
        tangents and its backward input's name; every other tangent paired
        with an output is taken as zero, Note [Only the loss has a
        gradient]), else split.

        Split mode under 1F1B runs fill-drain, with a warning (Note [A
        graph the pipeline cannot cut] in compile/backend.py).

        Raises:
            ConfigError: a batch dimension that is not symbolic.
        """
        fw_out = next(n for n in fw_module.graph.nodes if n.op == "output").args[0]
        self.saved_kinds = ["tensor" if isinstance(getattr(o, "meta", {}).get("val"), torch.Tensor)
                            else "int" for o in fw_out[num_fwd_outputs:]]
        self.batch_input = _batch_input(fw_module, static_ok=self.opts.strategy == "auto")
        bw_tangents = [n for n in bw_module.graph.nodes
                       if n.op == "placeholder" and n.name.startswith("tangents_")]
        loss_links = [(b, f) for b, f in tangents
                      if loss_tangent is not None and b == loss_tangent[1]]
        # Step mode needs a value for every tangent at the forward call: the
        # loss's seed, zeros for the rest, so each must be paired.
        self.mode = ("step" if len(loss_links) == 1 and len(tangents) == len(bw_tangents)
                     else "split")
        self.loss_tangent_index = loss_tangent[0] if self.mode == "step" and loss_tangent else 0
        if self.mode == "split" and self.options["schedule"] != "gpipe":
            # Note [A graph the pipeline cannot cut] (compile/unpipelined.py).
            rec = self.record
            warn_once(
                f"fill-drain {rec.name}",
                f"modelpar pipeline: {rec.function} ({rec.filename}:{rec.line}, plan "
                f"{rec.index}) runs fill-drain ('gpipe') instead of "
                f"{self.options['schedule']!r}: 1F1B interleaves forward and backward "
                "micro-batches, but this captured graph does not return the loss (it is "
                "computed outside the compiled function, or in another graph after a graph "
                "break, e.g. at a data-dependent op: modelpar.plans() lists the graphs), so "
                "AOTAutograd runs the backward only after the whole forward. For 1F1B, "
                "compile a function that returns the loss, e.g. "
                "torch.compile(lambda x, y: loss_fn(model(x), y), ...), with no graph break "
                "before the loss" + last_graph_break(), stacklevel=2)
            self.options = {**self.options, "schedule": "gpipe", "virtual_stages": 0,
                            "partition": ("balance-time" if self.options["partition"] == "madpipe"
                                          else self.options["partition"])}
        if self.batch_input < 0 and self.mode == "split":
            # Only pipelines split a step at its backward, and a static batch
            # has none (Note [A static batch under strategy="auto"]).
            _batch_input(fw_module, hint=(
                "; strategy='auto' plans such a step without micro-batches only when the "
                "compiled function returns the loss"))
        links = loss_links if self.mode == "step" else []
        zeros = [(b, f) for b, f in tangents if (b, f) not in links] if self.mode == "step" else []
        # FX outputs map onto IR outputs (-1: None or a constant); keep every
        # IR output the user's forward outputs use.
        user_map = list(fw_output_map[:num_fwd_outputs])
        keep = 1 + max([o for o in user_map if o >= 0], default=-1)
        graph, fw_names, bw_names = _C.join_step(fw_graph, bw_graph, saved, links, keep, zeros)
        self.graph = graph
        self.checkpoints_itself = "phase=recompute" in str(graph)
        self.fw_out_names = [fw_names[o] if o >= 0 else "" for o in user_map]
        self.bw_out_names = [bw_names[o] if o >= 0 else "" for o in bw_output_map]
        self.fw_input_names = list(fw_graph.input_names)
        bw_ph = [n for n in bw_module.graph.nodes if n.op == "placeholder"]
        self.tangent_positions = [i for i, n in enumerate(bw_ph) if n.name.startswith("tangents_")]
        # The joint graph's inputs: the forward's, then the backward's that
        # no link names (renamed when taken), in order.
        linked = {b for b, _ in saved} | {b for b, _ in links} | {b for b, _ in zeros}
        bw_in = list(bw_graph.input_names)
        extra = list(graph.input_names)[len(self.fw_input_names):]
        joint_name = dict(zip([n for n in bw_in if n not in linked], extra))
        self.tangent_names = ([joint_name.get(bw_in[i], "") for i in self.tangent_positions]
                              if self.mode == "split" else [])
        # Lifted constants are the trailing inputs of each graph (fx_import).
        fw_in = self.fw_input_names
        self.constants = dict(zip(fw_in[len(fw_in) - len(fw_constants):], fw_constants))
        for name, t in zip(bw_in[len(bw_in) - len(bw_constants):], bw_constants):
            self.constants[joint_name.get(name, name)] = t
        self.graph_kind = "training"

    def inference(self, graph: Any, gm: torch.fx.GraphModule, output_map: Sequence[int],
                  constants: Sequence[torch.Tensor] = ()) -> None:
        """An inference graph (no backward): pipelined forward only.

        Raises:
            ConfigError: a batch dimension that is not symbolic.
        """
        self.batch_input = _batch_input(gm, static_ok=self.opts.strategy == "auto")
        self.mode = "step"
        self.graph = graph
        names = list(graph.output_names)
        self.fw_out_names = [names[o] if o >= 0 else "" for o in output_map]
        self.fw_input_names = list(graph.input_names)
        names = self.fw_input_names
        self.constants = dict(zip(names[len(names) - len(constants):], constants))
        self.saved_kinds = []
        self.graph_kind = "inference"

    def build(self, batch: int, values: Mapping[str, Any] | None = None) -> _Built:
        """The pipelined step at this batch size (planned once, cached; the
        least recently used of more than MAX_BATCH_SIZES is dropped).
        ``values``: the call's inputs by name, which strategy="auto" times
        the step's nodes on (Note [The searched step] in compile/step_search.py)."""
        if batch in self.built:
            self.built.move_to_end(batch)
            return self.built[batch]
        from ..runtime.executor import Executor, threads_per_worker
        from ..planning.pipeline import plan_pipeline
        o = self.options
        start = time.perf_counter()
        machine = machine_for_options(self.opts)
        search = None
        if self.opts.strategy == "auto":
            search = self._search(batch, machine, values)
            plan = search.pipeline if search.pipeline is not None else search.placement
            simulated_trace = _simulated_trace(self.opts)
            if simulated_trace is not None:
                plan.write_trace(simulated_trace)
        else:
            # Note [A model that checkpoints itself]: its step already holds
            # recompute nodes (torch.utils.checkpoint, transformers'
            # gradient_checkpointing_enable), which the pipeline's own
            # checkpointing must not checkpoint again; unless the user chose a
            # mode (then checkpoint.cpp's ConfigError names the fix), the
            # model's choice stands: "never".
            checkpoint = o["checkpoint"]
            if "checkpoint" not in self.opts.pipeline_given and self.checkpoints_itself:
                checkpoint = "never"
            plan = plan_pipeline(self.graph, devices=self.opts.devices,
                                 microbatches=min(o["microbatches"], batch), batch_size=batch,
                                 schedule=o["schedule"], virtual_stages=o["virtual_stages"],
                                 partition=o["partition"],
                                 checkpoint=checkpoint, portals=o["portals"],
                                 memory=self.opts.memory, machine=machine,
                                 loss_reduction=o["loss_reduction"],
                                 allow_random=o["allow_random"], batch_norm=o["batch_norm"],
                                 trace=_simulated_trace(self.opts),
                                 # Note [Receiving in send order]: what a rank runs
                                 receive_in_send_order=self.opts.world)
        if self.opts.world:
            # Note [One home per parameter] (distributed/homes.py): a parameter
            # keeps the rank of the first training plan; a graph that does
            # not train, or a training step planned for another batch size
            # (strategy="auto" may choose another plan there), binds it there
            # and sends it to where it is read, and on_ranks sends its
            # gradient back there. The plan's placement says so, so the two
            # phases split from it below bind it there too.
            from ..distributed.homes import keep_homes
            plan = keep_homes(plan, (self.record.filename, self.record.function, self.record.line),
                              training=self.graph_kind == "training", gradients_go_home=True)
        if self.mode == "split":
            first, second, _carried = _C.split_phases(plan)
            programs = [first, second]
        else:
            programs = [plan.program]
        if self.opts.world:
            self.built_programs = programs
            executors = [self.on_ranks(p, k, batch) for k, p in enumerate(programs)]
        else:
            executors = [Executor(p, device_map=self.opts.executor_device_map,
                                  threads_per_device=threads_per_worker(p),
                                  record_trace=self.opts.trace is not None,
                                  replay="graphs" if self.opts.cuda_graphs else "streams",
                                  kernels=self.opts.kernels,
                                  measure_memory=self.opts.measure_memory)
                         for p in programs]
        for k, ex in enumerate(executors):
            part = f", part {k + 1} of {len(executors)}" if len(executors) > 1 else ""
            self.record.add_kernel_regions(f"step at batch {batch}{part}",
                                           getattr(ex, "kernel_regions", None))
        built = _Built(plan, executors,
                       [{n: i for i, n in enumerate(p.graph.output_names)} for p in programs],
                       [list(p.graph.input_names) for p in programs])
        self.built[batch] = built
        self.guards.pop(batch, None)
        if search is not None and self._guarded(search):
            try:
                self.guards[batch] = PlanGuard(built, self._one_device(batch, machine))
            except PlanDoesNotFitError:
                pass  # a pruned one-device plan that does not fit: nothing to compare
        while len(self.built) > MAX_BATCH_SIZES:
            dropped, _ = self.built.popitem(last=False)
            self.record.pipeline_batches.pop(dropped, None)
            self.record.search_batches.pop(dropped, None)
            self.guards.pop(dropped, None)
            self.record.pipeline_evictions += 1
        # A searched plan is a pipeline or a placement of the whole step
        # (Note [The searched step] in compile/step_search.py); plans()[-1] reports it.
        pipelined = search is None or search.pipeline is not None
        self.record.pipeline = plan if pipelined else None
        self.record.joint = None if pipelined else plan
        if search is not None:
            self.record.search = search
            self.record.search_batches[batch] = search
            self._say_if_batch_norm_is_deferred(search)
        if search is None:
            self.record.step_graph = self.graph
        self.record.pipeline_mode = self.mode if self.graph_kind == "training" else "inference"
        self.record.pipeline_batches[batch] = plan
        self.record.pipeline_seconds += time.perf_counter() - start
        return built

    def _say_if_batch_norm_is_deferred(self, search: Any) -> None:
        """Warns once when strategy="auto" chose a pipeline of several
        micro-batches for a step with training-mode batch norm, which then
        normalises each micro-batch with its own statistics (Note [Searched
        pipelines keep the pipeline option's defaults])."""
        chosen = search.candidates[search.chosen]
        if chosen["kind"] != "pipeline" or chosen["microbatches"] < 2 \
                or self.options["batch_norm"] != "deferred":
            return
        if not any(op.startswith(_TRAINING_BATCH_NORM) for op, _, _ in _C.graph_nodes(self.graph)):
            return
        rec = self.record
        warn_once(f"deferred batch norm {rec.name}",
                  f"modelpar: strategy='auto' chose {chosen['label']} for {rec.function} "
                  f"({rec.filename}:{rec.line}); its training-mode batch norm normalises each of "
                  f"the {chosen['microbatches']} micro-batches with its own statistics "
                  "(torchgpipe's DeferredBatchNorm; the running statistics are the whole "
                  "batch's), as the pipeline option does, so the loss differs from eager's by "
                  "that. options={'strategy': 'auto', 'pipeline': {'batch_norm': 'refuse'}} keeps "
                  "eager's batch statistics (pipelines of one micro-batch only)", stacklevel=2)

    def _guarded(self, search: Any) -> bool:
        """Whether the chosen plan is timed against the one-device plan on
        the first steps (Note [Never slower than one device] in
        compile/plan_guard.py)."""
        if self.opts.world or self.mode != "step" or self.graph_kind != "training":
            return False
        chosen = search.candidates[search.chosen]
        # "pruned": its bound could not beat the best simulated; the guard
        # measures what the simulation could only bound.
        return chosen["kind"] != "one-device" and any(
            c["kind"] == "one-device" and c["status"] in ("ok", "pruned")
            for c in search.candidates)

    def _one_device(self, batch: int, machine: str | None) -> _Built:
        """The step on one device, every core its worker's (Note [Every core
        used] in runtime/executor.py)."""
        from ..runtime.executor import Executor, threads_per_worker
        from ..planning.placement import plan_graph
        plan = plan_graph(self.graph, devices=1, machine=machine, memory=self.opts.memory,
                          dump_dir="")
        program = plan.program
        ex = Executor(program, device_map=self.opts.executor_device_map,
                      threads_per_device=threads_per_worker(program),
                      record_trace=self.opts.trace is not None,
                      replay="graphs" if self.opts.cuda_graphs else "streams",
                      kernels=self.opts.kernels, measure_memory=self.opts.measure_memory)
        return _Built(plan, [ex], [{n: i for i, n in enumerate(program.graph.output_names)}],
                      [list(program.graph.input_names)])

    def _guard_step(self, batch: int, built: _Built, start_ns: int, end_ns: int) -> None:
        """Notes a guarded step's time; once the guard decides, keeps the
        winner for this batch size and says so in plans()."""
        guard = self.guards.get(batch)
        if guard is None or not guard.record(built, (end_ns - start_ns) / 1e3):
            return
        del self.guards[batch]
        self.record.guard_batches[batch] = guard.summary
        if guard.winner is guard.one_device:
            self.built[batch] = guard.one_device
            self.record.pipeline = None
            self.record.joint = guard.one_device.plan
            self.record.pipeline_batches[batch] = guard.one_device.plan

    def _search(self, batch: int, machine: str | None,
                values: Mapping[str, Any] | None) -> Any:
        """The strategy search at this batch size (strategy="auto"; Note
        [The searched step] in compile/step_search.py)."""
        from .step_search import search_step
        return search_step(self.graph, self.opts, self.options, self.mode == "split", batch,
                           machine, values, self.record)

    def on_ranks(self, program: Any, k: int, batch: int) -> Any:
        """Program ``k`` of the step bound to this rank's RankExecutor
        (distributed/rank_executor.py): stage s runs on rank s. Every rank gets the user's
        outputs (the loss), which their holder broadcasts; gradients and
        carried values stay on the rank that made them (None elsewhere).

        Raises:
            ConfigError: the ranks planned differently.
        """
        from ..distributed.data_parallel import gradient_reducer
        from ..distributed.rank_executor import RankExecutor
        from ..distributed.plan_check import check_same_plan
        check_same_plan(str(program), self.opts.process_group,
                        f"the pipelined step of {self.name} at batch {batch}",
                        self.opts.peer_timeout)
        index = {n: i for i, n in enumerate(program.graph.output_names)}
        replicated = {index[n] for n in self.fw_out_names if n and n in index}
        # A gradient goes to the rank that binds its parameter (and so updates
        # it): the first program binds every forward input. The gradient of a
        # data input goes to every rank, as the user's outputs do: it is the
        # tangent of the graph before a graph break, whose ranks bind it
        # where that graph made the value (Note [Input gradients over ranks]
        # in compile/backend.py).
        first = self.built_programs[0] if k else program
        device_of = dict(zip(first.graph.input_names, _C.input_devices(first)))
        role_of = dict(zip(first.graph.input_names, _C.graph_input_roles(first.graph)))
        grads = [(index[g], x) for g, x in zip(self.bw_out_names, self.fw_input_names)
                 if g and g in index and x in device_of]
        replicated |= {o for o, x in grads if role_of.get(x) == "input"}
        homes = sorted({(o, device_of[x]) for o, x in grads if role_of.get(x) != "input"})
        replicated = sorted(replicated)
        what = f"the pipelined step of {self.name} at batch {batch}"
        return RankExecutor(program, self.opts.process_group, device=self.rank_device,
                            timeout_s=self.opts.peer_timeout, replicated_outputs=replicated,
                            output_homes=homes, record_trace=self.opts.trace is not None,
                            trains=self.graph_kind == "training", what=what,
                            # the second part's inputs are values the first left where made
                            check_inputs=self.opts.input_check_every if k == 0 else None,
                            replicas=self.opts.dp_group, kernels=self.opts.kernels,
                            measure_memory=self.opts.measure_memory,
                            # Note [Gradients averaged over the replicas]
                            data_parallel=gradient_reducer(self.opts, self.record,
                                                           [o for o, _ in homes], what))

    # -- running ---------------------------------------------------------

    def batch_of(self, args: Sequence[Any]) -> int:
        """The call's batch size.

        Raises:
            ConfigError: the batched inputs differ in size along dim 0
                (Note [One batch symbol] in compile/fx_import.py).
        """
        if self.batch_input < 0:
            return STATIC_BATCH  # Note [A static batch under strategy="auto"]
        batch = int(args[self.batch_input].shape[0])
        sizes = {i: int(args[i].shape[0]) for i in self.batched_inputs
                 if isinstance(args[i], torch.Tensor) and args[i].dim() > 0}
        if any(size != batch for size in sizes.values()):
            shown = ", ".join(f"input {i}: {size}" for i, size in sorted(sizes.items()))
            raise ConfigError(
                f"modelpar pipeline: the batched inputs of {self.name} differ in size along "
                f"dim 0 ({shown}); a pipeline splits each of them into the same micro-batches, "
                "so they must share the batch size")
        return batch

    def forward(self) -> Callable[[list[Any]], list[Any]]:
        def run(args: list[Any]) -> list[Any]:
            inputs = list(args)
            args.clear()
            by_name = {**self.constants, **dict(zip(self.fw_input_names, inputs))}
            batch = self.batch_of(inputs)
            built = self.build(batch, by_name)
            guard = self.guards.get(batch)
            if guard is not None:
                built = guard.next_build()
            start = time.perf_counter_ns()
            outs = _run(built, 0, by_name)
            end = time.perf_counter_ns()
            # A step-mode forward runs the whole step: it completes it.
            self.record.record_run("forward" if self.mode == "split" else "step",
                                   built.executors[0], start, end)
            if guard is not None:
                self._guard_step(batch, built, start, end)
            user = [outs[n] if n else None for n in self.fw_out_names]
            if self.graph_kind == "inference":
                return user
            # Step: the gradients; split: the carried values and the inputs.
            token = self.stash.put(_Stash(outs, inputs if self.mode == "split" else [],
                                          built if self.mode == "split" else None))
            saved = [token if k == "tensor" else 0 for k in self.saved_kinds]
            return user + saved
        run._boxed_call = True  # type: ignore[attr-defined]
        return run

    def backward(self) -> Callable[[list[Any]], list[Any]]:
        def run(args: list[Any]) -> list[Any]:
            inputs = list(args)
            args.clear()
            tangent_at = set(self.tangent_positions)
            saved = [a for i, a in enumerate(inputs) if i not in tangent_at]
            tangents = [inputs[i] for i in self.tangent_positions if i < len(inputs)]
            token = next((a for a in saved if isinstance(a, torch.Tensor)), None)
            stash = self.stash.get(token)
            if self.mode == "step":
                t = tangents[self.loss_tangent_index] if tangents else None
                # On a GPU, reading the other tangents waits for the step:
                # checked at the first backward only (a loss computed from
                # the other outputs is the same mistake at every step).
                on_gpu = any(isinstance(u, torch.Tensor) and u.device.type != "cpu"
                             for u in tangents)
                if not (on_gpu and self.tangents_checked):
                    _check_only_the_loss(tangents, self.loss_tangent_index, self.name)
                    self.tangents_checked = True
                grads = [stash.values.get(n) if n else None for n in self.bw_out_names]
                # Reading a GPU tangent's value would wait for the whole
                # step the forward call queued (the host then idles the GPU
                # at every step's start): on a GPU the gradients are always
                # scaled, which the GPU does without the host waiting.
                seed_is_one = (isinstance(t, torch.Tensor) and t.device.type == "cpu"
                               and t.numel() == 1 and float(t) == 1.0)
                if isinstance(t, torch.Tensor) and not seed_is_one:
                    grads = [g * t if isinstance(g, torch.Tensor) else g for g in grads]
                return grads
            built = stash.built or self.build(self.batch_of(stash.args))
            by_name = {**self.constants, **dict(zip(self.fw_input_names, stash.args))}
            by_name.update(zip(self.tangent_names, tangents))
            by_name.update(stash.values)
            start = time.perf_counter_ns()
            outs = _run(built, 1, by_name)
            self.record.record_run("backward", built.executors[1], start, time.perf_counter_ns())
            return [outs.get(n) if n else None for n in self.bw_out_names]
        run._boxed_call = True  # type: ignore[attr-defined]
        return run


# Note [Only the loss has a gradient]
# ~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~
# A transformers model given labels returns its loss and its logits; with
# the loss computed inside, a pipeline runs the whole step (1F1B interleaves
# forward and backward) at the forward call, before it knows which outputs
# will get a gradient. AOTAutograd's backward takes a tangent for every
# differentiable output, so the logits have one too. The step seeds the loss
# with ones and every other paired output with zeros (zeros_like in the
# joint graph), which is what training does: loss.backward() leaves the
# logits without a gradient, and AOTAutograd hands the backward zeros (or
# None) for them. The backward checks that it did: a nonzero gradient of
# another output (a second loss computed outside from the logits) raises
# ExecutionError before any gradient is returned, naming what to do.


def _check_only_the_loss(tangents: Sequence[Any], loss_index: int, name: str) -> None:
    """Raises ExecutionError when a tangent other than the loss's is nonzero
    (Note [Only the loss has a gradient])."""
    for i, t in enumerate(tangents):
        if i == loss_index or not isinstance(t, torch.Tensor) or t.numel() == 0:
            continue
        if bool(t.detach().ne(0).any()):
            raise ExecutionError(
                f"modelpar pipeline: {name} ran its pipelined step (forward and backward) at the "
                "forward call, with a gradient for its loss only, but the backward got a nonzero "
                f"gradient for another output (of shape {tuple(t.shape)}): a loss computed "
                "outside the compiled function from its other outputs. Compute every loss inside "
                "the compiled function and return their sum, or use schedule='gpipe' with the "
                "loss outside")


def _run(built: _Built, k: int, values: Mapping[str, Any]) -> dict[str, Any]:
    """Runs executor k on the named values; returns its outputs by name."""
    missing = [n for n in built.input_names[k] if n not in values]
    if missing:
        raise RuntimeError(f"modelpar pipeline: no value for input(s) {', '.join(missing)} of "
                           "the pipelined program (an import bug)")
    outs = built.executors[k].run([values[n] for n in built.input_names[k]])
    return {n: outs[i] for n, i in built.output_index[k].items()}


# Note [A static batch under strategy="auto"]: a graph whose batch Dynamo
# specialised even when asked for a symbol (the model reshapes to a fixed
# batch size, or compares it with one) cannot be cut into micro-batches.
# Under the pipeline option that is an error (the user asked for
# micro-batches); under strategy="auto" the search goes on without them: the
# graph is planned once, under the batch key STATIC_BATCH, where the search
# (compile/step_search.py) meets a batch of 1 (no micro-batch sizes to time, no
# micro-batch counts but 1) and so ranks the one-device plan and the
# placements (its pipelines fail, saying why: plans() lists them). With the
# loss outside the compiled function only pipelines can split the step at its
# backward, so there the ConfigError stands.
STATIC_BATCH = 1


def _batch_input(fw_module: torch.fx.GraphModule, static_ok: bool = False,
                 hint: str = "") -> int:
    """The index of the first forward input whose dim 0 is symbolic; -1
    when none is and ``static_ok`` (Note [A static batch under
    strategy="auto"]).

    Raises:
        ConfigError: no input has a symbolic first dimension (and not
            ``static_ok``).
    """
    placeholders = [n for n in fw_module.graph.nodes if n.op == "placeholder"]
    for i, node in enumerate(placeholders):
        val = node.meta.get("val")
        if (isinstance(val, torch.Tensor) and val.dim() > 0
                and isinstance(val.shape[0], torch.SymInt)):
            return i
    if static_ok:
        return -1
    shapes = ", ".join(f"{n.name}: {tuple(n.meta['val'].shape)}" for n in placeholders
                       if isinstance(n.meta.get("val"), torch.Tensor))
    raise ConfigError(
        "modelpar pipeline: the batch dimension of the captured graph is static although modelpar "
        "asked Dynamo to trace again with dim 0 of the batched inputs dynamic (the graph's tensor "
        f"inputs: {shapes or 'none'}): Dynamo specialised it, because the model uses the batch "
        "size as a number (e.g. reshapes to a fixed size, or compares it with one). Use the "
        "batch size from the tensor (x.shape[0], or -1 in a reshape), or call "
        "torch._dynamo.mark_dynamic(t, 0) on each batched input to see where it is specialised"
        + hint)


def _simulated_trace(opts: CompileOptions) -> str | None:
    """Where the plan's simulated trace goes, beside the ``trace`` option's
    file (``step.json`` -> ``step.simulated.json``), its folder made: None
    without the option, and on every rank but 0 of a process group (the plan
    is the same on every rank; compile/records.py writes it on rank 0 likewise)."""
    if opts.trace is None:
        return None
    if opts.world:
        import torch.distributed as dist
        if dist.get_rank(opts.process_group) != 0:
            return None
    trace = os.fspath(opts.trace)
    stem = trace[:-5] if trace.endswith(".json") else trace
    os.makedirs(os.path.dirname(os.path.abspath(stem)), exist_ok=True)
    return stem + ".simulated.json"
