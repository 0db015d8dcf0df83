"""Measured pipeline throughput through torch.compile on CPU worker devices
(issue 6): an nn.Sequential of L Linear+ReLU layers of width D, one training
step (forward, MSE loss, backward) compiled with the loss inside.

Compared: eager PyTorch (one intra-op thread), modelpar on one device
(`devices=1`, the interpreter), modelpar pipelined over 2 CPU workers with m
micro-batches (`pipeline` option, step mode) for each schedule, and the bound
n·m/(m+n−1) of uniform stages with free transfers.

    PYTHONPATH=build/python .venv/bin/python bench/compile_pipeline_throughput.py
"""

from __future__ import annotations

import argparse
import statistics
import time

import torch
import torch.nn.functional as F

import modelpar


def timed(step, x, y, warmup: int, repeats: int) -> float:
    for _ in range(warmup):
        step(x, y).backward()
    times = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        step(x, y).backward()
        times.append(time.perf_counter() - t0)
    return statistics.median(times) * 1e3


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--layers", type=int, default=8)
    ap.add_argument("--width", type=int, default=512)
    ap.add_argument("--batch", type=int, default=512)
    ap.add_argument("--microbatches", type=int, default=8)
    ap.add_argument("--repeats", type=int, default=10)
    a = ap.parse_args()
    torch.set_num_threads(1)
    torch.manual_seed(0)
    layers = []
    for _ in range(a.layers):
        layers += [torch.nn.Linear(a.width, a.width), torch.nn.ReLU()]
    model = torch.nn.Sequential(*layers)
    x, y = torch.randn(a.batch, a.width), torch.randn(a.batch, a.width)
    torch._dynamo.mark_dynamic(x, 0)
    torch._dynamo.mark_dynamic(y, 0)

    def loss(x, y):
        return F.mse_loss(model(x), y)

    rows = [("eager (1 thread)", timed(loss, x, y, 2, a.repeats), "")]
    torch._dynamo.reset()
    one = torch.compile(loss, backend="modelpar", options={"devices": 1})
    rows.append(("modelpar, 1 device", timed(one, x, y, 2, a.repeats), ""))
    n, m = 2, a.microbatches
    for schedule in ("gpipe", "1f1b"):
        torch._dynamo.reset()
        pipe = torch.compile(loss, backend="modelpar", options={
            "devices": n, "pipeline": {"microbatches": m, "schedule": schedule,
                                       "checkpoint": "never"}})
        ms = timed(pipe, x, y, 2, a.repeats)
        p = modelpar.plans()[-1].pipeline
        rows.append((f"pipeline {schedule}, {n} stages, m={m}", ms,
                     f"simulated {p.step_time_us / 1e3:.1f} ms, stages {p.num_stages}"))
    base = rows[1][1]
    print(f"{a.layers} x Linear({a.width}) + ReLU, batch {a.batch}, bound n·m/(m+n-1) = "
          f"{n * m / (m + n - 1):.2f}x")
    print(f"| configuration | step (ms, median of {a.repeats}) | vs modelpar 1 device | note |")
    print("|---|---|---|---|")
    for name, ms, note in rows:
        print(f"| {name} | {ms:.1f} | {base / ms:.2f}x | {note} |")


if __name__ == "__main__":
    main()
