"""Kernel regions compiled by Inductor (``options={"kernels": "inductor"}``).

Note [Kernel regions]: after placement, pipelining and lowering, each
maximal run of one device's instructions between transfers (of one phase
and one micro-batch) becomes one node of the program, ``modelpar_kernels::
region(key, tensors, sizes) -> outputs`` (the C++ rewrite: passes/lower/
kernel_regions.h). The executor calls it as it calls any operator, through
the dispatcher; the operator, registered here, runs the region's FX graph
compiled by Inductor (C++/OpenMP kernels on CPU, Triton on CUDA).

- A node joins a region when it is a functional ATen operator on tensors
  that draws no random numbers (kernels/region_graph.py). In-place ops stay
  out so that Inductor sees pure functions; random ops stay out so that they
  keep the per-node seeding of Note [Reproducible random ops over workers]
  (each micro-batch's dropout mask equals the one-device plan's); a node
  that makes a size (the symbolic batch's ``sym_*`` ops) stays out because
  a region's outputs are tensors. A node may read sizes (a view to
  ``[B, 128, 256]``): the region gets their values with its tensors.
- A region is compiled at its first call, from the tensors and sizes it
  gets (shapes, strides, dtypes, devices, the sizes' values: what Inductor
  specialises on; the sizes are written into the graph as constants), under
  a lock (one compile at a time in the process) and without autograd.
  Compiled artifacts are shared by every region whose FX code and input
  signature are equal: every micro-batch of a stage with the same size uses
  one. A new signature (another batch size) compiles again, like Inductor's
  own recompiles.
- A region Inductor cannot compile runs its FX graph op by op (in Python)
  and its report says why; nothing is silently different.
- Cutting at transfers keeps every send as early as the plan made it: a
  value another device waits for is never produced inside a region. CUDA
  graph replay captures a region's kernels as it captures any operator's.
- Planning costs the program before the regions exist; the simulator and
  the search do not yet see what Inductor's fusion saves.
"""

from __future__ import annotations

import collections
import contextlib
import threading
import weakref
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from typing import Any

import torch
import torch.fx

from .. import _C
from .region_graph import NodeCall, region_module, why_not_fusible

__all__ = ["KernelRegion", "KernelRegions", "with_kernel_regions",
           "graph_with_kernel_regions"]

_LIBRARY = torch.library.Library("modelpar_kernels", "DEF")
_LIBRARY.define("region(int key, Tensor[] inputs, SymInt[] sizes) -> Tensor[]")

_LIVE: "weakref.WeakValueDictionary[int, KernelRegion]" = weakref.WeakValueDictionary()
_next_key = 0  # the first key of the next program's regions (under _KEY_LOCK)
_KEY_LOCK = threading.Lock()
_COMPILE_LOCK = threading.Lock()
# (FX code, input signature) -> compiled callable; shared by regions.
_ARTIFACTS: "collections.OrderedDict[tuple[str, Any], Any]" = collections.OrderedDict()
_MAX_ARTIFACTS = 512

Signature = tuple[tuple[tuple[tuple[int, ...], tuple[int, ...], torch.dtype, torch.device], ...],
                  tuple[int, ...]]


def _signature(inputs: Sequence[torch.Tensor], sizes: Sequence[int]) -> Signature:
    return (tuple((tuple(t.shape), t.stride(), t.dtype, t.device) for t in inputs), tuple(sizes))


