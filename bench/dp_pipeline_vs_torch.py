"""Pipeline x data parallel on a pp=2 x dp=2 mesh of 4 processes: modelpar's
``mesh`` option against PyTorch's ``torch.distributed.pipelining``
(PipelineStage + Schedule1F1B / ScheduleGPipe over the pp group) with each
stage wrapped in ``DistributedDataParallel`` over the dp group (the stage
runs its micro-batches' backwards under ``no_sync`` but the last, so DDP
all-reduces once per step, bucketed, overlapping that last backward), all
over Gloo on this machine, issue 34's benchmark.

The same model (an nn.Sequential of L Linear(D)+ReLU layers, cut in the
middle: stage s holds half the layers on both sides), the same mesh (pipeline
outermost: rank r is stage r // 2 of replica r % 2), the same per-replica
batch B in m micro-batches, MSE loss on the last stage, one training step =
forward + loss + backward + gradients averaged over dp (no optimizer, no
checkpointing). Every process uses one intra-op thread.

Rounds are interleaved (each round times K steps of every configuration in
turn, all ranks entering each block through a barrier) so load from other
work falls on all alike; the table gives the median over rounds of the mean
step time of each block, and modelpar's all-reduce time from plans().

    torchrun --nproc-per-node 4 bench/dp_pipeline_vs_torch.py     (PYTHONPATH=build/python)
"""

from __future__ import annotations

import argparse
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


def torch_pp_ddp(model: torch.nn.Sequential, mesh, schedule: str, m: int):
    from torch.distributed.pipelining import PipelineStage, Schedule1F1B, ScheduleGPipe
    from torch.nn.parallel import DistributedDataParallel
    stage_index, stages = mesh.get_local_rank("pp"), mesh.size(0)
    half = len(model) // stages
    part = torch.nn.Sequential(*list(model)[stage_index * half:(stage_index + 1) * half])
    ddp = DistributedDataParallel(part, process_group=mesh.get_group("dp"), static_graph=True)
    stage = PipelineStage(ddp, stage_index, stages, torch.device("cpu"), group=mesh.get_group("pp"))
    cls = ScheduleGPipe if schedule == "gpipe" else Schedule1F1B
    sched = cls(stage, n_microbatches=m, loss_fn=F.mse_loss)

    def step(x: torch.Tensor, y: torch.Tensor) -> None:
        if stage_index == 0:
            sched.step(x)
        else:
            sched.step(target=y, losses=[])
        part.zero_grad(set_to_none=True)
    return step


def modelpar_mesh(model: torch.nn.Module, mesh, schedule: str, m: int):
    fn = torch.compile(lambda x, y: F.mse_loss(model(x), y), backend="modelpar",
                       options={"devices": "world", "mesh": mesh, "pipeline": {
                           "schedule": schedule, "microbatches": m, "checkpoint": "never"}})

    def step(x: torch.Tensor, y: torch.Tensor) -> None:
        fn(x, y).backward()
        model.zero_grad(set_to_none=True)
    return step


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--layers", type=int, default=8)
    ap.add_argument("--width", type=int, default=256)
    ap.add_argument("--batch", type=int, default=128, help="per replica")
    ap.add_argument("--microbatches", type=int, default=4)
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--steps", type=int, default=3, help="steps per timed block")
    a = ap.parse_args()
    torch.set_num_threads(1)
    dist.init_process_group("gloo")
    assert dist.get_world_size() == 4, "run with torchrun --nproc-per-node 4"
    mesh = modelpar.distributed.mesh.device_mesh(pp=2, dp=2)
    replica = mesh.get_local_rank("dp")
    g = torch.Generator().manual_seed(1 + replica)  # each replica its own batch
    x, y = torch.randn(a.batch, a.width, generator=g), torch.randn(a.batch, a.width, generator=g)

    configs = {}
    for schedule in ("gpipe", "1f1b"):
        configs[f"torch.distributed.pipelining + DDP {schedule}"] = torch_pp_ddp(
            make_model(a.layers, a.width), mesh, schedule, a.microbatches)
        torch._dynamo.reset()
        configs[f"modelpar mesh {schedule}"] = modelpar_mesh(
            make_model(a.layers, a.width), mesh, schedule, a.microbatches)
    times: dict[str, list[float]] = {k: [] for k in configs}
    for r in range(a.rounds + 1):  # round 0 warms up (compiles, plans)
        for name, step in configs.items():
            dist.barrier()
            t0 = time.perf_counter()
            for _ in range(a.steps):
                step(x, y)
            dist.barrier()
            if r:
                times[name].append((time.perf_counter() - t0) / a.steps * 1e3)
    reduces = [str(p.data_parallel.summary()) for p in modelpar.plans()
               if getattr(p, "data_parallel", None) is not None]
    if dist.get_rank() == 0:
        print(f"load average {os.getloadavg()[0]:.1f}; {os.cpu_count()} cores; "
              f"layers {a.layers} x width {a.width}, batch {a.batch} per replica in "
              f"{a.microbatches} micro-batches")
        print("rank 0 (stage 0, replica 0), modelpar: " + " | ".join(reduces))
        print("| schedule | configuration | step (ms, median of rounds) | steps/s |")
        print("|---|---|---:|---:|")
        for name, ts in times.items():
            ms = statistics.median(ts)
            print(f"| {name.split()[-1]} | {' '.join(name.split()[:-1])} | {ms:.1f} | "
                  f"{1e3 / ms:.1f} |")
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
