"""Options of ``torch.compile(model, backend="modelpar", options={...}, mode=...)``.

Every key is checked before anything is traced: an unknown key or a bad
value raises ``modelpar.ConfigError`` (a ``ValueError``) that lists the valid
keys or values. Keys that later work will use are accepted now; until they
work, giving them a non-default value raises ``ConfigError`` saying so, never
silently ignored.

| key | values | default | status |
|-----|--------|---------|--------|
| ``strict`` | bool | False | works: a graph the runtime cannot run is an error instead of running eagerly with a warning |
| ``dump_dir`` | path or None | ``$MODELPAR_DUMP_DIR`` | works: write every captured graph's IR text there (the FX code of a graph that runs eagerly) |
| ``partitioner`` | ``"default"``, ``"min_cut"`` | ``"default"`` | works: AOTAutograd's forward/backward split; ``min_cut`` recomputes cheap forward ops in the backward (phase ``recompute``) |
| ``devices`` | int from 1 to 64 | 1 | works: with N >= 2 the forward and backward graphs are planned as one (passes' planJoint: a layer's backward on its forward's device, saved activations where they were produced) and each runs on the multi-device Executor |
| ``device_map`` | None or ``"cpu"`` (CPU worker devices), ``"cuda"``, ``"cuda:K"``, or a list of ``"cuda:K"`` (one per device) | None (``"cpu"``) | works: CUDA maps need a CUDA build of modelpar on a machine with a GPU; anything else is a ConfigError saying which is missing |
| ``placer`` | None, ``"m-topo"``, ``"m-etf"``, ``"m-sct"`` | None | works with devices > 1 (None: m-etf); with devices=1 it is an error |
| ``memory`` | None, bytes per device (int or ``"16GiB"``) | None | works: the plan must fit; otherwise ``PlanDoesNotFitError`` naming layer, device and bytes, raised at the first call before anything runs |
| ``pipeline`` | None or a dict: ``microbatches`` (4), ``schedule`` (``"gpipe"``, ``"1f1b"``, ``"1f1b*"``, ``"interleaved"``, ``"zb-h1"``, ``"zb-v"``; not given: ``"gpipe"``, or ``"1f1b*"`` with ``partition="madpipe"``), ``virtual_stages`` (0: 2 for ``"interleaved"`` and ``"zb-v"``, 1 otherwise; stages per device, more than 1 only with ``"interleaved"``, exactly 2 with ``"zb-v"``), ``partition`` (``"balance-time"``, ``"balance-size"``, ``"balance-time-comm"``, ``"madpipe"``), ``checkpoint`` (``"always"``, ``"except_last"``, ``"never"`` for every layer, or ``"per_layer"``: the fewest layers recomputed that make each device fit ``memory``, Note [Recompute per layer]; not given: ``"except_last"``, or ``"never"`` for a model that checkpoints itself), ``portals`` (True), ``batch_norm`` (``"deferred"``, the default: torchgpipe's DeferredBatchNorm; ``"refuse"`` to be told where training-mode batch norm is), ``allow_random`` (True: dropout and the other element-wise random ops draw per micro-batch, reproducible under torch.manual_seed; False refuses them; a permutation, ``randperm``, is refused either way), ``loss_reduction`` (``"auto"``, ``"mean"``, ``"sum"``) | None | works: the training step is micro-batched, cut into stages over ``devices`` and run as one pipelined program per batch size (compile/pipeline_step.py); a static batch is traced again as a symbolic one (no mark_dynamic needed); 1F1B needs the loss inside the compiled function |
| ``cuda_graphs`` | bool | False | works: the executors capture each step into CUDA Graphs after one warm-up step and replay them; a program that cannot be captured (and every CPU worker program) runs stream replay with the same static-buffer protocol, and ``print(plan)`` says why |
| ``strategy`` | ``"manual"``, ``"auto"`` | ``"manual"`` (``"auto"`` under ``mode="max-autotune"`` with devices > 1) | works: ``"auto"`` searches the one-device plan, each placer and the pipelines (schedules x micro-batches x partitions x checkpoint modes) by simulation at the first call of each batch size and runs the fastest that fits (modelpar/strategy.py); ``plans()[-1].candidates`` lists them; its pipelines keep the ``pipeline`` option's defaults (batch norm deferred, with a warning when such a pipeline is chosen; dropout drawn per micro-batch, not a step that draws ``randperm``), and ``pipeline`` may set only those (``batch_norm``, ``allow_random``, ``loss_reduction``, ``portals``); on the first steps the chosen plan is timed against the one-device plan and the faster kept (compile/plan_guard.py). Not with ``placer`` (it picks by hand); over a process group rank 0 measures and every rank searches with its numbers (the one-device plan excluded) |
| ``devices="world"`` | ``"world"`` | | works: one logical device per rank of the torch.distributed process group (``process_group``, default: the default group); rank r runs device r's instructions on the rank executor, transfers are the group's send/recv (distributed/rank_executor.py) |
| ``process_group`` | None or a ``torch.distributed.ProcessGroup`` | None | works: plan over this group's ranks (``devices``, when a count, must equal its size); None with ``devices="world"``: the default group |
| ``peer_timeout`` | seconds (float > 0) | 30 | works with a process group: how long a rank waits for a transfer with another rank before it raises ``ExecutionError`` naming the failed rank |
| ``mesh`` | None, ``{"pp": P, "dp": D}`` or a ``torch.distributed.device_mesh.DeviceMesh`` with dims named ``"pp"`` and ``"dp"`` | None | works with ``devices="world"``: P x D must be the world size (ConfigError naming the sizes); each of the D data-parallel replicas runs the plan over its P ranks (its pp group; a dict is laid out pipeline outermost: rank r is stage r // D of replica r % D) and every stage's gradients are averaged over its dp group by bucketed c10d all-reduces before the backward returns them (distributed/mesh.py, distributed/data_parallel.py); not with ``process_group`` nor, for D > 1, ``strategy="auto"`` |
| ``input_check_every`` | int >= 0 | 0 | works over a process group: the first step of every executor over ranks all-gathers a fingerprint (shape, dtype, 64 strided elements) of each data input over the ranks that must feed the same batch (one pipeline) and raises ConfigError on every rank naming the inputs and ranks that differ, before anything runs; N > 0 checks again every N steps, 0 never after the first (distributed/input_check.py) |
| ``kernels`` | ``"aten"``, ``"inductor"`` | ``"aten"`` | works: ``"inductor"`` compiles each run of a device's operators between transfers (one phase, one micro-batch) with Inductor at its first call and runs it as one node of the program (Note [Kernel regions], modelpar/kernels/); random and in-place operators stay op by op; ``print(plan)`` lists the regions and what ran op by op and why |
| ``trace`` | None or a path (``step.json``) | None | works: after every step the measured Chrome trace (forward then backward executor) is written there and the simulated one of the joint plan beside it (``step.simulated.json``); over a process group one file per rank (``step.rank<r>.json``) |
| ``measure_memory`` | bool | False | works: every executor of the step measures each device's memory (the bytes of distinct tensor storages its values hold after each instruction, Note [Measured memory]); ``plans()[-1]`` shows the most any step held on each device beside the plan's simulated peak (over a process group, each rank its own device); off, it costs a branch per instruction |

Frameworks that call torch.compile for you (transformers' Trainer with
``torch_compile_backend="modelpar"``) pass no options: set them in the
environment as a JSON object, ``MODELPAR_OPTIONS='{"devices": 2, "pipeline":
{"schedule": "1f1b"}}'``; options given to torch.compile override it key by key.

Any of ``devices`` > 1, ``memory``, ``trace`` or a CUDA ``device_map``
plans the graphs (``CompileOptions.planned``) and runs them on the
Executor; otherwise a graph runs on the one-device C++ interpreter.

``mode``: ``"default"`` (or None); ``"max-autotune"`` and
``"max-autotune-no-cudagraphs"`` mean ``strategy="auto"`` with devices > 1
and neither ``placer`` nor ``pipeline`` given; torch.compile takes no
options beside a mode, so ``devices`` then defaults to the CPU's cores (one
CPU worker device each; the search may still choose one device). With one
device there is nothing to search and they behave like the default (a
warning says why);
``"reduce-overhead"`` means CUDA graph replay: the same as ``cuda_graphs=True``
(over a process group, which has no graph replay yet, a warning says so and
the default runs).
"""

