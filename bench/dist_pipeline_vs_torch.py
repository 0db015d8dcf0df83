"""modelpar's pipeline schedules over torch.distributed ranks against PyTorch's
own ``torch.distributed.pipelining`` (PipelineStage + its schedules), both over
Gloo in the same processes (2 or 4 ranks: the world size is torchrun's), and
optionally against modelpar's in-process pipeline on as many CPU workers
(issue 13's benchmark, extended to the schedules of issue 35).

Each modelpar schedule (``--schedules``; default all) is timed beside
PyTorch's schedule of the same name, on the same cut and micro-batches:

  modelpar      PyTorch                          stages per rank (rank r holds)
  gpipe         ScheduleGPipe                    1 (stage r)
  1f1b          Schedule1F1B                     1 (stage r)
  interleaved   ScheduleInterleaved1F1B          2 looping (stages r, r + world)
  zb-h1         Schedule1F1B (same cut), and     1 (stage r)
                ScheduleInterleavedZeroBubble    2 looping (stages r, r + world)
                (PyTorch's zero-bubble schedules are multi-stage only)
  zb-v          ScheduleZBVZeroBubble            2 in a V (stages r, 2 world - 1 - r)

modelpar places its stages the same way (interleaved: virtual_stages=2, stage
s on device s % world; zb-v: stage s on device s for s < world, 2 world - 1 -
s otherwise). A modelpar without "zb-v" among its schedules (it is not in main
yet), or one that refuses a schedule's options (ConfigError), skips that
modelpar row with a printed note and still times PyTorch's side. PyTorch's ZB
schedules refuse torch.compile'd stages: every PyTorch stage here runs
eagerly.

The model is an nn.Sequential of L Linear(D)+ReLU layers (2L modules), cut into
world x v equal chunks of modules (v stages per rank); PyTorch's stages are
those chunks. modelpar's balance-time partition of uniform layers makes the
same cut: each modelpar plan's layer-to-stage map and stage placement are
checked against it after its first step, and a row whose cut differs is
flagged. Batch B in m micro-batches, MSE loss on the last stage, one training
step = forward + loss + backward (gradients accumulate into ``.grad``, zeroed
between steps; no optimizer, no checkpointing in either). Every process uses
one intra-op thread.

Rounds are interleaved: each round times K steps of every configuration in
turn (all ranks enter each timed block together through a barrier), so load
from other work on the machine falls on all of them alike; the table gives
the median over rounds of the mean step time of each block. With
``--in-process``, modelpar's in-process pipeline runs in rank 0 alone (world
worker threads) while the other ranks wait in a barrier.

The table: each modelpar schedule's row group holds PyTorch's same-named
schedule(s), modelpar's, and PyTorch's best (the fastest PyTorch configuration
timed in this run, whatever its schedule); "modelpar / this" is modelpar's
steps/s over that row's (> 1: modelpar is faster). A summary table gives
modelpar / torch-same and modelpar / torch-best per schedule.

    PYTHONPATH=build/python MODELPAR_CPU_PROFILE=off OMP_NUM_THREADS=1 \\
        .venv/bin/python -m torch.distributed.run --nproc-per-node 2 \\
        bench/dist_pipeline_vs_torch.py --rounds 9 --steps 4          (or 4 ranks)
"""

from __future__ import annotations

import argparse
import os
import statistics
import time
from dataclasses import dataclass
from typing import Callable

import torch
import torch.distributed as dist
import torch.nn.functional as F

import modelpar

SCHEDULES = ("gpipe", "1f1b", "interleaved", "zb-h1", "zb-v")


@dataclass(frozen=True)
class TorchConfig:
    """One torch.distributed.pipelining configuration: a schedule class and
    where its stages go (see stage_ranks)."""
    schedule: str
    placement: str

    @property
    def per_rank(self) -> int:
        return 1 if self.placement == "single" else 2

    @property
    def label(self) -> str:
        where = {"single": "", "loop": ", 2 looping stages per rank",
                 "v": ", 2 stages per rank in a V"}[self.placement]
        return f"torch {self.schedule}{where}"