@dataclass(eq=False)
class KernelRegion:
    """One region: which nodes, on which device, and how it ran."""
    key: int
    device: int
    nodes: list[int]
    inputs: list[int]      # tensors, then sizes (value ids)
    num_tensor_inputs: int
    outputs: list[int]
    calls: Sequence[NodeCall] = field(repr=False)
    #: Signatures compiled for this region (each shared with equal regions).
    compiled: dict[Signature, Any] = field(default_factory=dict, repr=False)
    #: Why Inductor could not compile it (it then runs op by op), or None.
    failure: str | None = None

    @property
    def ops(self) -> list[str]:
        return [f"{self.calls[n]['op']}{'.' + self.calls[n]['overload'] if self.calls[n]['overload'] else ''}"
                for n in self.nodes]

    def __call__(self, inputs: Sequence[torch.Tensor], sizes: Sequence[int]) -> list[torch.Tensor]:
        sig = _signature(inputs, sizes)
        fn = self.compiled.get(sig)
        if fn is None:
            fn = self._compile(inputs, sizes, sig)
        with torch.no_grad():
            return list(fn(*inputs))

    def _compile(self, inputs: Sequence[torch.Tensor], sizes: Sequence[int], sig: Signature) -> Any:
        with _COMPILE_LOCK:
            fn = self.compiled.get(sig)
            if fn is not None:
                return fn
            device = inputs[0].device if inputs else None
            n = self.num_tensor_inputs
            gm = region_module(self.calls, self.nodes, self.inputs[:n], self.outputs, device,
                               dict(zip(self.inputs[n:], (int(s) for s in sizes))))
            # Note [A region's kernels use its worker's threads]
            threads = torch.get_num_threads()
            key = (gm.code, sig, threads)
            fn = _ARTIFACTS.get(key)
            if fn is None:
                fn, self.failure = _inductor_compile(gm, [t.detach() for t in inputs], threads)
                _ARTIFACTS[key] = fn
                while len(_ARTIFACTS) > _MAX_ARTIFACTS:
                    _ARTIFACTS.popitem(last=False)
            self.compiled[sig] = fn
            return fn


# Note [Inductor's CPU kernels release the GIL]: Inductor calls each fused
# CPU kernel through a small Python binding (CppPythonBindingsCodeCache)
# that keeps the GIL for the whole kernel. Two executor workers calling
# their regions at once then take turns, and a pipeline on CPU workers runs
# its stages one after the other (measured: a ResNet's 1F1B step at 1.7x
# the ATen one). The kernel reads only the raw pointers its binding parsed
# from the arguments, which the caller's frame keeps alive, so the binding
# compiled for a region parses them with the GIL and releases it around the
# kernel. Only bindings generated while a region compiles change.
_RELEASING_CALL = ("auto modelpar_args = std::make_tuple({}); Py_BEGIN_ALLOW_THREADS "
                   "std::apply(kernel, modelpar_args); Py_END_ALLOW_THREADS Py_RETURN_NONE;")


@contextlib.contextmanager
def _cpu_kernels_release_the_gil() -> Iterator[None]:
    try:
        from torch._inductor.codecache import CppPythonBindingsCodeCache as bindings
    except ImportError:  # another torch: its bindings as they are
        yield
        return
    held = bindings.__dict__.get("call_entry_function")
    if held != "kernel({}); Py_RETURN_NONE;":  # not the template this was written for
        yield
        return
    bindings.call_entry_function = _RELEASING_CALL
    try:
        yield
    finally:
        bindings.call_entry_function = held


def _inductor_compile(gm: torch.fx.GraphModule, examples: list[torch.Tensor],
                      threads: int) -> tuple[Any, str | None]:
    """(Inductor's compiled ``gm``, None), or (``gm`` itself, why not).

    Note [A region's kernels use its worker's threads]: Inductor's CPU
    kernels fix their OpenMP thread count when they are generated (its
    ``cpp.threads``, else the compiling thread's ``torch.get_num_threads()``).
    An executor's CPU worker runs with its share of the process's threads
    (Note [Every core used]: one each for 2 workers on 2 cores); a kernel
    generated for all of them would run 2 workers x 2 OpenMP threads on 2
    cores. So a region compiles for the thread count of the thread that
    first calls it, and that count is part of the artifact's key.

    Inductor's layout optimisation (convolutions in channels-last, with
    transposes around them) is off: a region's convolutions see small
    micro-batches on one thread, where the transposes cost more than the
    layout saves (a ResNet's 1F1B regions ran at 1.6x with it; on one
    device with 2 threads it made no difference).

    Note [Regions compile on a thread of their own]: the first call of a
    region runs on whatever thread calls the operator: an executor worker,
    or the caller's own thread under the one-device interpreter, where
    AOTAutograd's runtime wrappers may have left dispatch state (Inductor
    then fails with "Attempting to use FunctionalTensor on its own"). A new
    thread starts with none of it: no dispatch modes, grad mode on, no
    excluded keys."""
    result: list[Any] = [gm, None]

    def compile_here() -> None:
        try:
            with torch.no_grad(), _cpu_kernels_release_the_gil():
                result[0] = torch._inductor.compile(gm, examples, options={"cpp.threads": threads, "layout_optimization": False})
        except Exception as e:  # noqa: BLE001  (any compiler failure: the region runs op by op)
            text = str(e).strip()
            first = text.splitlines()[0] if text else ""
            result[1] = f"{type(e).__name__}: {first}"[:300]

    thread = threading.Thread(target=compile_here, name="modelpar-inductor-compile")
    thread.start()
    thread.join()
    return result[0], result[1]