from __future__ import annotations

import os
import re
import warnings
from collections.abc import Mapping
from dataclasses import dataclass, fields
from typing import Any

from ..errors import ConfigError
from .option_names import (BATCH_NORM_MODES, CHECKPOINT_MODES, DEVICE_WORDS, KERNELS,
                           LOSS_REDUCTIONS, MAX_DEVICES, PARTITION_METHODS, PIPELINE_SCHEDULES, PLACERS, STRATEGIES,
                           check_devices)

__all__ = ["CompileOptions", "resolve_options", "VALID_MODES"]

VALID_MODES = ("default", "reduce-overhead", "max-autotune", "max-autotune-no-cudagraphs")
_PARTITIONERS = ("default", "min_cut")
# re.ASCII: \d is 0-9 only; matched with fullmatch, so "cuda:0\n" is refused.
_CUDA_K = re.compile(r"cuda:\d+", re.ASCII)
_SIZE = re.compile(r"\s*(\d+(?:\.\d+)?)\s*([KMGT]i?B|B)?\s*", re.IGNORECASE | re.ASCII)
_MAX_BYTES = 2**63 - 1  # memory is an int64 in passes/
_UNITS = {"b": 1, "kb": 10**3, "mb": 10**6, "gb": 10**9, "tb": 10**12,
          "kib": 2**10, "mib": 2**20, "gib": 2**30, "tib": 2**40}