#: modelpar schedule -> where modelpar places its stages, and PyTorch's
#: configurations compared with it (torch-same), each with how it relates.
COMPARED: dict[str, tuple[str, list[tuple[TorchConfig, str]]]] = {
    "gpipe": ("single", [(TorchConfig("ScheduleGPipe", "single"), "same schedule")]),
    "1f1b": ("single", [(TorchConfig("Schedule1F1B", "single"), "same schedule")]),
    "interleaved": ("loop", [(TorchConfig("ScheduleInterleaved1F1B", "loop"), "same schedule")]),
    "zb-h1": ("single", [(TorchConfig("Schedule1F1B", "single"), "same cut"),
                         (TorchConfig("ScheduleInterleavedZeroBubble", "loop"),
                          "zero bubble, multi-stage only")]),
    "zb-v": ("v", [(TorchConfig("ScheduleZBVZeroBubble", "v"), "same schedule")]),
}

Step = Callable[[torch.Tensor, torch.Tensor], None]


def make_model(layers: int, width: int) -> torch.nn.Sequential:
    torch.manual_seed(0)
    mods: list[torch.nn.Module] = []
    for _ in range(layers):
        mods += [torch.nn.Linear(width, width), torch.nn.ReLU()]
    return torch.nn.Sequential(*mods)


