"""Simulated training-step time of the test models placed model-parallel on
1, 2, 4 and 8 devices by each placer (issue 7's benchmark for captured
graphs; results in bench/RESULTS.md).

Run from the repository root after building:

    PYTHONPATH=build/python python bench/plan_models.py [--models mlp,gpt]
        [--machine profile.json] [--save-machine out.json] [--lp-time-limit 20]
        [--batch-scale 1]

What it does:

1. Machine profile. Unless ``--machine`` is given, it calibrates one device
   of this CPU as the CPU-worker executor runs it (one intra-op thread per
   logical device): kernel samples (``mm`` of 64..512 squared: FLOP-bound;
   ``add`` of 1k..4M floats: bandwidth-bound; a 1-element ``relu``: launch
   overhead) and transfer samples (``clone`` of 4 KiB..16 MiB: what a CPU
   worker's tx stream does) are fitted by ``passes/cost/calibrate.h`` (least
   squares, non-negative) into a one-device profile; ``plan_graph``
   replicates it to N devices. Transfers also pay a fixed hand-off of
   ``--handoff-us`` (default 20 us: the executor's measured send → clone →
   recv host cost, bench/RESULTS.md, executor_overhead.py) on top of the fitted
   latency. Memory per device: ``--memory`` (default 4 GiB; the models need
   kilobytes to megabytes, so memory never binds here).
2. For each model of tests/python/models.py: ``torch.compile(backend=
   "modelpar")``, one training step (forward + loss + backward) at the test
   batch size (times ``--batch-scale``), then the IR graphs of every plan
   recorded for it (``modelpar.plans()``: forward and backward). Node costs
   come from a profile (the cost model's first source): each graph runs on
   one CPU worker of the executor with ``modelpar.planning.placement.example_inputs``
   and every node gets its median time of ``--profile-runs`` runs
   (``profile_graph``). Each graph is then planned on its own by every placer
   on 1, 2, 4 and 8 devices; the training step is forward + backward. The
   table also shows the measured compiled step (median of ``--steps``, one
   thread; it includes Dynamo's and AOTAutograd's fixed per-step cost) and
   the one-device step of the roofline model alone with the calibrated
   profile, to show how far the analytic model is from the profile.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import sys
import tempfile
import time
from pathlib import Path

import torch

import modelpar
from modelpar.planning.placement import calibrated_machine, plan_graph, profile_graph

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests" / "python"))
from models import CASES  # noqa: E402

DEVICES = (1, 2, 4, 8)


def _median_us(fn, reps: int) -> float:
    fn()
    times = []
    for _ in range(reps):
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    return statistics.median(times) * 1e6


def calibrate(memory: str, handoff_us: float) -> tuple[str, dict[str, float]]:
    """A one-device profile of this CPU (see the module docstring) and its
    parameters for people."""
    kernels: list[tuple[float, float, float]] = []
    for n in (64, 128, 256, 384, 512):
        a, b = torch.randn(n, n), torch.randn(n, n)
        us = _median_us(lambda: torch.mm(a, b), 15)
        kernels.append((3 * 4 * n * n, 2 * n ** 3, us))
    for numel in (1_000, 10_000, 100_000, 1_000_000, 4_000_000):
        a, b = torch.randn(numel), torch.randn(numel)
        us = _median_us(lambda: torch.add(a, b), 15)
        kernels.append((12 * numel, numel, us))
    one = torch.randn(1)
    kernels.append((8, 1, _median_us(lambda: torch.relu(one), 200)))
    transfers: list[tuple[float, float]] = []
    for nbytes in (4 << 10, 64 << 10, 1 << 20, 4 << 20, 16 << 20):
        t = torch.randn(nbytes // 4)
        transfers.append((nbytes, _median_us(lambda: t.clone(), 15)))
    text = calibrated_machine(kernels, transfers, memory=memory, name="cpu",
                              extra_latency_us=handoff_us)
    prof = json.loads(text)
    dev, link = prof["devices"][0], prof["default_link"]
    summary = {"peak_gflops": dev["peak_flops"] / 1e9,
               "memory_gb_per_s": dev["memory_bandwidth_bytes_per_s"] / 1e9,
               "launch_us": dev["launch_overhead_us"],
               "link_latency_us": link["latency_us"],
               "link_gb_per_s": link["bandwidth_bytes_per_s"] / 1e9}
    return text, summary


def measured_step_us(step, steps: int) -> float:
    for _ in range(3):
        step()
    times = []
    for _ in range(steps):
        t0 = time.perf_counter()
        step()
        times.append(time.perf_counter() - t0)
    return statistics.median(times) * 1e6


def bench_model(name: str, machine: str, lp_time_limit: float, steps: int, batch_scale: int,
                profile_runs: int) -> dict:
    case = CASES[name]
    torch.manual_seed(0)
    model = case.make_model()
    torch._dynamo.reset()
    modelpar.clear_plans()
    fast = torch.compile(model, backend="modelpar", options={"strict": True})
    x, y = case.batch(0, case.batch_size * batch_scale)

    def step() -> None:
        case.loss(fast(x), y).backward()
        model.zero_grad(set_to_none=True)

    step()
    graphs = [rec.graph for p in modelpar.plans() for rec in p.graphs.values()
              if rec.graph is not None]
    measured = measured_step_us(step, steps)
    # Cost source 1: every node timed on a CPU worker (median of runs).
    profiled = [profile_graph(g, runs=profile_runs) for g in graphs]

    def simulate(gs, placer: str, n: int):
        t0 = time.perf_counter()
        plans = [plan_graph(g, devices=n, placer=placer, machine=machine, dump_dir="",
                            lp_time_limit_s=lp_time_limit) for g in gs]
        return plans, time.perf_counter() - t0

    analytic, _ = simulate(graphs, "m-etf", 1)
    row = {"model": name, "batch": case.batch_size * batch_scale, "graphs": len(graphs),
           "nodes": sum(g.num_nodes for g in graphs), "measured_us": measured,
           "analytic_single_us": sum(p.single_device_us for p in analytic), "results": {}}
    for placer in modelpar.planning.placement.PLACERS:
        for n in DEVICES:
            plans, seconds = simulate(profiled, placer, n)
            step_us = sum(p.step_time_us for p in plans)
            single_us = sum(p.single_device_us for p in plans)
            row["units"] = sum(p.num_units for p in plans)
            row["single_us"] = single_us
            row["results"][f"{placer}/{n}"] = {
                "step_us": step_us, "plan_seconds": seconds, "speedup": single_us / step_us,
                "transfers": sum(p.num_transfers for p in plans),
                "devices_used": max(sum(1 for k in p.nodes_per_device if k) for p in plans)}
    return row


def _ms(us: float) -> str:
    return f"{us / 1e3:.3f}"


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--models", default=",".join(CASES))
    ap.add_argument("--machine", default=None, help="use this profile instead of calibrating")
    ap.add_argument("--save-machine", default=None, help="write the calibrated profile there")
    ap.add_argument("--memory", default="4GiB")
    ap.add_argument("--handoff-us", type=float, default=20.0)
    ap.add_argument("--lp-time-limit", type=float, default=20.0)
    ap.add_argument("--steps", type=int, default=20, help="steps for the measured column")
    ap.add_argument("--batch-scale", type=int, default=1,
                    help="multiply each model's test batch size (larger steps, more compute)")
    ap.add_argument("--profile-runs", type=int, default=10,
                    help="timed runs per graph for the node profile (median)")
    ap.add_argument("--json", default=None, help="also write the raw results there")
    args = ap.parse_args()

    torch.set_num_threads(1)  # one CPU worker = one logical device
    if args.machine:
        machine = args.machine
        profile = json.loads(Path(machine).read_text())
        dev, link = profile["devices"][0], profile["default_link"]
        summary = {"peak_gflops": dev["peak_flops"] / 1e9,
                   "memory_gb_per_s": dev["memory_bandwidth_bytes_per_s"] / 1e9,
                   "launch_us": dev["launch_overhead_us"], "link_latency_us": link["latency_us"],
                   "link_gb_per_s": link["bandwidth_bytes_per_s"] / 1e9}
    else:
        text, summary = calibrate(args.memory, args.handoff_us)
        fd, machine = tempfile.mkstemp(suffix=".json", prefix="modelpar-machine-")
        os.close(fd)
        Path(machine).write_text(text)
        if args.save_machine:
            Path(args.save_machine).write_text(text)
    print(f"# {platform.processor() or platform.machine()}, torch {torch.__version__}, "
          f"{os.cpu_count()} cores, 1 thread per device")
    print("# machine per device: " + ", ".join(f"{k} {v:.4g}" for k, v in summary.items()))

    rows = [bench_model(name, machine, args.lp_time_limit, args.steps, args.batch_scale,
                        args.profile_runs)
            for name in args.models.split(",")]
    print()
    head = ("| model | batch | nodes (fw+bw) | units | measured step, 1 thread (ms) | "
            "roofline 1 device (ms) | profiled 1 device (ms) |")
    sep = "|---|---|---|---|---|---|---|"
    for placer in modelpar.planning.placement.PLACERS:
        for n in DEVICES[1:]:
            head += f" {placer} {n} dev (ms) |"
            sep += "---|"
    print(head)
    print(sep)
    for r in rows:
        line = (f"| {r['model']} | {r['batch']} | {r['nodes']} | {r['units']} | "
                f"{_ms(r['measured_us'])} | {_ms(r['analytic_single_us'])} | {_ms(r['single_us'])} |")
        for placer in modelpar.planning.placement.PLACERS:
            for n in DEVICES[1:]:
                res = r["results"][f"{placer}/{n}"]
                line += f" {_ms(res['step_us'])} ({res['speedup']:.2f}x{'' if res['devices_used'] > 1 else ', 1 used'}) |"
        print(line)
    print()
    print("planning time per model (all graphs, s): " + "; ".join(
        f"{r['model']}: " + ", ".join(
            f"{p} {max(r['results'][f'{p}/{n}']['plan_seconds'] for n in DEVICES):.3f}"
            for p in modelpar.planning.placement.PLACERS) for r in rows))
    # One-device check: every placer gives the one-device sum on 1 device.
    for r in rows:
        for placer in modelpar.planning.placement.PLACERS:
            one = r["results"][f"{placer}/1"]["step_us"]
            assert abs(one - r["single_us"]) <= 1e-6 * r["single_us"], (r["model"], placer, one)
    if args.json:
        Path(args.json).write_text(json.dumps({"machine": summary, "rows": rows}, indent=2))
    if not args.machine:
        os.unlink(machine)
    return 0


if __name__ == "__main__":
    sys.exit(main())