#: The pipeline keys strategy="auto" chooses itself (virtual_stages with the
#: schedule: its searched pipelines keep each schedule's default).
_SEARCHED_PIPELINE_KEYS = ("microbatches", "schedule", "partition", "checkpoint", "virtual_stages")
_PIPELINE_KEYS = ("microbatches", "schedule", "virtual_stages", "partition", "checkpoint",
                  "portals", "batch_norm", "allow_random", "loss_reduction")


def _sorted_reprs(keys: Any) -> list[str]:
    """Keys as repr()s in a stable order, whatever their types (a dict may mix
    str and int keys, which sorted() cannot compare)."""
    return sorted(repr(k) for k in keys)


def pipeline_options(pipeline: Mapping[str, Any]) -> dict[str, Any]:
    """The ``pipeline`` option with defaults filled in, every value checked
    (ConfigError naming the key and its valid values)."""
    def bad(key: str, value: Any, valid: str) -> ConfigError:
        return ConfigError(f"modelpar options: pipeline[{key!r}]={value!r} is not valid; "
                           f"{key} takes {valid}")
    extra = _sorted_reprs(k for k in pipeline if k not in _PIPELINE_KEYS)
    if extra:
        raise ConfigError(f"modelpar options: unknown pipeline key(s) "
                          f"{', '.join(extra)}; valid keys: {', '.join(_PIPELINE_KEYS)}")
    # MadPipe's partition comes with its schedule: partition="madpipe" alone
    # runs 1F1B* (a schedule asked for by name must be that one).
    # isinstance first: == on an array or tensor value compares element-wise,
    # and `if` on its result raises numpy's "truth value is ambiguous".
    partition = pipeline.get("partition")
    schedule = "1f1b*" if isinstance(partition, str) and partition == "madpipe" else "gpipe"
    out = {"microbatches": 4, "schedule": schedule, "virtual_stages": 0,
           "partition": "balance-time", "checkpoint": "except_last", "portals": True,
           "batch_norm": "deferred", "allow_random": True, "loss_reduction": "auto", **pipeline}
    m = out["microbatches"]
    if isinstance(m, bool) or not isinstance(m, int) or m < 1:
        raise bad("microbatches", m, "an int >= 1")
    v = out["virtual_stages"]
    if isinstance(v, bool) or not isinstance(v, int) or v < 0:
        raise bad("virtual_stages", v, "an int >= 0 (0: 2 for schedule 'interleaved' and 'zb-v', "
                  "1 otherwise)")
    for key, valid in (("schedule", PIPELINE_SCHEDULES), ("partition", PARTITION_METHODS),
                       ("checkpoint", CHECKPOINT_MODES), ("batch_norm", BATCH_NORM_MODES),
                       ("loss_reduction", LOSS_REDUCTIONS)):
        if not isinstance(out[key], str) or out[key] not in valid:
            if isinstance(out[key], str) and out[key] == "pipedream":  # renamed: one name per idea (passes/option_names.h)
                raise bad(key, out[key], "'balance-time-comm' now (the name of what it does)")
            raise bad(key, out[key], "one of " + ", ".join(map(repr, valid)))
    for key in ("portals", "allow_random"):
        if not isinstance(out[key], bool):
            raise bad(key, out[key], "True or False")
    if out["schedule"] == "zb-v" and v not in (0, 2):
        raise bad("virtual_stages", v, "exactly 2 with schedule 'zb-v', which runs 2 stages per "
                  "device placed in a V (give 2 or leave it unset)")
    if v > 1 and out["schedule"] not in ("interleaved", "zb-v"):
        raise bad("virtual_stages", v, "more than 1 only with schedule 'interleaved' (got "
                  f"{out['schedule']!r}), the schedule that runs several stages per device in "
                  "turn, or exactly 2 with 'zb-v'")
    if out["partition"] == "madpipe" and out["schedule"] != "1f1b*":
        raise bad("partition", "madpipe", "'madpipe' only with schedule '1f1b*' (MadPipe's "
                  "schedule for the stages it makes)")
    return out