def chunk_of_module(modules: int, chunks: int) -> list[int]:
    """The chunk (stage) of each module when `modules` are cut into `chunks`
    equal runs, in order."""
    if modules % chunks:
        raise SystemExit(f"{modules} modules do not cut into {chunks} equal stages: "
                         f"choose --layers so that 2 x layers is a multiple of {chunks}")
    per = modules // chunks
    return [i // per for i in range(modules)]


def stage_ranks(placement: str, world: int) -> list[int]:
    """The rank of each stage."""
    if placement == "single":
        return list(range(world))
    if placement == "loop":
        return list(range(world)) * 2
    return list(range(world)) + list(reversed(range(world)))  # "v"


def torch_pipeline(model: torch.nn.Sequential, cfg: TorchConfig, m: int) -> Step:
    import torch.distributed.pipelining as pipelining
    from torch.distributed.pipelining import PipelineStage
    rank, world = dist.get_rank(), dist.get_world_size()
    ranks = stage_ranks(cfg.placement, world)
    chunk = chunk_of_module(len(model), len(ranks))
    mine = [s for s, r in enumerate(ranks) if r == rank]  # in stage order
    parts = [torch.nn.Sequential(*[mod for mod, c in zip(model, chunk) if c == s]) for s in mine]
    # shapes inferred at the first step
    stages = [PipelineStage(part, s, len(ranks), torch.device("cpu")) for part, s in zip(parts, mine)]
    cls = getattr(pipelining, cfg.schedule)
    if cfg.placement == "single":
        sched = cls(stages[0], n_microbatches=m, loss_fn=F.mse_loss)
    else:  # multi-stage schedules take the rank's stages as a list
        sched = cls(stages, n_microbatches=m, loss_fn=F.mse_loss)
    first = any(s.is_first for s in stages)  # ZBV: rank 0 holds the first and the last stage
    last = any(s.is_last for s in stages)

    def step(x: torch.Tensor, y: torch.Tensor) -> None:
        args = (x,) if first else ()
        kwargs = {"target": y, "losses": []} if last else {}
        sched.step(*args, **kwargs)
        for part in parts:
            part.zero_grad(set_to_none=True)
    return step


def modelpar_pipeline(model: torch.nn.Module, schedule: str, m: int, devices) -> Step:
    pipeline = {"schedule": schedule, "microbatches": m, "checkpoint": "never"}
    if schedule == "interleaved":
        pipeline["virtual_stages"] = 2
    fn = torch.compile(lambda x, y: F.mse_loss(model(x), y), backend="modelpar",
                       options={"devices": devices, "pipeline": pipeline})

    def step(x: torch.Tensor, y: torch.Tensor) -> None:
        fn(x, y).backward()
        model.zero_grad(set_to_none=True)
    return step


def modelpar_schedules() -> tuple[str, ...]:
    from modelpar.planning.pipeline import PIPELINE_SCHEDULES
    return tuple(PIPELINE_SCHEDULES)


def check_cut(plans: list, schedule: str, world: int, layers: int) -> str:
    """'' when modelpar's plan of `schedule` cuts the layers into the chunks
    PyTorch's stages hold and places them on the same ranks, else what
    differs."""
    plans = [p.pipeline for p in plans if p.pipeline is not None]
    if not plans:
        return "no pipeline plan recorded"
    plan = plans[-1]
    ranks = stage_ranks(COMPARED[schedule][0], world)
    want = {str(i): c for i, c in enumerate(chunk_of_module(2 * layers, len(ranks)))}
    got = {str(k): int(v) for k, v in dict(plan.stage_of_layer).items()}
    problems = []
    if plan.schedule != schedule:
        problems.append(f"schedule {plan.schedule}")
    if list(plan.stage_device) != ranks:
        problems.append(f"stages on devices {list(plan.stage_device)}, torch's on ranks {ranks}")
    if got != want:
        problems.append(f"layer -> stage {got}, torch's {want}")
    return "; ".join(problems)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--layers", type=int, default=8)
    ap.add_argument("--width", type=int, default=512)
    ap.add_argument("--batch", type=int, default=512)
    ap.add_argument("--microbatches", type=int, default=8)
    ap.add_argument("--rounds", type=int, default=7)
    ap.add_argument("--steps", type=int, default=5, help="steps per timed block")
    ap.add_argument("--schedules", default=",".join(SCHEDULES),
                    help=f"modelpar schedules to compare, comma-separated (default: all of "
                         f"{','.join(SCHEDULES)})")
    ap.add_argument("--in-process", action="store_true",
                    help="also time modelpar's in-process pipeline on world CPU workers in rank 0")
    a = ap.parse_args()
    schedules = [s.strip() for s in a.schedules.split(",") if s.strip()]
    unknown = [s for s in schedules if s not in COMPARED]
    if unknown:
        raise SystemExit(f"--schedules: unknown {unknown}; choose from {', '.join(SCHEDULES)}")
    torch.set_num_threads(1)
    # One code object (modelpar_pipeline's lambda) compiled once per schedule
    # and configuration: more than Dynamo's default limit of 8 recompiles.
    torch._dynamo.config.recompile_limit = 64
    torch._dynamo.config.accumulated_recompile_limit = 256
    dist.init_process_group("gloo")
    rank, world = dist.get_rank(), dist.get_world_size()
    g = torch.Generator().manual_seed(1)
    x, y = torch.randn(a.batch, a.width, generator=g), torch.randn(a.batch, a.width, generator=g)
    available = modelpar_schedules()
    notes: list[str] = []

    # Every configuration is built and stepped once here, in the same order on
    # every rank (its first step infers shapes, compiles and plans).
    torch_steps: dict[TorchConfig, Step] = {}
    for schedule in schedules:
        for cfg, _ in COMPARED[schedule][1]:
            if cfg not in torch_steps:
                torch_steps[cfg] = torch_pipeline(make_model(a.layers, a.width), cfg, a.microbatches)
                torch_steps[cfg](x, y)
    modelpar_steps: dict[str, Step] = {}
    in_process: dict[str, Step | None] = {}
    cut: dict[str, str] = {}
    for schedule in schedules:
        if schedule not in available:
            notes.append(f"modelpar {schedule}: skipped, not among modelpar's schedules "
                         f"({', '.join(available)}); torch's side is still timed")
            continue
        before = len(modelpar.plans())
        step = modelpar_pipeline(make_model(a.layers, a.width), schedule, a.microbatches, "world")
        try:  # options are checked alike on every rank, before any message
            step(x, y)
        except Exception as e:  # noqa: BLE001 (Dynamo wraps the backend's ConfigError)
            inner = getattr(e, "inner_exception", e)
            if not isinstance(inner, modelpar.ConfigError):
                raise
            notes.append(f"modelpar {schedule}: skipped, its options were refused: {inner}")
            continue
        modelpar_steps[schedule] = step
        cut[schedule] = check_cut(modelpar.plans()[before:], schedule, world, a.layers)
        if a.in_process:
            in_process[schedule] = modelpar_pipeline(make_model(a.layers, a.width), schedule,
                                                     a.microbatches, world) if rank == 0 else None
            if rank == 0:
                in_process[schedule](x, y)

    configs: dict[str, Step | None] = {}  # each schedule's beside its torch peers
    for schedule in schedules:
        for cfg, _ in COMPARED[schedule][1]:
            configs.setdefault(cfg.label, torch_steps[cfg])
        if schedule in modelpar_steps:
            configs[f"modelpar {schedule}"] = modelpar_steps[schedule]
            if a.in_process:
                configs[f"modelpar {schedule} in-process"] = in_process[schedule]
    times: dict[str, list[float]] = {k: [] for k in configs}
    for r in range(a.rounds + 1):  # round 0 warms up
        for name, step in configs.items():
            dist.barrier()
            t0 = time.perf_counter()
            if step is not None:
                for _ in range(a.steps):
                    step(x, y)
            dist.barrier()
            if r:
                times[name].append((time.perf_counter() - t0) / a.steps * 1e3)
    if rank == 0:
        report(a, world, schedules, times, cut, notes)
    dist.destroy_process_group()


def report(a, world: int, schedules: list[str], times: dict[str, list[float]],
           cut: dict[str, str], notes: list[str]) -> None:
    ms = {name: statistics.median(ts) for name, ts in times.items()}
    rate = {name: 1e3 / t for name, t in ms.items()}
    timed = {cfg.label: cfg for s in schedules for cfg, _ in COMPARED[s][1]}
    best = max(timed, key=lambda n: rate[n])  # PyTorch's fastest configuration in this run
    plans = [p for p in modelpar.plans() if p.pipeline is not None]
    stages = {str(p.pipeline).splitlines()[0] for p in plans}
    print(f"load average {os.getloadavg()[0]:.1f}; {world} ranks; {a.layers} x Linear({a.width})"
          f"+ReLU, batch {a.batch} in {a.microbatches} micro-batches; {a.rounds} rounds of "
          f"{a.steps} steps")
    print("modelpar plans:\n  " + ("\n  ".join(sorted(stages)) or "(none)"))
    for schedule, problem in cut.items():
        print(f"cut check, modelpar {schedule}: "
              + (f"DIFFERS from torch's: {problem}" if problem else "same stages as torch's"))
    for note in notes:
        print(f"note: {note}")
    print()
    print("| schedule | configuration | stages per rank | step (ms, median of rounds) | steps/s "
          "| modelpar / this |")
    print("|---|---|---:|---:|---:|---:|")
    summary = []
    for schedule in schedules:
        placement, compared = COMPARED[schedule]
        per_rank = 1 if placement == "single" else 2
        ours = f"modelpar {schedule}"
        have = ours in ms

        def ratio(name: str) -> str:
            return f"{rate[ours] / rate[name]:.2f}x" if have else ""

        def row(config: str, stages: int, name: str | None, vs: bool = True) -> None:
            timing = f"{ms[name]:.1f} | {rate[name]:.1f}" if name else " | "
            print(f"| {schedule} | {config} | {stages} | {timing} | "
                  f"{ratio(name) if name and vs else ''} |")
        for cfg, relation in compared:
            row(f"{cfg.label} ({relation})", cfg.per_rank, cfg.label)
        if have:
            flag = " (cut differs: see above)" if cut.get(schedule) else ""
            row(f"modelpar devices='world'{flag}", per_rank, ours, vs=False)
            if f"{ours} in-process" in ms:
                row(f"modelpar {world} CPU workers, 1 process", per_rank, f"{ours} in-process")
        else:
            row("modelpar: skipped (see the note above)", per_rank, None)
        row(f"torch best: {best.removeprefix('torch ')}", timed[best].per_rank, best)
        summary.append(
            f"| {schedule} | {f'{rate[ours]:.1f}' if have else 'skipped'} | "
            + "; ".join(f"{cfg.schedule}{'' if cfg.per_rank == 1 else ' (2/rank)'} "
                        f"{rate[cfg.label]:.1f}" for cfg, _ in compared)
            + " | " + "; ".join(ratio(cfg.label) for cfg, _ in compared) + " | "
            + f"{timed[best].schedule}{'' if timed[best].per_rank == 1 else ' (2/rank)'} "
            + f"{rate[best]:.1f} | {ratio(best)} |")
    print()
    print("| schedule | modelpar steps/s | torch-same steps/s | modelpar / torch-same "
          "| torch-best steps/s | modelpar / torch-best |")
    print("|---|---:|---|---|---|---:|")
    print("\n".join(summary))


if __name__ == "__main__":
    main()
