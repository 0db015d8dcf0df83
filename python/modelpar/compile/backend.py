"""The ``torch.compile`` backend: ``torch.compile(model, backend="modelpar")``.

Dynamo hands the backend one FX graph per piece of the user's code (a graph
break starts a new piece; new input shapes that fail Dynamo's guards compile
a new one). For each, the backend:

1. validates ``options`` / ``mode`` (planning/options.py) before any tracing;
2. runs AOTAutograd, which functionalises the graph and yields ATen-level
   forward and backward graphs (or one inference graph under no_grad);
3. converts each to an ``ir::Graph`` (compile/fx_import.py) and binds it to the C++
   interpreter (``_C.CompiledGraph``, every operator resolved now), which
   AOTAutograd then calls directly: no FX interpreter, no Python per op;
   With ``options={"devices": N}`` (N >= 2; or ``memory``, ``trace``, a
   CUDA ``device_map``) the forward and backward are instead planned as one
   (Note [Forward and backward placed as one]) and each runs on the
   multi-device Executor, built once per graph; an inference graph is
   planned alone. Each step's wall time is recorded in the plan, and with
   ``trace`` the measured and simulated Chrome traces are written;
4. records a ``PlanRecord`` (compile/records.py) and, with ``dump_dir`` /
   ``MODELPAR_DUMP_DIR``, writes the IR text.

A graph the runtime cannot run (a higher-order op, an opaque callable, an
operator the dispatcher does not know) runs eagerly with a one-time warning
naming what stopped it, or raises ``UnsupportedOpError`` with
``options={"strict": True}``.

Note [Parameters in captured graphs]: with Dynamo's default
``inline_inbuilt_nn_modules``, parameters and buffers reach the backend as
ordinary graph inputs. Their role comes from the Dynamo graph (the example
input is an ``nn.Parameter``; buffers are marked as static module state),
and AOTAutograd's input descriptors (``PlainAOTInput(idx)``,
``ParamAOTInput``, ``BufferAOTInput``) tie each forward/backward placeholder
back to that input.
"""

from __future__ import annotations

import re
import time
from dataclasses import dataclass
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import torch
import torch.fx

from .. import _C
from ..profiles.cpu import machine_for_options
from ..errors import InvalidIrError, UnsupportedOpError
from ..kernels import graph_with_kernel_regions
from .bound_graphs import MultiDeviceGraph, RankGraph, output_homes, scalar_outputs, varying_inputs
from .eager_fallback import eager_fallback
from .fx_import import (GraphKind, InputRole, UnsupportedGraph, batch_symbol_aliases, import_graph,
                        source_name, symbol_sizes)
from .joint_links import link_joint_graphs
from ..ir.text import parse_graph
from ..planning.options import CompileOptions, resolve_options
from .rank_binding import bind_on_ranks
from .records import GraphRecord, PlanRecord, new_plan, record_graph
from .unpipelined import why_not_pipelined

__all__ = ["modelpar_backend"]

# Over a process group: the training forward's layer -> device map of each
# user function, which its inference graphs keep (Note [One home per
# parameter] in distributed/rank_executor.py).
_world_layers: dict[tuple[str, str, int], dict[str, int]] = {}