@dataclass(frozen=True)
class CompileOptions:
    """The validated options of one ``torch.compile`` call (see the module
    docstring for each key)."""
    strict: bool = False
    dump_dir: str | None = None
    partitioner: str = "default"
    devices: int = 1
    device_map: Any = None
    placer: str | None = None
    memory: int | None = None
    pipeline: Mapping[str, Any] | None = None
    cuda_graphs: bool = False
    trace: str | None = None
    strategy: str = "manual"
    process_group: Any = None
    peer_timeout: float = 30.0
    mesh: Any = None
    input_check_every: int = 0
    kernels: str = "aten"
    measure_memory: bool = False
    mode: str = "default"
    #: Plan over the ranks of ``process_group`` (resolved: never None then).
    world: bool = False
    #: The ``pipeline`` keys the user gave (the rest are defaults: Note [A
    #: model that checkpoints itself] in compile/pipeline_step.py).
    pipeline_given: tuple[str, ...] = ()
    #: With ``mesh``: this rank's data-parallel group (``process_group`` is
    #: then its pp group); None otherwise.
    dp_group: Any = None

    @property
    def pipeline_by_hand(self) -> bool:
        """Whether the ``pipeline`` option picks the pipeline (under
        ``strategy="auto"`` it only sets what the searched pipelines keep:
        batch_norm, allow_random, loss_reduction, portals)."""
        return self.pipeline is not None and self.strategy != "auto"

    @property
    def whole_step(self) -> bool:
        """Whether the training step is joined into one graph and planned per
        batch size at its first call (compile/pipeline_step.py): with ``pipeline``
        or ``strategy="auto"``."""
        return self.pipeline is not None or self.strategy == "auto"

    @property
    def planned(self) -> bool:
        """Whether graphs are planned by passes' plan() and run by the
        multi-device Executor (else: the one-device interpreter)."""
        return (self.devices > 1 or self.world or self.memory is not None
                or self.trace is not None or self.whole_step or self.measure_memory
                or self.cuda_graphs or self.device_map not in (None, "cpu"))

    @property
    def executor_device_map(self) -> str:
        """The Executor's device map: ``"cpu-workers"``, ``"cuda"``,
        ``"cuda:K"`` or ``"cuda:0,cuda:1"``."""
        if self.device_map in (None, "cpu"):
            return "cpu-workers"
        if isinstance(self.device_map, str):
            return self.device_map
        return ",".join(self.device_map)

    def non_default(self) -> dict[str, Any]:
        """The options that differ from their defaults (for summaries)."""
        default = CompileOptions()
        return {f.name: getattr(self, f.name) for f in fields(self)
                if f.name not in ("pipeline_given", "dp_group")
                and getattr(self, f.name) is not getattr(default, f.name)
                and getattr(self, f.name) != getattr(default, f.name)}


