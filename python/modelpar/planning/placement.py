"""Model-parallel plans from Python: ``plan_graph`` runs the sequence of passes of
``passes/plan_placement.h`` (cost → coarsen → m-TOPO | m-ETF | m-SCT → lower →
simulate) on an IR graph; ``PlanRecord.place`` (compile/records.py) does it for the
graphs a ``torch.compile`` plan holds (``modelpar.plans()[-1].place(devices=4)``).
This module never imports compile/records.py (which imports it).
``plan_joint`` places a training step's forward and backward graphs as one
(passes/plan_joint.h; what ``torch.compile`` with ``devices`` > 1 runs).

Example::

    g = modelpar.ir.load_graph("examples/ir/mlp_step.txt")
    p = modelpar.plan_graph(g, devices=2, memory="16GiB", placer="m-etf")
    print(p)                      # units per device, step time, speed-up, memory, pass stats
    p.placement                   # {"h": 0, "a": 0, "p": 1, ...}
    p.program                     # the lowered modelpar.Program (send/recv/free per device)
    p.write_trace("step.json")    # Chrome / Perfetto trace of the simulated step
"""

from __future__ import annotations

import os
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any, Union

import torch

from .. import _C
from ..deprecation import renamed_names
from ..errors import ConfigError
from ..ir.text import Graph, load_graph
from ..ir.torch_names import TORCH_DTYPES

__all__ = ["PLACERS", "PlacementPlan", "JointPlacement", "calibrated_machine", "example_inputs",
           "parse_bytes", "plan_graph", "plan_joint", "profile_graph"]

#: The placers plan_graph knows, by name.
from .option_names import PLACERS, check_devices  # noqa: E402  (one definition, passes/option_names.h)

#: The plan of one graph (C++ passes::Plan): ``str(p)`` is its summary; see
#: ``program``, ``placement``, ``order``, ``step_time_us``,
#: ``single_device_us``, ``speedup``, ``units_per_device``, ``peak_bytes``,
#: ``capacity_bytes``, ``stats``, ``trace()``, ``write_trace(path)``.
PlacementPlan = getattr(_C, "PlacementPlan", None)

MemoryArg = Union[None, int, str, Sequence[Union[int, str]]]


def require_passes() -> None:
    if PlacementPlan is None:
        raise ConfigError("modelpar plan: this build has no passes/ (MODELPAR_WITH_PASSES=OFF); "
                          "rebuild with it to plan model parallelism")


def parse_bytes(size: int | str) -> int:
    """A size in bytes from an int or a string such as ``"16GiB"``,
    ``"512 MiB"``, ``"1.5GB"`` (KiB..TiB: powers of 1024; KB..TB: of 1000).

    Raises:
        ConfigError: anything else (the message lists the accepted forms).
    """
    if isinstance(size, bool) or not isinstance(size, (int, str)):
        raise ConfigError(f"modelpar: {size!r} is not a size; give an int of bytes or a string "
                          f"such as \"16GiB\"")
    if isinstance(size, int):
        if size < 0:
            raise ConfigError(f"modelpar: {size} is not a size; sizes are >= 0 bytes")
        return size
    require_passes()
    return _C.parse_bytes(size)


def memory_list(memory: MemoryArg) -> list[int]:
    if memory is None:
        return []
    if isinstance(memory, (int, str)):
        return [parse_bytes(memory)]
    if isinstance(memory, Sequence):
        return [parse_bytes(m) for m in memory]
    raise ConfigError(f"modelpar plan: memory={memory!r} is not valid; memory takes None, a size "
                      f"(int bytes or \"16GiB\") for every device, or a list with one per device")


def calibrated_machine(kernels: Sequence[tuple[float, float, float]],
                       transfers: Sequence[tuple[float, float]], *, memory: int | str = "16GiB",
                       name: str = "dev", extra_latency_us: float = 0.0) -> str:
    """A one-device machine profile (JSON text, for ``machine=``) fitted to
    measurements by passes/cost/calibrate.h's least squares: ``kernels`` are
    ``(bytes moved, flops, time_us)`` samples (time = bytes / bandwidth +
    flops / peak + launch), ``transfers`` ``(bytes, time_us)`` samples (time
    = latency + bytes / bandwidth). ``plan_graph`` replicates the device to
    as many devices as asked for, joined by the fitted link; add a fixed
    per-transfer cost the samples miss with ``extra_latency_us``.

    Raises:
        ConfigError: too few samples, or samples from which no bandwidth or
            speed can be inferred.
    """
    require_passes()
    return _C.calibrated_machine([tuple(map(float, k)) for k in kernels],
                                 [tuple(map(float, t)) for t in transfers], parse_bytes(memory),
                                 name, float(extra_latency_us))