def modelpar_backend(gm: torch.fx.GraphModule, example_inputs: Sequence[Any], *,
                     options: Mapping[str, Any] | None = None,
                     mode: str | None = None) -> Callable[..., Any]:
    """The Dynamo backend registered as ``"modelpar"``.

    Raises:
        ConfigError: a bad or not yet supported option (before any tracing).
        UnsupportedOpError: with ``strict``, a graph the runtime cannot run.
    """
    from torch._dynamo.backends.common import aot_autograd
    from torch._functorch.partitioners import (default_partition,
                                               min_cut_rematerialization_partition)

    opts = resolve_options(options, mode)
    roles = _dynamo_inputs(gm, example_inputs)
    if opts.whole_step:
        _retrace_with_a_symbolic_batch(gm, example_inputs, roles)
    plan = new_plan(*_user_code(gm), opts)
    capture = _Capture(plan, opts, roles)
    if opts.world:  # one device per rank (distributed/rank_executor.py)
        from ..distributed.groups import check_backend
        capture.rank_device = check_backend(opts.process_group, example_inputs)
    partitioner = (min_cut_rematerialization_partition if opts.partitioner == "min_cut"
                   else default_partition)

    def partition(joint_module: torch.fx.GraphModule, joint_inputs: Any, **kwargs: Any) -> Any:
        fw_module, bw_module = partitioner(joint_module, joint_inputs, **kwargs)
        if opts.whole_step:
            capture.plan_joint(fw_module, bw_module, kwargs.get("num_fwd_outputs"), pipeline=True)
        elif opts.planned:
            capture.plan_joint(fw_module, bw_module, kwargs.get("num_fwd_outputs"))
        return fw_module, bw_module

    aot = aot_autograd(fw_compiler=capture.forward, bw_compiler=capture.backward,
                       inference_compiler=capture.inference, partition_fn=partition,
                       # Buffer updates of inference graphs (BatchNorm's running
                       # stats under no_grad) stay in the graph as copy_ nodes.
                       keep_inference_input_mutations=True)
    return aot(gm, example_inputs)


# Note [A static batch under the pipeline option]: the pipeline passes split
# the batch dimension, which must be symbolic in the captured graph: with a
# static batch Dynamo has folded the batch size into the graph as a number
# (views, expands, arange), where no pass can tell it from a hidden size. So
# the user does not have to call mark_dynamic: when the data inputs of a
# graph captured under `pipeline` all have a static first dimension, the
# backend marks dim 0 of every data input whose first dimension is the batch
# size (the first data input's) with torch._dynamo.maybe_mark_dynamic (which
# lets Dynamo specialise a dimension that is not really free) and raises
# TensorifyScalarRestartAnalysis, the one RestartAnalysis that Dynamo lets
# pass out of a backend (torch/_dynamo/output_graph.py, _call_user_compiler):
# Dynamo traces the frame again, this time with a symbolic batch (also under
# dynamic=False, which only stops automatic dynamism). If the retrace is still
# static (the model reshapes to a fixed batch size), compile_pipeline's
# _batch_input raises a ConfigError naming the inputs and what to do.


def _symbolic_batch(node: torch.fx.Node) -> bool:
    """Whether the placeholder's dim 0 is a free symbol: not a constant,
    nor a symbol Dynamo has since specialised to one (a KV cache's batch
    symbol, made dynamic by automatic dynamism, then equated with the static
    batch of the new tokens it is concatenated with)."""
    from torch.fx.experimental.symbolic_shapes import is_concrete_int
    val = node.meta.get("example_value")
    return (isinstance(val, torch.Tensor) and val.dim() > 0
            and isinstance(val.shape[0], torch.SymInt) and not is_concrete_int(val.shape[0]))


def _retrace_with_a_symbolic_batch(gm: torch.fx.GraphModule, example_inputs: Sequence[Any],
                                   roles: Sequence[tuple[InputRole, str | None]]) -> None:
    """Asks Dynamo to trace again with a symbolic batch when the captured
    graph's batch is static (Note [A static batch under the pipeline option]);
    returns when there is nothing to do."""
    try:
        from torch._dynamo.exc import TensorifyScalarRestartAnalysis
    except ImportError:  # an older torch: the ConfigError says what to do
        return
    placeholders = [n for n in gm.graph.nodes if n.op == "placeholder"]
    data = [(node, t) for node, t, (role, _) in zip(placeholders, example_inputs, roles)
            if role is InputRole.INPUT and isinstance(t, torch.Tensor)
            and not isinstance(t, torch.nn.Parameter) and t.dim() > 0]
    if not data:
        return
    batch = data[0][1].shape[0]
    batched = [(node, t) for node, t in data if t.shape[0] == batch]
    if all(_symbolic_batch(node) for node, _ in batched):
        return  # already symbolic
    if all(0 in getattr(t, "_dynamo_weak_dynamic_indices", ()) for _, t in batched):
        return  # asked once already and still static: _batch_input explains
    for _, t in batched:
        torch._dynamo.maybe_mark_dynamic(t, 0)
    _forget_the_speculation_log()
    raise TensorifyScalarRestartAnalysis(
        restart_reason="modelpar pipeline: tracing again with a symbolic batch dimension")