_KEYS = tuple(f.name for f in fields(CompileOptions)
              if f.name not in ("mode", "world", "pipeline_given", "dp_group"))


def _bad(key: str, value: Any, valid: str) -> ConfigError:
    return ConfigError(f"modelpar options: {key}={value!r} is not valid; {key} takes {valid}")


def _bool(key: str, v: Any) -> bool:
    if not isinstance(v, bool):
        raise _bad(key, v, "True or False")
    return v


def _choice(key: str, v: Any, choices: tuple[str, ...]) -> Any:
    # isinstance first: `in` compares with ==, which an array or tensor value
    # answers elementwise (or raises) instead of with a bool.
    if not isinstance(v, str) or v not in choices:
        raise _bad(key, v, "one of " + ", ".join(repr(c) for c in choices))
    return v


def _bytes(key: str, v: Any) -> int | None:
    if v is None:
        return None
    valid = 'None, a positive number of bytes, or a size such as "16GiB" (at most 2**63 - 1 bytes)'
    if isinstance(v, int) and not isinstance(v, bool):
        if not 0 < v <= _MAX_BYTES:
            raise _bad(key, v, valid)
        return v
    m = _SIZE.fullmatch(v) if isinstance(v, str) else None
    if not m:
        raise _bad(key, v, valid)
    # Decimal arithmetic on the digits: float() would turn 400 digits into inf.
    whole, _, frac = m.group(1).partition(".")
    unit = _UNITS[(m.group(2) or "B").lower()]
    n = (int(whole + frac) * unit) // 10 ** len(frac)
    if not 0 < n <= _MAX_BYTES:
        raise _bad(key, v, valid + f" (it is {n} bytes)")
    return n


def _path(key: str, v: Any, what: str) -> Any:
    """A str or os.PathLike path (no NUL character, which no file name can
    hold), or None."""
    if v is None:
        return None
    if not isinstance(v, (str, os.PathLike)):
        raise _bad(key, v, f"{what} or None")
    text = os.fspath(v)
    if not isinstance(text, str) or "\0" in text:
        raise _bad(key, v, f"{what} (a str without NUL characters) or None")
    return v


def _not_yet(key: str, value: Any, issue: str) -> ConfigError:
    return ConfigError(f"modelpar options: {key}={value!r} is not yet supported ({issue}); "
                       f"today modelpar runs graphs on one device or on CPU worker devices (devices=N). Leave {key} unset.")


