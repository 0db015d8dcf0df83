"""Pipeline partitioning of chains profiled from the test models (issue 6).

Each test model (tests/python/models.py) is compiled with
``torch.compile(backend="modelpar", options={"devices": 2})``; its joint
forward + backward graph (``modelpar.plans()[-1].joint``) is profiled node by
node on a CPU worker (``modelpar.planning.placement.profile_graph``: measured times), cut into a
layer chain (``modelpar._C.layer_chain``) and partitioned by each method
(torchgpipe's balance by time, PipeDream's DP, MadPipe's DP) under 1F1B* at
several memory limits. The table gives each method's period (the steady
state time per micro-batch, simulated) and, for MadPipe, the ratio of the
others to it.

    PYTHONPATH=build/python .venv/bin/python bench/partition_models.py
"""

from __future__ import annotations

import argparse
import math
import sys
from pathlib import Path

import torch

import modelpar
from modelpar import _C
from modelpar.planning.placement import profile_graph

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests/python"))
from models import CASES  # noqa: E402


def joint_graph(name: str):
    case = CASES[name]
    torch.manual_seed(0)
    model = case.make_model()
    x, y = case.batch(0, case.batch_size)
    modelpar.clear_plans()
    fast = torch.compile(model, backend="modelpar", options={"devices": 2})
    case.loss(fast(x), y).backward()
    joint = [p.joint for p in modelpar.plans() if p.joint is not None]
    if not joint:
        raise SystemExit(f"{name}: no joint plan (the model ran eagerly?)")
    return joint[-1].program.graph


def fmt_us(us: float) -> str:
    return "—" if math.isinf(us) else f"{us:.0f}"


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--devices", type=int, nargs="+", default=[2, 4])
    ap.add_argument("--microbatches", type=int, default=8)
    ap.add_argument("--bandwidth", type=float, default=5e9, help="bytes/s between workers")
    ap.add_argument("--latency-us", type=float, default=20.0)
    args = ap.parse_args()
    torch.set_num_threads(1)
    print(f"| model | layers | one device us | memory | devices | balance-time | pipedream "
          f"| madpipe | pipedream / madpipe | balance / madpipe |")
    print("|---|---|---|---|---|---|---|---|---|---|")
    for name in CASES:
        graph = profile_graph(joint_graph(name), runs=5)
        try:
            chain = _C.layer_chain(graph)
        except modelpar.ConfigError as e:  # not a chain of layers (nested modules interleave)
            print(f"| {name} | — | — | — | — | not a chain: {str(e).split(';')[0]} | | | | |")
            continue
        total = sum(l["fwd_us"] + l["bwd_us"] for l in chain)
        weights = sum(l["weight_bytes"] for l in chain) * 3
        stored = sum(l["stored_bytes"] for l in chain)
        # Memory limits from generous to tight, relative to what one device needs.
        need = weights + args.microbatches * stored
        for frac in (1.0, 0.5, 0.3):
            memory = max(1, int(need * frac))
            for n in args.devices:
                periods = {}
                for method in ("balance-time", "balance-time-comm", "madpipe"):
                    try:
                        r = _C.partition_chain(graph, method, n, args.microbatches, memory,
                                               args.bandwidth, args.latency_us, "1f1b*")
                        periods[method] = r["period_us"] if r["fits"] else math.inf
                    except modelpar.PlanDoesNotFitError:
                        periods[method] = math.inf
                mad = periods["madpipe"]
                ratio = lambda m: ("—" if math.isinf(periods[m]) or math.isinf(mad)
                                   else f"{periods[m] / mad:.2f}")
                print(f"| {name} | {len(chain)} | {total:.0f} | {memory / 2**20:.2f} MiB "
                      f"({frac:.0%}) | {n} | {fmt_us(periods['balance-time'])} | "
                      f"{fmt_us(periods['balance-time-comm'])} | {fmt_us(mad)} | {ratio('balance-time-comm')} | "
                      f"{ratio('balance-time')} |")


if __name__ == "__main__":
    main()