def _forget_the_speculation_log() -> None:
    """Clears the speculation log of the frame Dynamo is tracing, before the
    restart that traces it again with a symbolic batch. Dynamo keeps the log
    over a TensorifyScalarRestartAnalysis and checks that the retrace takes
    the same path, but a symbolic batch puts ops into the graph earlier (the
    sizes the frame reads become sym_size calls: ``t = idx.shape[1]`` before
    ``torch.arange(t)`` in a GPT whose model alone is compiled), so the retrace
    records its entries at other instructions and Dynamo raised
    SpeculationLogDivergence. The log holds no graph break of this restart's
    making; a graph break before it is found again on the retrace."""
    try:
        from torch._dynamo.symbolic_convert import InstructionTranslator
        tx = InstructionTranslator.current_tx()
    except (ImportError, AttributeError, IndexError, AssertionError):
        return  # not inside Dynamo's tracer (or another torch): nothing kept to forget
    log = getattr(tx, "speculation_log", None)
    if log is not None:
        log.clear()


def _loss_tangent(bw_module: torch.fx.GraphModule) -> tuple[int, str] | None:
    """(index among the backward's tangents, FX name) of the loss's tangent:
    the one tangent of a 0-dim floating forward output (the loss computed
    inside the compiled function); None when there is none, or several.
    Other tangents (the logits a transformers model returns beside its loss)
    are those of outputs only the loss's backward is run from (Note [Only
    the loss has a gradient] in compile/pipeline_step.py)."""
    tangents = [n for n in bw_module.graph.nodes
                if n.op == "placeholder" and n.name.startswith("tangents_")]
    scalars = [(i, n.name) for i, n in enumerate(tangents)
               if isinstance(n.meta.get("val"), torch.Tensor) and n.meta["val"].dim() == 0
               and n.meta["val"].is_floating_point()]
    return scalars[0] if len(scalars) == 1 else None


def _user_code(gm: torch.fx.GraphModule) -> tuple[str, str, int, str]:
    """(root function name, file, first line, traced code name) of the frame
    Dynamo traced. After a graph break Dynamo traces a resume function
    (``torch_dynamo_resume_in_f_at_12``); the root is the user's ``f``."""
    from torch._guards import TracingContext
    tc = TracingContext.try_get()
    codes = getattr(tc, "traced_code", None) if tc is not None else None
    if not codes:
        return type(gm).__name__, "<unknown>", 0, type(gm).__name__
    code = root = codes[0]
    for _ in range(16):  # a resume function of a resume function ...
        parent = _resumed_from(root)
        if parent is None:
            break
        root = parent
    return root.co_name, root.co_filename, root.co_firstlineno, code.co_name


def _resumed_from(code: Any) -> Any:
    """The code object Dynamo generated the resume function ``code`` from,
    or None. Reads Dynamo's ContinueExecutionCache (private; best effort)."""
    try:
        from torch._dynamo.resume_execution import ContinueExecutionCache
        cache = ContinueExecutionCache.cache
        for idx, generated in cache.values.items():
            if any(c is code for c in generated.values()):
                return cache.refs[idx]()
    except Exception:  # a torch whose internals differ: fall back to the name
        pass
    return None


def _dynamo_inputs(gm: torch.fx.GraphModule,
                   example_inputs: Sequence[Any]) -> list[tuple[InputRole, str | None]]:
    """The role and a readable name (``blocks.0.attn.qkv.weight``, ``x``) of
    each input of the Dynamo graph (Note [Parameters in captured graphs])."""
    placeholders = [n for n in gm.graph.nodes if n.op == "placeholder"]
    out = []
    for node, example in zip(placeholders, example_inputs):
        source = getattr(node.meta.get("grapharg"), "source", None)
        name = getattr(source, "name", "") if source is not None else ""
        name = str(name() if callable(name) else name)
        if isinstance(example, torch.nn.Parameter):
            role = InputRole.PARAM
        elif isinstance(example, torch.Tensor) and (
                (node.meta.get("tensor_dict") or {}).get("_dynamo_static_input_type")
                or "_buffers" in name):
            role = InputRole.BUFFER
        else:
            role = InputRole.INPUT
        out.append((role, source_name(name) if name else None))
    return out