def _run_region(key: int, inputs: list[torch.Tensor], sizes: list[int]) -> list[torch.Tensor]:
    region = _LIVE.get(key)
    if region is None:
        raise RuntimeError(f"modelpar: kernel region {key} is gone: the program that made it was "
                           "dropped (run the program through the executor it was built for)")
    return region(inputs, sizes)


_LIBRARY.impl("region", _run_region, "CompositeExplicitAutograd")
_LIBRARY.impl("region", _run_region, "Autograd")


@dataclass(eq=False)
class KernelRegions:
    """The kernel regions of one program; held by its executor (the regions
    live as long as it does)."""
    regions: list[KernelRegion]
    #: Nodes left to run op by op, by why (a node that could be compiled but
    #: stands alone between transfers counts as "alone").
    op_by_op: dict[str, int]
    num_nodes: int

    @property
    def compiled_artifacts(self) -> int:
        """Distinct Inductor artifacts the regions run (regions with equal
        code and inputs share one)."""
        return len({id(fn) for r in self.regions for fn in r.compiled.values()
                    if not isinstance(fn, torch.fx.GraphModule)})

    @property
    def failed(self) -> list[KernelRegion]:
        return [r for r in self.regions if r.failure is not None]

    def summary(self) -> str:
        fused = sum(len(r.nodes) for r in self.regions)
        text = (f"kernels: inductor, {len(self.regions)} regions holding {fused} of "
                f"{self.num_nodes} nodes, {self.compiled_artifacts} compiled artifacts")
        if self.op_by_op:
            text += "; op by op: " + ", ".join(f"{n} ({why})" for why, n in
                                                sorted(self.op_by_op.items(), key=lambda kv: -kv[1]))
        for r in self.failed:
            text += f"\n  region {r.key} (device {r.device}, {len(r.nodes)} ops) runs op by op: {r.failure}"
        return text

    def __str__(self) -> str:
        return self.summary()


def with_kernel_regions(program: Any, min_nodes: int = 2) -> tuple[Any, KernelRegions]:
    """``program`` with its kernel regions compiled by Inductor (Note [Kernel
    regions]), and their report. Keep the report as long as the program runs."""
    calls = _C.node_calls(program.graph)
    reasons = [why_not_fusible(c) for c in calls]
    global _next_key
    with _KEY_LOCK:  # room for every region of this program: at most one per node
        first_key, _next_key = _next_key, _next_key + len(calls) + 1
    fused, found = _C.fuse_kernel_regions(program, [r is None for r in reasons], first_key,
                                          min_nodes)
    regions = [KernelRegion(r["key"], r["device"], list(r["nodes"]), list(r["inputs"]),
                            r["num_tensor_inputs"], list(r["outputs"]), calls) for r in found]
    in_region = {n for r in regions for n in r.nodes}
    op_by_op: collections.Counter[str] = collections.Counter()
    for n, why in enumerate(reasons):
        if n not in in_region:
            op_by_op[why or "alone between transfers"] += 1
    for r in regions:
        _LIVE[r.key] = r
    return fused, KernelRegions(regions, dict(op_by_op), len(calls))


def graph_with_kernel_regions(graph: Any, min_nodes: int = 2) -> tuple[Any, KernelRegions]:
    """A one-device graph with its kernel regions (one per run of compilable
    nodes: the whole graph when every node is), for the one-device
    interpreter."""
    program, report = with_kernel_regions(_C.one_device_program(graph), min_nodes)
    return program.graph, report