def _check_cuda(device_map: Any) -> None:
    """ConfigError unless the Executor's CUDA devices exist here."""
    from .. import _C
    why = None
    if not _C.cuda_devices_built():
        why = "this build of modelpar has no CUDA devices (built without CUDA)"
    elif _C.cuda_device_count() < 1:
        why = "this machine has no GPU"
    if why:
        raise ConfigError(f"modelpar options: device_map={device_map!r} needs the executor's CUDA "
                          f"devices, which exist only in a CUDA build of modelpar on a machine with "
                          f"a GPU; {why}. Leave device_map unset (or 'cpu') to run on CPU worker "
                          f"devices")


# Note [Options from the environment]: frameworks that compile the model
# for the user (transformers' Trainer with torch_compile_backend="modelpar",
# Lightning, accelerate) call torch.compile with a backend name and at most a
# mode, never modelpar's options. $MODELPAR_OPTIONS, a JSON object of the
# same keys, gives them: it is validated on its own (errors name the
# variable), then the options passed to torch.compile override it key by key.
OPTIONS_ENV = "MODELPAR_OPTIONS"


def _env_options() -> dict[str, Any]:
    """The options of $MODELPAR_OPTIONS (validated), or {} when unset.

    Raises:
        ConfigError: not a JSON object, or an option in it that
            resolve_options refuses (the message names the variable).
    """
    import json
    text = os.environ.get(OPTIONS_ENV, "").strip()
    if not text:
        return {}
    try:
        options = json.loads(text)
    except json.JSONDecodeError as e:
        raise ConfigError(f"modelpar options: ${OPTIONS_ENV} is not valid JSON ({e}); it takes a "
                          "JSON object of options, e.g. '{\"devices\": 2}'") from None
    if not isinstance(options, dict):
        raise ConfigError(f"modelpar options: ${OPTIONS_ENV} must be a JSON object of options "
                          f"(keys {', '.join(_KEYS)}), got {text!r}")
    try:
        _resolve(options, None)
    except ConfigError as e:
        raise ConfigError(f"{e} (in ${OPTIONS_ENV}={text})") from None
    return options


def resolve_options(options: Mapping[str, Any] | None = None,
                    mode: str | None = None) -> CompileOptions:
    """Validates ``options`` and ``mode`` as ``torch.compile`` passes them,
    over the defaults of $MODELPAR_OPTIONS (Note [Options from the
    environment]).

    Raises:
        ConfigError: an unknown key, a bad value (the message lists the valid
            keys or values), or an option that is not yet supported.
    """
    if options is not None and not isinstance(options, Mapping):
        raise ConfigError(f"modelpar options: options={options!r} is not valid; options takes a "
                          f"dict with keys {', '.join(_KEYS)}, or None")
    env = _env_options()
    if not env:
        return _resolve(dict(options or {}), mode)
    try:
        return _resolve({**env, **dict(options or {})}, mode)
    except ConfigError as e:
        raise ConfigError(f"{e} (options given over ${OPTIONS_ENV}="
                          f"{os.environ[OPTIONS_ENV].strip()})") from None


