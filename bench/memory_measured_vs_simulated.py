"""Peak memory per device, measured against simulated, for every pipeline
schedule and checkpoint mode (issue 35; results in bench/RESULTS.md).

Run from the repository root after building:

    PYTHONPATH=build/python python bench/memory_measured_vs_simulated.py
        [--batch 64] [--microbatches 4]

The step is examples/ir/skip_step_symbolic.txt (one SGD step of a 4-layer
MLP with a skip connection, symbolic batch). Per schedule (gpipe, 1f1b, 1f1b*, zb-h1 on 4 devices; interleaved and zb-v
on 2, their 4 stages placed looping / in a V) and checkpoint mode (always,
except_last, never): ``plan_pipeline`` plans the step and reports each
device's simulated peak (``Plan.peak_bytes``, Note [Memory model]); the
plan's Program then runs one step on CPU worker devices with
``measure_memory=True`` and ``Executor.memory_report()`` gives each device's
measured peak: the most bytes of distinct tensor storages its value slots
held after any instruction (runtime/memory_meter.h, Note [Measured memory]).
Both are exact byte counts, not timings: a rerun prints the same table.
Prints a Markdown table (ratio = measured / simulated).
"""

from __future__ import annotations

import argparse
from pathlib import Path

import torch

import modelpar

ROOT = Path(__file__).resolve().parents[1]
SCHEDULES = {"gpipe": 4, "1f1b": 4, "1f1b*": 4, "interleaved": 2, "zb-h1": 4, "zb-v": 2}
CHECKPOINTS = ["always", "except_last", "never"]
STEP = ROOT / "examples/ir/skip_step_symbolic.txt"


def step_inputs(batch: int, seed: int = 0) -> list[torch.Tensor]:
    """x, y, w1..w4 of examples/ir/skip_step_symbolic.txt (as tests/python/test_pipeline_plan.py)."""
    g = torch.Generator().manual_seed(seed)
    return [torch.randn(batch, 16, generator=g), torch.randn(batch, 4, generator=g),
            torch.randn(16, 32, generator=g) * 0.3, torch.randn(32, 32, generator=g) * 0.2,
            torch.randn(32, 32, generator=g) * 0.2, torch.randn(32, 4, generator=g) * 0.3]


def measure(schedule: str, checkpoint: str, devices: int, batch: int,
            microbatches: int) -> list[dict]:
    """One row per device: simulated and measured peak bytes."""
    plan = modelpar.plan_pipeline(STEP, devices=devices, microbatches=microbatches,
                                  batch_size=batch, schedule=schedule, checkpoint=checkpoint)
    ex = modelpar.Executor(plan.program, device_map="cpu-workers", threads_per_device=1,
                           measure_memory=True)
    ex.run(step_inputs(batch))
    report = ex.memory_report()["devices"]
    return [{"device": d, "simulated": int(sim), "measured": m["peak_bytes"],
             "peak_instruction": m["peak_instruction"]}
            for d, (sim, m) in enumerate(zip(plan.peak_bytes, report))]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--batch", type=int, default=64)
    ap.add_argument("--microbatches", type=int, default=4)
    args = ap.parse_args()
    print("| schedule | checkpoint | device | simulated (B) | measured (B) | measured / simulated "
          "| measured peak after instruction |")
    print("|---|---|---:|---:|---:|---:|---:|")
    worst = 0.0
    for schedule, devices in SCHEDULES.items():
        for checkpoint in CHECKPOINTS:
            for r in measure(schedule, checkpoint, devices, args.batch, args.microbatches):
                ratio = r["measured"] / r["simulated"]
                worst = max(worst, abs(ratio - 1))
                print(f"| {schedule} | {checkpoint} | {r['device']} | {r['simulated']} | "
                      f"{r['measured']} | {ratio:.4f} | {r['peak_instruction']} |")
    print(f"\nlargest |measured / simulated - 1|: {worst * 100:.2f} %")


if __name__ == "__main__":
    main()
