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
"""

from __future__ import annotations

import argparse
import os
import random
import sys
import time
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


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--steps", type=int, default=10_000)
    ap.add_argument("--sizes", type=int, default=12, help="distinct batch sizes (4, 5, ...)")
    ap.add_argument("--report", type=int, default=1000)
    args = ap.parse_args()
    torch.manual_seed(0)
    case = CASES["mlp"]
    model = case.make_model()
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    fast = torch.compile(lambda x, y: case.loss(model(x), y), backend="modelpar",
                         options={"devices": 2, "pipeline": {"microbatches": 2,
                                                             "schedule": "1f1b"}})
    rng = random.Random(0)
    sizes = list(range(4, 4 + args.sizes))
    print(f"{args.steps} steps, batch sizes {sizes[0]}..{sizes[-1]} at random, cache of "
          f"{compile_pipeline.MAX_BATCH_SIZES} per graph, torch {torch.__version__}")
    print("| step | VmRSS MiB | threads | batch sizes planned (cumulative) | evictions | s |")
    print("|---:|---:|---:|---:|---:|---:|")
    start = time.perf_counter()
    rows = []
    for step in range(1, args.steps + 1):
        n = rng.choice(sizes)
        x, y = case.batch(step, n)
        loss = fast(x, y)
        loss.backward()
        opt.step()
        opt.zero_grad()
        if step % args.report == 0 or step == 1:
            plan = modelpar.plans()[-1]
            planned = len(plan.pipeline_batches) + plan.pipeline_evictions
            row = (step, rss_mib(), threads(), planned, plan.pipeline_evictions)
            rows.append(row)
            print(f"| {step} | {row[1]:.1f} | {row[2]} | {planned} | {row[4]} | "
                  f"{time.perf_counter() - start:.1f} |", flush=True)
    after_warmup = [r for r in rows if r[0] >= min(args.steps, 2 * args.report)]
    if after_warmup:
        growth = after_warmup[-1][1] - after_warmup[0][1]
        print(f"\nVmRSS from step {after_warmup[0][0]} to {after_warmup[-1][0]}: {growth:+.1f} MiB; "
              f"threads {min(r[2] for r in after_warmup)}..{max(r[2] for r in after_warmup)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
