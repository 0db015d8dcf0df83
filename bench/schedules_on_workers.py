"""Each pipeline schedule against 1F1B on in-process CPU workers, a
transformer (issue 35's goals: on 4 CPU workers, m = 8, ZB-V's step <=
0.85x modelpar's 1F1B at <= 1.0x its peak memory, interleaved v=2 <= 0.92x;
in-process on 2 and 4 workers, the measured speed-up within 10 % of the
simulated bubble's bound; results in bench/RESULTS.md).

    PYTHONPATH=build/python .venv/bin/python bench/schedules_on_workers.py \
        [--devices 4] [--microbatches 8] [--hidden 256] [--layers 8] [--batch 16] [--seq 128]

A Llama-style decoder (transformers, random init; bench/zoo_pipeline_throughput.py's)
trained with ``torch.compile(backend="modelpar")`` and ``checkpoint="never"``:
modelpar on one device with one thread (what each worker has), then each
schedule of --schedules on --devices CPU workers (interleaved with its
default v = 2, zb-v's V of 2 stages per device). Every compiled step is
timed in alternating rounds (one step each per round, after the warm-up
step that planned it and one untimed round; medians), which spreads a busy machine's slow spells
over all alike. Per schedule: the median step, its ratio to 1F1B's, the
simulated step and bubble, the largest simulated peak per device against
1F1B's, the speed-up over one device against the plan's ideal speed-up
(``ideal_speedup``: n·m/(m+n-1) for 1F1B and the closed forms of the other
schedules with uniform stages and free transfers) and the measured
speed-up as a fraction of the simulated one.

On a machine with fewer cores than workers the workers share them: the
speed-ups are then bounded by the cores, not the bubble (the table says how
many cores there were).
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time

import torch
import torch.nn.functional as F

from zoo_pipeline_throughput import first_pipelined_step, make_model, own_code


def compiled(args, options: dict):
    model = make_model(args.hidden, args.layers, args.seq, args.vocab)
    step = own_code(lambda a, b: F.cross_entropy(model(a).logits.flatten(0, 1), b.flatten()),
                    str(options))
    return torch.compile(step, backend="modelpar", options=options)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--devices", type=int, default=4)
    ap.add_argument("--microbatches", type=int, default=8)
    ap.add_argument("--schedules", default="1f1b,gpipe,interleaved,zb-h1,zb-v")
    ap.add_argument("--hidden", type=int, default=256)
    ap.add_argument("--layers", type=int, default=8)
    ap.add_argument("--batch", type=int, default=16)
    ap.add_argument("--seq", type=int, default=128)
    ap.add_argument("--vocab", type=int, default=1024)
    ap.add_argument("--rounds", type=int, default=7)
    args = ap.parse_args()
    schedules = args.schedules.split(",")
    if "1f1b" not in schedules:
        raise SystemExit("--schedules needs 1f1b: every row is compared with it")
    g = torch.Generator().manual_seed(0)
    x = torch.randint(0, args.vocab, (args.batch, args.seq), generator=g)
    y = torch.roll(x, -1, dims=1)
    cores = len(os.sched_getaffinity(0))
    print(f"Llama-style decoder: hidden {args.hidden}, {args.layers} layers, batch {args.batch}, "
          f"sequence {args.seq}; {args.devices} CPU workers on {cores} cores, "
          f"m={args.microbatches}; torch {torch.__version__}", flush=True)

    threads = torch.get_num_threads()
    torch.set_num_threads(1)  # a CPU worker's thread count: the one-device baseline's
    runs = {"one device, 1 thread": {"fn": compiled(args, {}), "plan": None, "times": []}}
    first_pipelined_step(runs["one device, 1 thread"]["fn"], x, y)
    torch.set_num_threads(threads)
    for s in schedules:
        fn = compiled(args, {"devices": args.devices,
                             "pipeline": {"schedule": s, "microbatches": args.microbatches,
                                          "checkpoint": "never"}})
        plan = first_pipelined_step(fn, x, y)
        if plan is None:
            raise SystemExit(f"{s}: no pipelined plan was made (see modelpar.plans())")
        runs[s] = {"fn": fn, "plan": plan, "times": []}
        print(f"  {s}: planned, {plan.num_stages} stages, simulated step "
              f"{plan.step_time_us / 1e3:.1f} ms", flush=True)
    # One untimed round first: a pipelined step traces its batch again as
    # symbolic and marks the caller's tensors so, which makes Dynamo compile
    # the one-device step once more at its next call.
    for rnd in range(args.rounds + 1):
        for name, r in runs.items():
            if name.startswith("one device"):
                torch.set_num_threads(1)
            t0 = time.perf_counter()
            r["fn"](x, y).backward()
            if rnd:
                r["times"].append(time.perf_counter() - t0)
            torch.set_num_threads(threads)

    def ms(name):
        return statistics.median(runs[name]["times"]) * 1e3

    one = ms("one device, 1 thread")
    base_peak = max(runs["1f1b"]["plan"].peak_bytes)
    print()
    print("| schedule | stages | step ms (median) | vs 1f1b | simulated ms | simulated bubble | "
          "largest peak vs 1f1b's | speed-up over 1 device, 1 thread | simulated speed-up | "
          "ideal (closed form) | measured / simulated speed-up |")
    print("|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|")
    print(f"| one device, 1 thread | 1 | {one:.1f} | | | | | 1.00x | | | |")
    for s in schedules:
        plan = runs[s]["plan"]
        t = ms(s)
        sim_speedup = plan.speedup
        print(f"| {s} | {plan.num_stages} | {t:.1f} | {t / ms('1f1b'):.2f}x | "
              f"{plan.step_time_us / 1e3:.1f} | {plan.bubble_fraction:.1%} | "
              f"{max(plan.peak_bytes) / base_peak:.2f}x | {one / t:.2f}x | {sim_speedup:.2f}x | "
              f"{plan.ideal_speedup:.2f}x | {one / t / sim_speedup:.0%} |", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
