"""The ``torch.compile`` backend: ``torch.compile(model, backend="modelpar")``.

Dynamo hands the backend one FX graph per piece of the user's code (a graph
break starts a new piece; new input shapes that fail Dynamo's guards compile
a new one). For each, the backend:

1. validates ``options`` / ``mode`` (options.py) before any tracing;
2. runs AOTAutograd, which functionalises the graph and yields ATen-level
   forward and backward graphs (or one inference graph under no_grad);
3. converts each to an ``ir::Graph`` (fx_import.py) and binds it to the C++
   interpreter (``_C.CompiledGraph``, every operator resolved now), which
   AOTAutograd then calls directly: no FX interpreter, no Python per op;
   With ``options={"devices": N}`` (N >= 2) each graph is instead planned
   by passes' plan() (``plan_graph``, the ``placer`` option) and run by the
   multi-device Executor on N CPU worker devices, built once per graph
   (Note [Backward on its forward's device]);
4. records a ``Plan`` (plan.py) and, with ``dump_dir`` /
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
import warnings
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

import torch
import torch.fx

from . import _C
from .errors import InvalidIrError, UnsupportedOpError
from .fx_import import GraphKind, InputRole, UnsupportedGraph, import_graph, source_name
from .ir import parse_graph
from .options import CompileOptions, resolve_options
from .plan import GraphRecord, Plan, new_plan

__all__ = ["modelpar_backend"]

_warned: set[str] = set()


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
    plan = new_plan(*_user_code(gm), opts)
    capture = _Capture(plan, opts, _dynamo_inputs(gm, example_inputs))
    partition = (min_cut_rematerialization_partition if opts.partitioner == "min_cut"
                 else default_partition)
    aot = aot_autograd(fw_compiler=capture.forward, bw_compiler=capture.backward,
                       inference_compiler=capture.inference, partition_fn=partition,
                       # Buffer updates of inference graphs (BatchNorm's running
                       # stats under no_grad) stay in the graph as copy_ nodes.
                       keep_inference_input_mutations=True)
    return aot(gm, example_inputs)


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


class _MultiDevice:
    """A graph bound to a multi-device Executor, called boxed by
    AOTAutograd (``f(args)``, args emptied); per call only the arguments
    are passed on and the outputs picked."""

    def __init__(self, executor: Any, output_map: Sequence[int],
                 constants: Sequence[torch.Tensor]) -> None:
        # In the instance __dict__: Dynamo's wrapper of the backward copies
        # it with functools.wraps, which misses class attributes.
        self._boxed_call = True
        self.executor = executor
        self.output_map = list(output_map)
        self.constants = list(constants)

    def __call__(self, args: list[Any]) -> list[Any]:
        inputs = list(args)
        args.clear()
        inputs.extend(self.constants)
        outs = self.executor.run(inputs)
        return [None if o < 0 else outs[o] for o in self.output_map]


class _Capture:
    """The AOTAutograd compilers of one Dynamo graph; they share the plan and
    the forward's seq_nr -> layer map, which the backward needs."""

    def __init__(self, plan: Plan, opts: CompileOptions,
                 dynamo_inputs: list[tuple[InputRole, str | None]]) -> None:
        self.plan = plan
        self.opts = opts
        self.dynamo_inputs = dynamo_inputs
        self.layer_of_seq: dict[int, str] = {}
        self.layer_device: dict[str, int] = {}  # devices > 1: the forward's placement by layer

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
        try:
            imported = import_graph(gm, kind, f"{self.plan.name}_{kind.value}", self.describe_input,
                                    self.layer_of_seq)
            graph = parse_graph(imported.text)
            placement = None
            if self.opts.devices > 1:
                placement, compiled = self.place(graph, kind, imported)
            else:
                compiled = _C.CompiledGraph(graph, imported.output_map, imported.constants)
                compiled._boxed_call = True  # called as compiled(args); see bind_compile.cpp
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
                                placement=placement))
        return compiled

    def place(self, graph: Any, kind: GraphKind, imported: Any) -> tuple[Any, "_MultiDevice"]:
        """Plans ``graph`` on ``opts.devices`` devices and binds it to an
        Executor on CPU workers.

        Note [Backward on its forward's device]: the forward is placed by the
        placer; the layer -> device map of that placement (the device of each
        layer's first node) is passed as ``pinned_layers`` when the backward
        is planned, so plan() moves every backward node of a layer to its
        forward's device after its placer runs (PlanOptions::pinned_layers)
        and lowers that. Saved activations are returned by the forward
        Executor and handed to the backward one as inputs (all CPU memory);
        gradients are produced on their layer's device. Backward nodes with
        no layer stay where the placer put them.
        """
        from .executor import Executor
        from .planning import plan_graph
        pinned = self.layer_device if kind is GraphKind.BACKWARD else None
        placement = plan_graph(graph, devices=self.opts.devices, placer=self.opts.placer or "m-etf",
                               dump_dir=self.opts.dump_dir or "", pinned_layers=pinned)
        if kind is not GraphKind.BACKWARD:
            self.layer_device.update(placement.layer_devices)
        ex = Executor(placement.program, devices="cpu-workers", threads_per_device=1)
        return placement, _MultiDevice(ex, imported.output_map, imported.constants)

    def fallback(self, gm: torch.fx.GraphModule, kind: GraphKind, graph: Any, what: str,
                 detail: str, error: Exception) -> Callable[..., Any]:
        plan = self.plan
        where = f"the {kind.value} graph of {plan.function} ({plan.filename}:{plan.line})"
        if self.opts.strict:
            raise UnsupportedOpError(f"modelpar strict: {where} cannot run on the modelpar "
                                     f"runtime: {detail}") from error
        if what not in _warned:
            _warned.add(what)
            warnings.warn(f"modelpar: {detail}; {where} runs eagerly instead of on the modelpar "
                          "runtime (this warning is shown once; options={'strict': True} makes "
                          "it an error)", stacklevel=2)
        self.record(GraphRecord(kind.value, graph, "eager", reason=detail))
        if self.opts.dump_dir and graph is None:  # no IR: dump the FX graph that runs instead
            out = Path(self.opts.dump_dir)
            out.mkdir(parents=True, exist_ok=True)
            (out / f"{plan.name}.{kind.value}.eager-fx.txt").write_text(
                f"# runs eagerly: {detail}\n{gm.print_readable(print_output=False)}",
                encoding="utf-8")
        from functorch.compile import make_boxed_func
        return make_boxed_func(gm.forward)

    def record(self, rec: GraphRecord) -> None:
        self.plan.graphs[rec.kind] = rec
        if self.opts.dump_dir and rec.graph is not None:
            out = Path(self.opts.dump_dir)
            out.mkdir(parents=True, exist_ok=True)
            (out / f"{self.plan.name}.{rec.kind}.txt").write_text(rec.text, encoding="utf-8")
