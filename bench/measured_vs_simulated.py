"""Measured vs simulated training-step time of the test models on 1, 2 and 4
CPU worker devices (issue 5's benchmark; results in bench/RESULTS.md).

Run from the repository root after building:

    PYTHONPATH=build/python python bench/measured_vs_simulated.py [--models mlp,gpt]
        [--runs 20] [--profile-runs 5] [--machine profile.json]

What it does, per model of tests/python/models.py:

1. Calibrate first. The machine profile is fitted on this CPU as
   bench/plan_models.py does (``calibrated_machine``: kernel and clone
   samples, least squares, plus the executor's measured hand-off per
   transfer), unless ``--machine`` is given. Node costs are measured:
   ``torch.compile(backend="modelpar", options={"devices": 2})`` captures
   the forward and backward graphs and how they join (``PlanRecord.joint_links``);
   each graph is timed node by node on one CPU worker (``profile_graph``,
   the median of ``--profile-runs``).
2. For N in 1, 2, 4: ``plan_joint`` places forward and backward as one with
   the profiled costs on the calibrated machine (m-ETF) and reports the
   simulated step; the two split Programs then run on N CPU worker devices
   (``Executor``, ``threads_per_device=1``) on inputs of the graphs' types
   (``example_inputs``), and the measured step is the median over ``--runs``
   of the forward's plus the backward's ``run`` wall time (what
   ``modelpar.plans()[-1].measured_step_us`` reports for a compiled model).
"""

from __future__ import annotations

import argparse
import os
import platform
import statistics
import sys
import time
from pathlib import Path

import torch

import modelpar
from modelpar.planning.placement import example_inputs, plan_joint, profile_graph

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests" / "python"))
from models import CASES  # noqa: E402
from plan_models import calibrate  # noqa: E402

DEVICES = (1, 2, 4)


def capture(name: str) -> tuple[modelpar.Graph, modelpar.Graph, dict]:
    """The forward and backward graphs of one training step and their links."""
    case = CASES[name]
    torch.manual_seed(0)
    torch._dynamo.reset()
    modelpar.clear_plans()
    fast = torch.compile(case.make_model(), backend="modelpar",
                         options={"devices": 2, "strict": True})
    x, y = case.batch(0, case.batch_size)
    case.loss(fast(x), y).backward()
    plan = modelpar.plans()[-1]
    return plan.graphs["forward"].graph, plan.graphs["backward"].graph, plan.joint_links


def measure(fw_plan, bw_plan, runs: int) -> float:
    fw_ex = modelpar.Executor(fw_plan.program, threads_per_device=1)
    bw_ex = modelpar.Executor(bw_plan.program, threads_per_device=1)
    fw_in = example_inputs(fw_plan.program.graph)
    bw_in = example_inputs(bw_plan.program.graph)
    times = []
    for i in range(runs + 2):
        t0 = time.perf_counter_ns()
        fw_ex.run(list(fw_in))
        t1 = time.perf_counter_ns()
        bw_ex.run(list(bw_in))
        t2 = time.perf_counter_ns()
        if i >= 2:  # warm-up
            times.append((t2 - t0) / 1e3)
    return statistics.median(times)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--models", default=",".join(CASES))
    ap.add_argument("--runs", type=int, default=20)
    ap.add_argument("--profile-runs", type=int, default=5)
    ap.add_argument("--machine", default=None, help="a machine profile instead of calibrating")
    ap.add_argument("--handoff-us", type=float, default=20.0)
    args = ap.parse_args()
    torch.set_num_threads(1)

    if args.machine:
        machine = args.machine
        print(f"machine profile: {machine}")
    else:
        text, summary = calibrate("4GiB", args.handoff_us)
        machine = os.path.join(os.environ.get("TMPDIR", "/tmp"), "modelpar_cpu_profile.json")
        Path(machine).write_text(text)
        print("calibrated: " + ", ".join(f"{k} {v:.3g}" for k, v in summary.items()))
    print(f"python {platform.python_version()}, torch {torch.__version__}, "
          f"{os.cpu_count()} CPUs, threads_per_device=1\n")
    print("| model | devices | simulated step (us) | measured step (us) | measured / simulated |"
          " transfers |")
    print("|---|---|---|---|---|---|")
    for name in args.models.split(","):
        fw, bw, links = capture(name)
        pfw = profile_graph(fw, runs=args.profile_runs)
        pbw = profile_graph(bw, runs=args.profile_runs)
        for n in DEVICES:
            joint, fw_plan, bw_plan, _, _ = plan_joint(
                pfw, pbw, links["saved"], links["tangents"], links["gradients"], devices=n,
                machine=machine, dump_dir="")
            measured = measure(fw_plan, bw_plan, args.runs)
            sim = joint.step_time_us
            print(f"| {name} | {n} | {sim:.0f} | {measured:.0f} | {measured / sim:.2f} | "
                  f"{joint.num_transfers} |", flush=True)


if __name__ == "__main__":
    main()