def plan_graph(graph: Graph | str | os.PathLike[str], devices: int | None = None,
               memory: MemoryArg = None, placer: str = "m-etf",
               machine: str | os.PathLike[str] | None = None,
               trace: str | os.PathLike[str] | None = None, *, coarsen: bool = True,
               dump_dir: str | os.PathLike[str] | None = None,
               lp_time_limit_s: float = 20.0,
               pinned_layers: dict[str, int] | None = None,
               receive_in_send_order: bool = False) -> PlacementPlan:
    """Places ``graph`` on ``devices`` logical devices and simulates the step.

    Args:
        graph: a ``modelpar.Graph``, or the path of an IR text file. It is not
            modified (the pipeline works on a copy).
        devices: logical devices (1..64); None: the machine profile's count,
            or 1 without a profile.
        memory: capacity per device: None (the profile's, else 16 GiB), a
            size for every device (``"16GiB"``, ``512 << 20``), or a list with
            one size per device.
        placer: ``"m-topo"``, ``"m-etf"`` or ``"m-sct"`` (Baechi's placers).
        machine: a machine profile JSON (passes/README.md); a one-device
            profile is replicated to ``devices`` devices.
        trace: write the Chrome trace of the simulated step there.
        coarsen: group nodes into placement units first (layers,
            co-placement, fusion); False places every node on its own.
        dump_dir: write the IR after every pass there (default:
            ``$MODELPAR_DUMP_DIR``; ``""``: no dumps).
        lp_time_limit_s: m-SCT's LP time limit.
        pinned_layers: layer -> device; the nodes of those layers run there
            whatever the placer chose (PlanOptions::pinned_layers).
        receive_in_send_order: plan for the ranks of a process group: each
            device's receives in their senders' order after lowering, as the
            rank executor runs them (Note [Receiving in send order]), so that
            the simulated peaks and the memory check are of what runs.

    Raises:
        ConfigError: a bad option (named, with its valid values), an
            unreadable machine profile, or a trace that cannot be written.
        PlanDoesNotFitError: no placement fits the memory; the message names
            the layer, the device, the bytes needed and available.
        ParseError, InvalidIrError: the graph text or graph is invalid.
        OSError: the graph file cannot be read.
    """
    require_passes()
    if not isinstance(graph, Graph):
        graph = load_graph(graph)
    if devices is not None:
        check_devices("plan", devices)
    if not isinstance(placer, str):
        raise ConfigError(f"modelpar plan: placer={placer!r} is not valid; placer takes one of "
                          + ", ".join(repr(p) for p in PLACERS))
    p = _C.plan_graph(graph, devices, memory_list(memory), placer,
                      None if machine is None else os.fspath(machine), bool(coarsen),
                      None if dump_dir is None else os.fspath(dump_dir), float(lp_time_limit_s),
                      [(str(k), int(v)) for k, v in (pinned_layers or {}).items()],
                      bool(receive_in_send_order))
    if trace is not None:
        p.write_trace(os.fspath(trace))
    return p


