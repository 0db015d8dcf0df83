"""Resident memory and thread count over a long pipelined training run with
changing batch sizes (issue 12: bounded resources).

A compiled pipelined step keeps one pipelined program and its executors
(worker threads) per batch size, at most compile/pipeline_step.py's MAX_BATCH_SIZES of
them (least recently used dropped). This runs STEPS steps of a small MLP
under ``options={"devices": 2, "pipeline": {...}}`` with the batch size drawn
from SIZES distinct values (more than the cache holds), and prints resident
memory (VmRSS) and the process's thread count every REPORT steps: both must
stay flat once the cache is full.

    PYTHONPATH=build/python .venv/bin/python bench/bounded_resources.py --steps 10000

``--mode ranks`` runs the same pipeline over the ranks of a Gloo group
(``devices="world"``; launch it with ``python -m torch.distributed.run
--nproc-per-node 2``): every rank draws the same batch sizes and batches, and
rank 0 prints every rank's rows. ``--mode device`` trains the MLP moved to
``torch.device("modelpar")`` (the eager device, each captured step placed on
2 CPU workers, its plan cache of ``max_plans`` captured steps) with the same
random batch sizes.
"""

from __future__ import annotations

import argparse
import os
import random
import sys
import time
from collections.abc import Callable
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests" / "python"))
import modelpar  # noqa: E402
from modelpar.compile import pipeline_step as compile_pipeline  # noqa: E402
from models import CASES  # noqa: E402


def rss_mib() -> float:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    return float("nan")


def threads() -> int:
    return len(os.listdir("/proc/self/task"))


def report(step: int, counted: tuple[int, int], start: float, rows: list[tuple]) -> None:
    """Appends and prints one row: step, VmRSS, threads, two counters."""
    row = (step, rss_mib(), threads(), counted[0], counted[1])
    rows.append(row)
    print(f"| {step} | {row[1]:.1f} | {row[2]} | {row[3]} | {row[4]} | "
          f"{time.perf_counter() - start:.1f} |", flush=True)


def summary(rows: list[tuple], steps: int, every: int) -> str:
    after_warmup = [r for r in rows if r[0] >= min(steps, 2 * every)]
    if not after_warmup:
        return ""
    growth = after_warmup[-1][1] - after_warmup[0][1]
    return (f"VmRSS from step {after_warmup[0][0]} to {after_warmup[-1][0]}: {growth:+.1f} MiB; "
            f"threads {min(r[2] for r in after_warmup)}..{max(r[2] for r in after_warmup)}")


def train(args: argparse.Namespace, step_fn: Callable[[torch.Tensor, torch.Tensor], torch.Tensor],
          opt: torch.optim.Optimizer, to: Callable[[torch.Tensor], torch.Tensor],
          counters: Callable[[], tuple[int, int]], header: str) -> list[tuple]:
    """STEPS SGD steps of the MLP case at random batch sizes (the same draw
    on every rank); a row every REPORT steps."""
    case = CASES["mlp"]
    rng = random.Random(0)
    sizes = list(range(4, 4 + args.sizes))
    print(f"{args.steps} steps, batch sizes {sizes[0]}..{sizes[-1]} at random, torch "
          f"{torch.__version__}", flush=True)
    print(f"| step | VmRSS MiB | threads | {header} | s |\n|---:|---:|---:|---:|---:|---:|", flush=True)
    start = time.perf_counter()
    rows: list[tuple] = []
    for step in range(1, args.steps + 1):
        x, y = case.batch(step, rng.choice(sizes))
        opt.zero_grad()
        loss = step_fn(to(x), to(y))
        loss.backward()
        opt.step()
        float(loss.detach())  # as a training loop logs it (on the device: the step runs here)
        if step % args.report == 0 or step == 1:
            report(step, counters(), start, rows)
    return rows


def pipelined_counters() -> tuple[int, int]:
    plan = modelpar.plans()[-1]
    return len(plan.pipeline_batches) + plan.pipeline_evictions, plan.pipeline_evictions


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--mode", choices=["compile", "ranks", "device"], default="compile")
    ap.add_argument("--steps", type=int, default=10_000)
    ap.add_argument("--sizes", type=int, default=12, help="distinct batch sizes (4, 5, ...)")
    ap.add_argument("--report", type=int, default=1000)
    args = ap.parse_args()
    torch.manual_seed(0)
    case = CASES["mlp"]
    model = case.make_model()
    pipeline = {"microbatches": 2, "schedule": "1f1b"}
    header = "batch sizes planned (cumulative) | evictions"
    if args.mode == "device":
        modelpar.device.configure(devices=2)  # each captured step placed on 2 CPU workers
        model = model.to("modelpar")
        modelpar.attach(model)
        opt = torch.optim.SGD(model.parameters(), lr=0.01)
        counted = modelpar.device.device_counters
        rows = train(args, lambda x, y: case.loss(model(x), y), opt, lambda t: t.to("modelpar"),
                     lambda: (counted()["captures"], counted()["evictions"]),
                     "steps captured (cumulative) | plans evicted")
        print("\n" + summary(rows, args.steps, args.report))
        return 0
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    if args.mode == "compile":
        print(f"cache of {compile_pipeline.MAX_BATCH_SIZES} batch sizes per graph")
        fast = torch.compile(lambda x, y: case.loss(model(x), y), backend="modelpar",
                             options={"devices": 2, "pipeline": pipeline})
        rows = train(args, fast, opt, lambda t: t, pipelined_counters, header)
        print("\n" + summary(rows, args.steps, args.report))
        return 0
    import torch.distributed as dist
    dist.init_process_group("gloo")
    rank, world = dist.get_rank(), dist.get_world_size()
    fast = torch.compile(lambda x, y: case.loss(model(x), y), backend="modelpar",
                         options={"devices": "world", "pipeline": pipeline})
    if rank != 0:
        sys.stdout = open(os.devnull, "w")  # rank 0 prints every rank's rows below
    rows = train(args, fast, opt, lambda t: t, pipelined_counters, header)
    everyone: list = [None] * world
    dist.all_gather_object(everyone, rows)
    if rank == 0:
        for r, theirs in enumerate(everyone):
            print(f"\nrank {r} of {world}:\n| step | VmRSS MiB | threads | {header} |\n"
                  "|---:|---:|---:|---:|---:|")
            for row in theirs:
                print(f"| {row[0]} | {row[1]:.1f} | {row[2]} | {row[3]} | {row[4]} |")
            print(summary(theirs, args.steps, args.report))
    dist.destroy_process_group()
    return 0


if __name__ == "__main__":
    sys.exit(main())