def _resolve(options: Mapping[str, Any], mode: str | None) -> CompileOptions:
    options = dict(options)
    unknown = _sorted_reprs(k for k in options if k not in _KEYS)
    if unknown:
        raise ConfigError(f"modelpar options: unknown key{'s' if len(unknown) > 1 else ''} "
                          f"{', '.join(unknown)}; valid keys: {', '.join(_KEYS)}")
    mode = "default" if mode is None else mode
    _choice("mode", mode, VALID_MODES)

    # 1. Types and ranges.
    strict = _bool("strict", options.get("strict", False))
    measure_memory = _bool("measure_memory", options.get("measure_memory", False))
    cuda_graphs = _bool("cuda_graphs", options.get("cuda_graphs", False))
    dump_dir = _path("dump_dir", options.get("dump_dir", os.environ.get("MODELPAR_DUMP_DIR") or None),
                     "a directory path")
    partitioner = _choice("partitioner", options.get("partitioner", "default"), _PARTITIONERS)
    kernels = _choice("kernels", options.get("kernels", "aten"), KERNELS)
    # torch.compile takes mode or options, never both: under max-autotune
    # (no options) the search gets one CPU worker device per core.
    autotune = mode.startswith("max-autotune")
    devices = options.get("devices", min(os.cpu_count() or 1, MAX_DEVICES) if autotune else 1)
    process_group = options.get("process_group")
    peer_timeout = options.get("peer_timeout", 30.0)
    world = (isinstance(devices, str) and devices in DEVICE_WORDS) or process_group is not None
    if not (isinstance(devices, str) and devices in DEVICE_WORDS):
        if isinstance(devices, str):
            raise _bad("devices", devices, f"an int from 1 to {MAX_DEVICES} or one of "
                       f"{', '.join(map(repr, DEVICE_WORDS))}")
        check_devices("options", devices)
    if isinstance(peer_timeout, bool) or not isinstance(peer_timeout, (int, float)) \
            or not 0 < peer_timeout < float("inf"):
        raise _bad("peer_timeout", peer_timeout, "a number of seconds > 0")
    for key in ("peer_timeout", "input_check_every"):
        if options.get(key) is not None and not world:
            raise ConfigError(f"modelpar options: {key} is for runs over a process group; give "
                              "devices='world' (or a process_group), or leave "
                              f"{key} unset")
    input_check_every = options.get("input_check_every", 0)
    if isinstance(input_check_every, bool) or not isinstance(input_check_every, int) \
            or input_check_every < 0:
        raise _bad("input_check_every", input_check_every,
                   "an int >= 0 (steps between input checks; 0: the first step only)")
    mesh = options.get("mesh")
    dp_group = None
    if mesh is not None:
        if process_group is not None:
            raise ConfigError("modelpar options: mesh and process_group both name the ranks to "
                              "plan over; give one (a mesh plans over its pp groups)")
        if not isinstance(devices, str):
            raise ConfigError(f"modelpar options: mesh needs devices='world', got "
                              f"devices={devices!r}; the pipeline's size is the mesh's pp")
        from ..distributed.mesh import resolve_mesh
        groups = resolve_mesh(mesh)
        mesh, process_group, dp_group = groups.mesh, groups.pp_group, groups.dp_group
    if world:
        from ..distributed.groups import group_of
        process_group = group_of(process_group)
        import torch.distributed as dist
        size = dist.get_world_size(process_group)
        if not isinstance(devices, str) and devices != size:
            raise ConfigError(f"modelpar options: devices={devices} but the process group has "
                              f"{size} ranks; a plan over a process group has one device per "
                              "rank: give devices='world' or launch as many processes as devices")
        devices = size
    device_map = options.get("device_map")
    if isinstance(device_map, tuple):
        device_map = list(device_map)
    if not (device_map is None
            or (isinstance(device_map, str) and (device_map in ("cpu", "cuda")
                                                 or _CUDA_K.fullmatch(device_map)))
            or (isinstance(device_map, list) and device_map
                and all(isinstance(d, str) and _CUDA_K.fullmatch(d) for d in device_map))):
        raise _bad("device_map", device_map, "None, 'cpu', 'cuda', 'cuda:K' or a list of 'cuda:K' "
                   "strings, one per device")
    placer = options.get("placer")
    if placer is not None:
        _choice("placer", placer, PLACERS)
    memory = _bytes("memory", options.get("memory"))
    pipeline = options.get("pipeline")
    given_pipeline: list[str] = []
    if pipeline is not None:
        if not isinstance(pipeline, Mapping):
            raise _bad("pipeline", pipeline, f"None or a dict with keys {', '.join(_PIPELINE_KEYS)}")
        given_pipeline = [str(k) for k in pipeline]
        pipeline = pipeline_options(pipeline)
    trace = _path("trace", options.get("trace"), "a file path")
    strategy = _choice("strategy", options.get("strategy", "manual"), STRATEGIES)

    # 2. What is not built yet.
    if placer is not None and devices == 1:
        raise ConfigError(f"modelpar options: placer={placer!r} needs devices > 1; "
                          "give devices=N (N >= 2) or leave placer unset")
    if isinstance(device_map, list) and len(device_map) != devices:
        raise ConfigError(f"modelpar options: device_map={device_map!r} names {len(device_map)} "
                          f"devices but devices={devices}; give one device per logical device")
    if world:
        for key, value, default in (("device_map", device_map, None),
                                    ("cuda_graphs", cuda_graphs, False)):
            if value != default:
                raise ConfigError(f"modelpar options: {key}={value!r} is not yet supported over a "
                                  "process group (issue 13): each rank runs on the device its "
                                  f"tensors are on, by stream replay. Leave {key} "
                                  "unset")
    if device_map not in (None, "cpu"):
        _check_cuda(device_map)
    if mode == "reduce-overhead" and world:
        # A mode asks for what helps where it can, as max-autotune with
        # nothing to search does (and torch's own backends skip CUDA graphs
        # they cannot use); cuda_graphs=True, asked for by name, is refused.
        warnings.warn("modelpar: mode='reduce-overhead' asks for CUDA graph replay, which "
                      "modelpar does not do over a process group yet (issue 13); it runs as "
                      "mode='default', by stream replay", stacklevel=2)
    elif mode == "reduce-overhead":  # torch.compile's name for CUDA graph replay
        cuda_graphs = True
    if dp_group is not None and strategy == "auto":
        import torch.distributed as dist
        if dist.get_world_size(dp_group) > 1:
            raise ConfigError("modelpar options: strategy='auto' with a mesh of dp > 1 is not yet "
                              "supported: each replica's first rank measures for its own search, "
                              "so replicas could choose different plans. Give the plan by hand "
                              "(pipeline={...}, or none: m-ETF)")
    if strategy == "auto" and placer is not None:
        raise ConfigError(f"modelpar options: strategy='auto' searches the placers and pipelines "
                          f"itself, but placer={placer!r} picks one by hand; give one of the two")
    searched = [k for k in given_pipeline if k in _SEARCHED_PIPELINE_KEYS]
    if strategy == "auto" and searched:
        raise ConfigError(f"modelpar options: strategy='auto' searches the pipelines' "
                          f"{', '.join(_SEARCHED_PIPELINE_KEYS)} itself, but pipeline gives "
                          f"{', '.join(searched)}; under strategy='auto' pipeline takes only "
                          f"{', '.join(k for k in _PIPELINE_KEYS if k not in _SEARCHED_PIPELINE_KEYS)} "
                          "(what every searched pipeline keeps), or pick the pipeline by hand "
                          "without strategy='auto'")
    if autotune and strategy == "manual":
        if devices > 1 and placer is None and pipeline is None:
            strategy = "auto"
        else:
            why = ("one device" if devices == 1 else
                   f"{'placer' if placer is not None else 'pipeline'} picks the plan by hand")
            warnings.warn(f"modelpar: mode={mode!r} has nothing to autotune ({why}); it runs as "
                          "mode='default'. Give devices=N without placer or pipeline to search "
                          "the strategies", stacklevel=2)

    return CompileOptions(strict=strict, dump_dir=str(dump_dir) if dump_dir else None,
                          partitioner=partitioner, devices=devices, device_map=device_map,
                          placer=placer, memory=memory,
                          pipeline=dict(pipeline) if pipeline is not None else None,
                          pipeline_given=tuple(sorted(given_pipeline)),
                          cuda_graphs=cuda_graphs, trace=str(trace) if trace else None,
                          strategy=strategy, mode=mode, process_group=process_group,
                          peer_timeout=float(peer_timeout), world=world, mesh=mesh,
                          input_check_every=input_check_every, dp_group=dp_group,
                          kernels=kernels, measure_memory=measure_memory)
