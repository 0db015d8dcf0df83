"""modelpar's pipeline over torch.distributed ranks against PyTorch's own
``torch.distributed.pipelining`` (PipelineStage + ScheduleGPipe /
Schedule1F1B), both over Gloo in the same 2 processes, and against
modelpar's in-process pipeline on 2 CPU workers (issue 13's benchmark).

The model is an nn.Sequential of L Linear(D)+ReLU layers, cut in the middle
(stage s on rank s: PyTorch's stages are the two halves; modelpar's
balance-time partition of uniform layers makes the same cut, checked below),
batch B in m micro-batches, MSE loss on the last stage, one training step =
forward + loss + backward (gradients accumulate into ``.grad``, zeroed
between steps; no optimizer, no checkpointing in either). Every process uses
one intra-op thread.

Rounds are interleaved: each round times K steps of every configuration in
turn (both ranks enter each timed block together through a barrier), so
load from other work on the machine falls on all of them alike; the table
gives the median over rounds of the mean step time of each block.
The in-process pipeline runs in rank 0 alone (2 worker threads) while rank
1 waits in a barrier.

    torchrun --nproc-per-node 2 bench/dist_pipeline_vs_torch.py      (PYTHONPATH=build/python)
"""

from __future__ import annotations

import argparse
import copy
import os
import statistics
import time

import torch
import torch.distributed as dist
import torch.nn.functional as F

import modelpar


def make_model(layers: int, width: int) -> torch.nn.Sequential:
    torch.manual_seed(0)
    mods: list[torch.nn.Module] = []
    for _ in range(layers):
        mods += [torch.nn.Linear(width, width), torch.nn.ReLU()]
    return torch.nn.Sequential(*mods)


def torch_pipeline(model: torch.nn.Sequential, schedule: str, m: int, x: torch.Tensor):
    from torch.distributed.pipelining import PipelineStage, Schedule1F1B, ScheduleGPipe
    rank, world = dist.get_rank(), dist.get_world_size()
    half = len(model) // world
    part = torch.nn.Sequential(*list(model)[rank * half:(rank + 1) * half])
    stage = PipelineStage(part, rank, world, torch.device("cpu"))  # shapes inferred at step 1
    cls = ScheduleGPipe if schedule == "gpipe" else Schedule1F1B
    sched = cls(stage, n_microbatches=m, loss_fn=F.mse_loss)

    def step(x: torch.Tensor, y: torch.Tensor) -> None:
        if rank == 0:
            sched.step(x)
        else:
            sched.step(target=y, losses=[])
        part.zero_grad(set_to_none=True)
    return step


def modelpar_world(model: torch.nn.Module, schedule: str, m: int):
    fn = torch.compile(lambda x, y: F.mse_loss(model(x), y), backend="modelpar",
                       options={"devices": "world", "pipeline": {
                           "schedule": schedule, "microbatches": m, "checkpoint": "never"}})

    def step(x: torch.Tensor, y: torch.Tensor) -> None:
        fn(x, y).backward()
        model.zero_grad(set_to_none=True)
    return step


def modelpar_workers(model: torch.nn.Module, schedule: str, m: int):
    fn = torch.compile(lambda x, y: F.mse_loss(model(x), y), backend="modelpar",
                       options={"devices": 2, "pipeline": {
                           "schedule": schedule, "microbatches": m, "checkpoint": "never"}})

    def step(x: torch.Tensor, y: torch.Tensor) -> None:
        fn(x, y).backward()
        model.zero_grad(set_to_none=True)
    return step


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--layers", type=int, default=8)
    ap.add_argument("--width", type=int, default=512)
    ap.add_argument("--batch", type=int, default=512)
    ap.add_argument("--microbatches", type=int, default=8)
    ap.add_argument("--rounds", type=int, default=7)
    ap.add_argument("--steps", type=int, default=5, help="steps per timed block")
    a = ap.parse_args()
    torch.set_num_threads(1)
    dist.init_process_group("gloo")
    rank = dist.get_rank()
    assert dist.get_world_size() == 2, "run with torchrun --nproc-per-node 2"
    g = torch.Generator().manual_seed(1)
    x, y = torch.randn(a.batch, a.width, generator=g), torch.randn(a.batch, a.width, generator=g)

    configs: dict[str, object] = {}
    for schedule in ("gpipe", "1f1b"):
        configs[f"torch.distributed.pipelining {schedule}"] = torch_pipeline(
            make_model(a.layers, a.width), schedule, a.microbatches, x)
        torch._dynamo.reset()
        configs[f"modelpar devices='world' {schedule}"] = modelpar_world(
            make_model(a.layers, a.width), schedule, a.microbatches)
        if rank == 0:
            configs[f"modelpar 2 CPU workers, 1 process {schedule}"] = modelpar_workers(
                make_model(a.layers, a.width), schedule, a.microbatches)
        else:
            configs[f"modelpar 2 CPU workers, 1 process {schedule}"] = None
    times: dict[str, list[float]] = {k: [] for k in configs}
    for r in range(a.rounds + 1):  # round 0 warms up (compiles, plans)
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
        plans = [p for p in modelpar.plans() if p.pipeline is not None]
        stages = {str(p.pipeline).splitlines()[0] for p in plans}
        print(f"load average {os.getloadavg()[0]:.1f}; modelpar plans: {'; '.join(sorted(stages))}")
        print("| schedule | configuration | step (ms, median of rounds) | steps/s |")
        print("|---|---|---:|---:|")
        for name, ts in times.items():
            ms = statistics.median(ts)
            print(f"| {name.split()[-1]} | {' '.join(name.split()[:-1])} | {ms:.1f} | {1e3 / ms:.1f} |")
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