@dataclass
class _JointPlans:
    """What the partitioner planned for the two graphs (Note [Forward and
    backward placed as one]): the IR text each was planned from and its
    PlacementPlan, and the joint plan."""
    texts: dict[str, str]
    plans: dict[str, Any]
    joint: Any
    moved: tuple[int, int]


class _Capture:
    """The AOTAutograd compilers of one Dynamo graph; they share the plan and
    the forward's seq_nr -> layer map, which the backward needs."""

    def __init__(self, plan: PlanRecord, opts: CompileOptions,
                 dynamo_inputs: list[tuple[InputRole, str | None]]) -> None:
        self.plan = plan
        self.opts = opts
        self.dynamo_inputs = dynamo_inputs
        self.layer_of_seq: dict[int, str] = {}
        self.layer_device: dict[str, int] = {}  # planned: the forward's placement by layer
        self.executors: dict[str, Any] = {}  # planned: the Executor of each graph kind
        self.joint: _JointPlans | None = None
        self.pipe: Any = None  # pipeline: the PipelineStep the partitioner built
        self.pipe_texts: dict[str, str] = {}
        self.rank_device = "cpu"  # world: where this rank's tensors live
        self.num_fwd_outputs: int | None = None  # planned: the forward's user-visible outputs
        # pipeline: size symbols written as the batch's, and the placeholder
        # indices of the batched inputs (Note [One batch symbol] in compile/fx_import.py)
        self.symbol_aliases: dict[Any, Any] = {}
        self.batched_inputs: list[int] = []
        # pipeline: why the graph is placed instead of pipelined, if it is
        # (Note [A graph the pipeline cannot cut])
        self.unpipelined: str | None = None
        # the role of each forward input (Note [Input gradients over ranks])
        self.fw_input_roles: list[InputRole] = []

    def forward(self, gm: torch.fx.GraphModule, example_inputs: Sequence[Any]) -> Callable[..., Any]:
        return self.compile(gm, GraphKind.FORWARD)

    def backward(self, gm: torch.fx.GraphModule, example_inputs: Sequence[Any]) -> Callable[..., Any]:
        return self.compile(gm, GraphKind.BACKWARD)

    def inference(self, gm: torch.fx.GraphModule, example_inputs: Sequence[Any]) -> Callable[..., Any]:
        return self.compile(gm, GraphKind.INFERENCE)

    def describe_input(self, node: torch.fx.Node) -> tuple[InputRole, str | None]:
        """Role and name of an AOT placeholder, from its input descriptor."""
        desc = node.meta.get("desc")
        kind = type(desc).__name__
        if kind == "ParamAOTInput":
            return InputRole.PARAM, source_name(f"L['self'].{desc.target}")
        if kind == "BufferAOTInput":
            return InputRole.BUFFER, source_name(f"L['self'].{desc.target}")
        idx = getattr(desc, "idx", None) if kind == "PlainAOTInput" else None
        if desc is None:  # no descriptors (older torch): primals_K / argK_1 is input K-1
            m = re.fullmatch(r"primals_(\d+)|arg(\d+)_1", node.name)
            idx = int(m.group(1)) - 1 if m and m.group(1) else int(m.group(2)) if m else None
        if idx is not None and 0 <= idx < len(self.dynamo_inputs):
            return self.dynamo_inputs[idx]
        return InputRole.INPUT, None

    def compile(self, gm: torch.fx.GraphModule, kind: GraphKind) -> Callable[..., Any]:
        start = time.perf_counter()
        graph = None
        if kind is GraphKind.FORWARD:  # the backward's gradients follow these roles
            self.fw_input_roles = [self.describe_input(n)[0] for n in gm.graph.nodes
                                   if n.op == "placeholder"]
        try:
            if self.opts.whole_step and kind is GraphKind.INFERENCE:
                self.symbol_aliases, self.batched_inputs = batch_symbol_aliases(
                    gm, self.describe_input)
            pipelined = self.opts.whole_step and self.unpipelined is None
            imported = import_graph(gm, kind, f"{self.plan.name}_{kind.value}", self.describe_input,
                                    self.layer_of_seq, self.symbol_aliases if pipelined else None)
            graph = parse_graph(imported.text)
            placement = None
            if pipelined and kind is GraphKind.INFERENCE:
                self.unpipelined = why_not_pipelined(self.opts, self.plan, gm, graph,
                                                     self.describe_input)
            if self.opts.whole_step and self.unpipelined is None:
                compiled = self.pipelined(gm, graph, kind, imported)
            elif self.opts.planned:
                placement, compiled = self.place(graph, kind, imported, gm)
            else:
                runs, regions = graph, None
                if self.opts.kernels == "inductor":
                    runs, regions = graph_with_kernel_regions(graph)
                compiled = _C.CompiledGraph(runs, imported.output_map, imported.constants)
                compiled._boxed_call = True  # called as compiled(args); see bind_compile.cpp
                compiled.kernel_regions = regions  # they live as long as the compiled graph
                self.plan.add_kernel_regions(f"{kind.value} graph", regions)
        except UnsupportedGraph as e:
            return self.fallback(gm, kind, graph, e.what, str(e), e)
        except UnsupportedOpError as e:
            return self.fallback(gm, kind, graph, str(e), str(e), e)
        except InvalidIrError as e:  # an import bug: say so, but keep the model running
            return self.fallback(gm, kind, graph, "a graph modelpar could not import",
                                 f"{type(e).__name__}: {e}", e)
        if kind is GraphKind.FORWARD:
            self.layer_of_seq.update(imported.layer_of_seq)
        self.record(GraphRecord(kind.value, graph, "modelpar",
                                compile_seconds=time.perf_counter() - start,
                                placement=placement, executor=self.executors.get(kind.value)))
        return compiled

    def plan_joint(self, fw_module: torch.fx.GraphModule, bw_module: torch.fx.GraphModule,
                   num_fwd_outputs: int | None = None, pipeline: bool = False) -> None:
        """Plans the forward and backward graphs as one, from the
        partitioner (Note [Forward and backward placed as one]); with
        ``pipeline``, joins them for the pipeline passes instead
        (compile/pipeline_step.py), which plan per batch size at the first call.

        Raises:
            PlanDoesNotFitError: the step does not fit ``memory``.
            ConfigError: a bad option (pipeline: 1F1B with the loss outside,
                a static batch dimension).
        """
        from ..distributed.homes import homes_of
        from ..planning.placement import plan_joint
        name = self.plan.name
        self.num_fwd_outputs = num_fwd_outputs
        try:
            if pipeline:
                self.symbol_aliases, self.batched_inputs = batch_symbol_aliases(
                    fw_module, self.describe_input)
            aliases = self.symbol_aliases if pipeline else None
            fw = import_graph(fw_module, GraphKind.FORWARD, f"{name}_forward", self.describe_input,
                              self.layer_of_seq, aliases)
            seqs = {**self.layer_of_seq, **fw.layer_of_seq}
            bw = import_graph(bw_module, GraphKind.BACKWARD, f"{name}_backward",
                              self.describe_input, seqs, aliases)
            fw_graph, bw_graph = parse_graph(fw.text), parse_graph(bw.text)
        except (UnsupportedGraph, UnsupportedOpError, InvalidIrError):
            return  # fw_compiler / bw_compiler fall back, each graph on its own
        if pipeline:
            self.unpipelined = why_not_pipelined(
                self.opts, self.plan, fw_module, fw_graph, self.describe_input,
                returns_loss=_loss_tangent(bw_module) is not None)
            if self.unpipelined is not None:  # placed as without the pipeline option
                self.symbol_aliases, self.batched_inputs = {}, []
                return self.plan_joint(fw_module, bw_module, num_fwd_outputs)
        saved, tangents, gradients = link_joint_graphs(fw_module, bw_module, fw, bw,
                                                       num_fwd_outputs)
        if pipeline:
            from .pipeline_step import PipelineStep
            step = PipelineStep(self.opts, self.plan, name)
            step.rank_device = self.rank_device
            loss = _loss_tangent(bw_module)
            loss_tangent = (None if loss is None or loss[1] not in bw.value_names
                            else (loss[0], bw.value_names[loss[1]]))
            step.join(fw_graph, bw_graph, fw_module, bw_module, num_fwd_outputs or 0, saved,
                      tangents, fw.output_map, bw.output_map, loss_tangent, fw.constants,
                      bw.constants)
            step.batched_inputs = self.batched_inputs
            self.pipe = step
            self.pipe_texts = {"forward": fw.text, "backward": bw.text}
            return
        joint, fw_plan, bw_plan, moved_layer, moved_param = plan_joint(
            fw_graph, bw_graph, saved, tangents, gradients, devices=self.opts.devices,
            memory=self.opts.memory, placer=self.opts.placer or "m-etf",
            machine=machine_for_options(self.opts),
            dump_dir=self.opts.dump_dir or "",
            # Costs and memory at this call's sizes, not at 1 per symbol.
            symbol_sizes=symbol_sizes(fw_module, bw_module),
            # Note [One home per parameter] (distributed/homes.py): a training step
            # compiled again (Dynamo's recompile at a new batch size, with a
            # dynamic batch) keeps the layers of the function's earlier ones
            # and binds each parameter on the rank whose optimizer owns it
            # (its gradient made there), whatever reads it first now.
            pinned_layers=_world_layers.get(self.plan_key()) if self.opts.world else None,
            pinned_inputs=homes_of(self.plan_key()) if self.opts.world else None,
            # Note [Receiving in send order]: what a rank runs is simulated
            receive_in_send_order=self.opts.world)
        self.joint = _JointPlans({"forward": fw.text, "backward": bw.text},
                                 {"forward": fw_plan, "backward": bw_plan}, joint,
                                 (moved_layer, moved_param))
        self.plan.joint = joint
        self.plan.joint_links = {"saved": saved, "tangents": tangents, "gradients": gradients}

    def pipelined(self, gm: torch.fx.GraphModule, graph: Any, kind: GraphKind,
                  imported: Any) -> Callable[..., Any]:
        """The compiled callable of a graph under the ``pipeline`` option:
        the PipelineStep's forward / backward (the partitioner joined the
        two graphs), or an inference graph pipelined on its own.

        Raises:
            UnsupportedOpError: a training graph the partitioner could not
                import (it then has no PipelineStep), so it falls back.
        """
        from .pipeline_step import PipelineStep
        if kind is GraphKind.INFERENCE:
            step = PipelineStep(self.opts, self.plan, self.plan.name)
            step.rank_device = self.rank_device
            step.inference(graph, gm, imported.output_map, imported.constants)
            step.batched_inputs = self.batched_inputs
            return step.forward()
        pipe = self.pipe
        if pipe is None or self.pipe_texts.get(kind.value) != imported.text:
            raise UnsupportedOpError(f"modelpar pipeline: the {kind.value} graph is not the one "
                                     "the partitioner joined, so it cannot be pipelined")
        if kind is GraphKind.FORWARD:
            return pipe.forward()
        return pipe.backward()

    def place(self, graph: Any, kind: GraphKind, imported: Any,
              gm: torch.fx.GraphModule) -> tuple[Any, "MultiDeviceGraph"]:
        """The plan of ``graph`` on ``opts.devices`` devices, and the
        graph bound to an Executor on ``opts.device_map``.

        Note [Forward and backward placed as one]: AOTAutograd's partitioner
        splits the joint graph into a forward, which returns the values it
        saves, and a backward, which takes them. ``plan_joint`` (called from
        the wrapped ``partition_fn``, before either compiler) imports both,
        joins them into one IR graph (the backward's saved-value
        placeholders *are* the forward values of the same FX name; tangents
        are inputs), plans it once with plan() and splits the placement
        (passes/plan_joint.h): a layer's backward runs on its forward's device
        (coarsening groups a layer's nodes across phases; planJoint moves any
        that are not), each gradient is produced on its parameter's device,
        and the backward's input for a saved value is bound on the device
        that produced it: the Executor places an input on its ``device``
        attribute, so nothing moves between the two graphs. The forward and
        backward compilers then bind the stashed Programs, when the graph
        they get is the one planned (its IR text is the same).

        Note [Backward on its forward's device]: the fallback when there is
        no joint plan (a graph the partitioner's import could not take, or a
        compiler handed a different graph): each graph is planned alone; the
        forward's layer -> device map (the device of each layer's first
        node) is passed as ``pinned_layers`` when the backward is planned
        (PlanOptions::pinned_layers). Inference graphs are planned alone.
        """
        from ..runtime.executor import Executor, threads_per_worker
        from ..planning.placement import plan_graph
        joint = self.joint if kind is not GraphKind.INFERENCE else None
        if joint is not None and joint.texts.get(kind.value) == imported.text:
            placement = joint.plans[kind.value]
        else:
            pinned = self.layer_device if kind is GraphKind.BACKWARD else None
            if self.opts.world and kind is GraphKind.INFERENCE:
                # Note [One home per parameter] (distributed/homes.py): an inference
                # graph keeps the training step's layer -> device map.
                pinned = _world_layers.get(self.plan_key()) or None
            placement = plan_graph(graph, devices=self.opts.devices,
                                   memory=self.opts.memory,
                                   machine=machine_for_options(self.opts),
                                   placer=self.opts.placer or "m-etf",
                                   dump_dir=self.opts.dump_dir or "", pinned_layers=pinned,
                                   receive_in_send_order=self.opts.world)
        if kind is not GraphKind.BACKWARD:
            self.layer_device.update(placement.layer_devices)
        if self.opts.world and kind is GraphKind.FORWARD:
            _world_layers.setdefault(self.plan_key(), {}).update(placement.layer_devices)
        if self.opts.world:
            from ..distributed.homes import keep_homes
            if kind is not GraphKind.BACKWARD:
                placement = keep_homes(placement, self.plan_key(),
                                       training=kind is GraphKind.FORWARD)
            return placement, self.on_ranks(placement.program, kind, imported,
                                            scalar_outputs(gm, imported.output_map))
        def make_executor() -> Any:
            return Executor(placement.program, device_map=self.opts.executor_device_map,
                            threads_per_device=threads_per_worker(placement.program),
                            record_trace=self.opts.trace is not None,
                            replay="graphs" if self.opts.cuda_graphs else "streams",
                            kernels=self.opts.kernels,
                            measure_memory=self.opts.measure_memory)
        ex = make_executor()
        self.plan.add_kernel_regions(f"{kind.value} graph", ex.kernel_regions)
        self.executors[kind.value] = ex
        on_gpu = self.opts.executor_device_map.startswith("cuda")
        homes = output_homes(gm, kind, self.num_fwd_outputs) if on_gpu else None
        return placement, MultiDeviceGraph(ex, imported.output_map, imported.constants, self.plan, kind,
                                       homes, make_executor if self.opts.cuda_graphs else None,
                                       varying_inputs(placement.program.graph)
                                       if self.opts.cuda_graphs else ())

    def plan_key(self) -> tuple[str, str, int]:
        """The user function this capture compiles (same for its training and
        inference graphs)."""
        return (self.plan.filename, self.plan.function, self.plan.line)

    def on_ranks(self, program: Any, kind: GraphKind, imported: Any,
                 scalars: Sequence[int] = ()) -> RankGraph:
        """``program`` bound to this rank's RankExecutor (compile/rank_binding.py)."""
        ex, bound = bind_on_ranks(self.opts, self.plan, program, kind, imported, self.rank_device,
                                  self.fw_input_roles, self.num_fwd_outputs, scalars)
        self.plan.add_kernel_regions(f"{kind.value} graph", ex.kernel_regions)
        self.executors[kind.value] = ex
        return bound

    def fallback(self, gm: torch.fx.GraphModule, kind: GraphKind, graph: Any, what: str,
                 detail: str, error: Exception) -> Callable[..., Any]:
        return eager_fallback(self.opts, self.plan, gm, kind, graph, what, detail, error)

    def record(self, rec: GraphRecord) -> None:
        record_graph(self.plan, rec, self.opts.dump_dir)