def plan_joint(forward: Graph, backward: Graph, saved: Sequence[tuple[str, str]],
               tangents: Sequence[tuple[str, str]] = (), gradients: Sequence[tuple[int, int]] = (), devices: int | None = None,
               memory: MemoryArg = None, placer: str = "m-etf",
               machine: str | os.PathLike[str] | None = None, *, coarsen: bool = True,
               dump_dir: str | os.PathLike[str] | None = None,
               lp_time_limit_s: float = 20.0,
               symbol_sizes: dict[str, int] | None = None,
               pinned_layers: dict[str, int] | None = None,
               pinned_inputs: dict[str, int] | None = None,
               receive_in_send_order: bool = False) -> tuple[Any, Any, Any, int, int]:
    """Plans a training step's forward and backward graphs as one
    (passes/plan_joint.h): joins them (``saved``: ``(backward input, forward
    value)`` name pairs; ``tangents``: ``(backward input, forward output)``
    pairs, each tangent the gradient of that output, made after it in the
    joint graph; other backward inputs stay inputs), plans the
    joint graph with ``plan_graph``'s pipeline, moves any backward node off
    its layer's forward device back to it and each gradient's producer to
    its parameter's device (``gradients``: ``(backward output index,
    forward input index)``), and splits the placement into one plan per
    graph; saved values are bound on the device that produced them.
    ``symbol_sizes`` gives symbolic dimensions their sizes for the cost model
    (``{"s0": 64}``; others count as 1): torch.compile passes the call's.
    ``pinned_layers``: layer -> device, as for ``plan_graph``;
    ``receive_in_send_order``: as for ``plan_graph`` (planned for ranks);
    ``pinned_inputs``: forward input name -> the device it is bound on (its
    gradient is made there too).

    Returns:
        ``(joint, forward, backward, moved_to_layer_device,
        moved_to_parameter_device)``: three ``PlacementPlan`` s (the joint's
        step is the training step's) and the two move counts.

    Raises:
        ConfigError: a bad option.
        PlanDoesNotFitError: the joint graph does not fit the memory (names
            the layer, the device and the bytes).
        InvalidIrError: a link naming no value, or of mismatched types.
    """
    require_passes()
    if devices is not None:
        check_devices("plan", devices)
    return _C.plan_joint(forward, backward, [(str(b), str(f)) for b, f in saved],
                         [(str(b), str(f)) for b, f in tangents], [(int(o), int(i)) for o, i in gradients], devices, memory_list(memory),
                         placer, None if machine is None else os.fspath(machine), bool(coarsen),
                         None if dump_dir is None else os.fspath(dump_dir), float(lp_time_limit_s),
                         dict(symbol_sizes or {}),
                         [(str(k), int(v)) for k, v in (pinned_layers or {}).items()],
                         [(str(k), int(v)) for k, v in (pinned_inputs or {}).items()],
                         bool(receive_in_send_order))


def example_inputs(graph: Graph, symbol_sizes: dict[str, int] | None = None,
                   seed: int = 0) -> list[Any]:
    """Inputs of ``graph``'s types for timing it: floating tensors
    ``randn``, integer and bool tensors zeros (a valid index anywhere),
    ``int`` inputs and symbolic sizes from ``symbol_sizes`` (by name, else 1).

    Raises:
        ConfigError: an input of a dtype torch cannot make.
    """
    require_passes()
    sizes = dict(symbol_sizes or {})
    gen = torch.Generator().manual_seed(seed)
    out: list[Any] = []
    for spec in _C.graph_input_specs(graph):
        kind = spec["kind"]
        if kind == "int":
            out.append(int(sizes.get(spec["name"], 1)))
        elif kind == "float":
            out.append(1.0)
        elif kind == "bool":
            out.append(False)
        else:
            dtype = TORCH_DTYPES.get(spec["dtype"])
            if dtype is None:
                raise ConfigError(f"modelpar profile: input %{spec['name']} has dtype "
                                  f"{spec['dtype']}, which example_inputs cannot make")
            shape = [d if isinstance(d, int) else int(sizes.get(d, 1)) for d in spec["shape"]]
            if dtype.is_floating_point:
                out.append(torch.randn(shape, generator=gen).to(dtype))
            else:
                out.append(torch.zeros(shape, dtype=dtype))
    return out


def profile_graph(graph: Graph, inputs: Sequence[Any] | None = None, *, runs: int = 5,
                  threads_per_device: int = 1) -> Graph:
    """Times every node of ``graph`` on a CPU worker of the executor and
    returns a copy with the median times stored as profiled costs (bytes
    from the analytic model), so that ``plan_graph`` plans with measured
    times: the cost model's first source.

    Args:
        graph: the graph to time.
        inputs: its inputs; None: ``example_inputs(graph)``.
        runs: timed runs after one warm-up; each node's time is the median.
        threads_per_device: intra-op threads of the worker.

    Raises:
        ExecutionError: the graph fails to run on the inputs.
    """
    return profile_graph_gaps(graph, inputs, runs=runs, threads_per_device=threads_per_device)[0]


def profile_graph_gaps(graph: Graph, inputs: Sequence[Any] | None = None, *, runs: int = 5,
                       threads_per_device: int = 1) -> tuple[Graph, float]:
    """``profile_graph``, and the executor's time between ops per node
    (profile_graph_times)."""
    times, gap = profile_graph_times(graph, inputs, runs=runs,
                                     threads_per_device=threads_per_device)
    return _C.apply_profile(graph, times), gap


