"""Per-layer recomputation against whole-pipeline checkpointing at the same
memory limit (issue 35, item 5: "per-layer recompute >= 1.2x the best
whole-pipeline checkpoint mode at the same limit on a model where the limit
binds"; results in bench/RESULTS.md).

    PYTHONPATH=build/python .venv/bin/python bench/recompute_per_layer.py \
        [--hidden 256] [--layers 4] [--batch 16] [--seq 128] [--limit-fracs 0.25,0.5,0.75]

A Llama-style decoder (transformers, random init) trained with
``torch.compile(backend="modelpar")`` as a 1F1B pipeline on 2 CPU workers,
m micro-batches. Each whole-pipeline mode (never, except_last, always) is
compiled once with no limit and its largest simulated per-device peak read
(``plans()[-1].pipeline.peak_bytes``): its plan is the same under any limit
it fits. The limits lie between always's peak (the least any mode needs) and
except_last's (the next): ``always + f x (except_last - always)`` for each
f of --limit-fracs, so that never and except_last do not fit and always
does. At each limit ``checkpoint="per_layer"`` (Note [Recompute per layer])
is compiled. Every compiled step is then timed in alternating rounds (one
step each per round, after the warm-up step that planned it), which
spreads a busy machine's slow spells over all alike; per limit the table
gives the fastest whole-pipeline mode that fits, per_layer's median and
simulated step, its simulated peak against the limit and how many layers it
recomputes.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time

import torch
import torch.nn.functional as F

from zoo_pipeline_throughput import first_pipelined_step, make_model, own_code

WHOLE = ("never", "except_last", "always")


def compiled(args, checkpoint: str, memory: int | None):
    model = make_model(args.hidden, args.layers, args.seq, args.vocab)
    options = {"devices": 2, "pipeline": {"schedule": args.schedule,
                                          "microbatches": args.microbatches,
                                          "checkpoint": checkpoint}}
    if memory is not None:
        options["memory"] = memory
    step = own_code(lambda a, b: F.cross_entropy(model(a).logits.flatten(0, 1), b.flatten()),
                    f"{checkpoint}_{memory}")
    return torch.compile(step, backend="modelpar", options=options), model


def first_step(fn, x, y):
    """Runs the step once (compiles and plans); the PipelinePlan it made."""
    plan = first_pipelined_step(fn, x, y)
    if plan is None:
        raise SystemExit("no pipelined plan was made (a graph break?): see modelpar.plans()")
    return plan


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--hidden", type=int, default=256)
    ap.add_argument("--layers", type=int, default=4)
    ap.add_argument("--batch", type=int, default=16)
    ap.add_argument("--seq", type=int, default=128)
    ap.add_argument("--vocab", type=int, default=1024)
    ap.add_argument("--microbatches", type=int, default=4)
    ap.add_argument("--schedule", default="1f1b")
    ap.add_argument("--limit-fracs", default="0.25,0.5,0.75",
                    help="where each limit lies between always's peak (0) and except_last's (1)")
    ap.add_argument("--rounds", type=int, default=7)
    args = ap.parse_args()
    torch._dynamo.config.cache_size_limit = 64
    g = torch.Generator().manual_seed(0)
    x = torch.randint(0, args.vocab, (args.batch, args.seq), generator=g)
    y = torch.roll(x, -1, dims=1)
    print(f"Llama-style decoder: hidden {args.hidden}, {args.layers} layers, batch {args.batch}, "
          f"sequence {args.seq}; {args.schedule}, m={args.microbatches}, 2 CPU workers; "
          f"torch {torch.__version__}, {torch.get_num_threads()} threads", flush=True)

    # The whole-pipeline modes' plans do not depend on the limit (a
    # balance-time cut is made without it, and the plan is held to its
    # simulated peak: Note [The simulated peak decides]); each is compiled
    # once, and fits a limit when its peak does.
    whole = {}
    for mode in WHOLE:
        fn, _ = compiled(args, mode, None)
        plan = first_step(fn, x, y)
        whole[mode] = {"fn": fn, "plan": plan, "peak": max(plan.peak_bytes), "times": []}
        print(f"  {mode}: largest simulated peak {whole[mode]['peak'] / 2**20:.2f} MiB, "
              f"simulated step {plan.step_time_us / 1e3:.1f} ms", flush=True)
    low, high = whole["always"]["peak"], whole["except_last"]["peak"]
    if not low < high <= whole["never"]["peak"]:
        raise SystemExit("no limit binds the way this benchmark needs (always's peak must be "
                         "under except_last's); try a longer --seq or more --microbatches")
    limits = [int(low + float(f) * (high - low)) for f in args.limit_fracs.split(",")]
    per_layer = {}
    for limit in limits:
        fn, _ = compiled(args, "per_layer", limit)
        per_layer[limit] = {"fn": fn, "plan": first_step(fn, x, y), "times": []}
    timed = [whole[m] for m in WHOLE] + list(per_layer.values())
    for _ in range(args.rounds):
        for r in timed:
            t0 = time.perf_counter()
            r["fn"](x, y).backward()
            r["times"].append(time.perf_counter() - t0)

    def ms(r):
        return statistics.median(r["times"]) * 1e3

    print()
    print("| limit | fits it (whole-pipeline modes) | best whole mode ms | per_layer ms | "
          "per_layer simulated ms | its peak / limit | layers recomputed | per_layer vs best whole |")
    print("|---:|---|---:|---:|---:|---:|---|---:|")
    for limit in limits:
        fitting = [m for m in WHOLE if whole[m]["peak"] <= limit]
        best = min(fitting, key=lambda m: ms(whole[m]))
        r = per_layer[limit]
        plan = r["plan"]
        layers = f"{len(plan.recomputed_layers)} of {len(plan.stage_of_layer)}"
        print(f"| {limit / 2**20:.2f} MiB | {', '.join(fitting)} | {best}: {ms(whole[best]):.1f} | "
              f"{ms(r):.1f} | {plan.step_time_us / 1e3:.1f} | {max(plan.peak_bytes) / limit:.3f} | "
              f"{layers} | {ms(whole[best]) / ms(r):.2f}x |", flush=True)
    print(f"\nwith no limit: never {ms(whole['never']):.1f} ms, except_last "
          f"{ms(whole['except_last']):.1f} ms, always {ms(whole['always']):.1f} ms (medians of "
          f"{args.rounds} rounds, in the same rounds as the rows above)")
    for limit in limits:
        plan = per_layer[limit]["plan"]
        print(f"at {limit / 2**20:.2f} MiB per_layer recomputes:", ", ".join(plan.recomputed_layers))
        print("  its choice:", *[line.strip() for line in str(plan).splitlines()
                                 if "recompute-search" in line])
    return 0


if __name__ == "__main__":
    sys.exit(main())