class InputRewind:
    """The inputs of ``graph`` that its in-place nodes write (``copy_`` of a
    functionalized mutation, an in-place op whose first argument is a graph
    input or a view of one: op_family's writtenInput, the test the
    placement and the pipeline pin these writes by), saved from ``args``;
    ``restore()`` writes the saved values back.

    Note [Timing a step that writes its inputs]: the timers run one step
    many times on one set of inputs. A step that advances state held in an
    input (a static KV cache's position, batch norm's running statistics)
    would run its later repetitions on state the earlier ones advanced: a
    cache position past its end made the step fail (index_copy out of
    bounds) and a search of such a model stop. Each repetition starts from
    the saved values."""

    def __init__(self, graph: Graph, args: Sequence[Any]) -> None:
        self.saved = [(args[i], args[i].detach().clone()) for i in _C.graph_written_inputs(graph)
                      if i < len(args) and isinstance(args[i], torch.Tensor)]

    def restore(self) -> None:
        with torch.no_grad():
            for t, v in self.saved:
                t.copy_(v)


def profile_graph_times(graph: Graph, inputs: Sequence[Any] | None = None, *, runs: int = 5,
                        threads_per_device: int = 1) -> tuple[list[float], float]:
    """Each node's median time in microseconds on a CPU worker (-1: not
    timed), and the executor's time between ops per node: the
    median run minus the nodes' medians (frees, argument lists), divided by
    the nodes timed. Every op pays it, whatever its size, so it is part of
    the per-op overhead (strategy="auto" adds it to the machine's
    ``launch_overhead_us``: Note [The searched step] in compile/step_search.py).

    Raises:
        ExecutionError: the graph fails to run on the inputs.
    """
    require_passes()
    from ..runtime.executor import Executor

    program = plan_graph(graph, devices=1, coarsen=False, dump_dir="").program
    ex = Executor(program, device_map="cpu-workers", threads_per_device=threads_per_device,
                  record_trace=True)
    args = list(inputs) if inputs is not None else example_inputs(graph)
    rewind = InputRewind(graph, args)  # Note [Timing a step that writes its inputs]
    ex.run(list(args))
    rewind.restore()
    node_of = _C.program_run_nodes(program)[0]
    samples: list[list[float]] = [[] for _ in range(graph.num_nodes)]
    walls: list[float] = []
    for _ in range(max(1, runs)):
        t0 = time.perf_counter_ns()
        ex.run(list(args))
        walls.append((time.perf_counter_ns() - t0) / 1e3)
        rewind.restore()
        for node, span in zip(node_of, ex.last_trace()["host"][0]):
            if node >= 0 and span is not None:
                samples[node].append((span[1] - span[0]) / 1e3)
    times = [sorted(s)[len(s) // 2] if s else -1.0 for s in samples]
    timed = [t for t in times if t >= 0]
    gap = max(0.0, sorted(walls)[len(walls) // 2] - sum(timed)) / max(1, len(timed))
    return times, gap


@dataclass
class JointPlacement:
    """The plans of the graphs of one ``torch.compile`` plan (``PlanRecord.place``).

    Each graph (forward, backward, or inference) is planned on its own; the
    step time of training is forward + backward, one after the other. Values
    the forward saves for the backward are assumed to stay on the device
    that produced them (the transfers between the two graphs are not
    simulated)."""
    plan_index: int
    function: str
    plans: dict[str, PlacementPlan] = field(default_factory=dict)

    @property
    def step_time_us(self) -> float:
        return sum(p.step_time_us for p in self.plans.values())

    @property
    def single_device_us(self) -> float:
        return sum(p.single_device_us for p in self.plans.values())

    @property
    def speedup(self) -> float:
        step = self.step_time_us
        return self.single_device_us / step if step > 0 else 1.0

    def __getitem__(self, kind: str) -> PlacementPlan:
        return self.plans[kind]

    def summary(self) -> str:
        kinds = " + ".join(self.plans)
        lines = [f"modelpar placement of plan {self.plan_index} ({self.function}): {kinds}: "
                 f"simulated step {_micros(self.step_time_us)} (one device "
                 f"{_micros(self.single_device_us)}, speed-up {self.speedup:.2f}x)"]
        for kind, p in self.plans.items():
            lines.append(f"[{kind}]")
            lines.append(str(p).rstrip("\n"))
        return "\n".join(lines)

    def __str__(self) -> str:
        return self.summary()


def _micros(us: float) -> str:
    if us >= 1e6:
        return f"{us / 1e6:.3g} s"
    if us >= 1e3:
        return f"{us / 1e3:.3g} ms"
    return f"{us:.3g} us"


# Renamed after 0.1.0 ("captured" is what a front end does to a graph; this is
# the placement of a joint forward and backward).
__getattr__ = renamed_names(__name__, {"CapturedPlacement": "JointPlacement"})
