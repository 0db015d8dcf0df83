"""Per-step time of the test models: eager PyTorch vs
``torch.compile(backend="modelpar")`` (one CPU device), with
``backend="aot_eager"`` as a peer (the same AOTAutograd graphs run by Python
FX code), and the runtime's host overhead per op on tiny tensors.

Run from the repository root after building:

    PYTHONPATH=build/python python bench/compile_step.py [--steps 30] [--models mlp,gpt]

A training step is forward + loss + backward + SGD(momentum) step +
zero_grad; an inference step is a forward under ``torch.no_grad()``. Each
time is the fastest of ``--rounds`` rounds in which the backends take turns
(``--steps`` steps each); compilation and ``--warmup`` steps are not counted. The C++ counterpart of the per-op table, against direct ATen
calls, is ``bench/runtime_overhead.cpp`` (target ``modelpar_bench_overhead``).
"""

from __future__ import annotations

import argparse
import copy
import os
import platform
import statistics
import sys
import time
from pathlib import Path

import torch

import modelpar

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests" / "python"))
from models import CASES  # noqa: E402


def _median_ms(fn, steps: int, warmup: int) -> float:
    for _ in range(warmup):
        fn()
    times = []
    for _ in range(steps):
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    return statistics.median(times) * 1e3


def step_times(name: str, rounds: int, steps: int, warmup: int) -> dict[str, float]:
    """ms per step for each backend and mode. The backends take turns, one
    block of `steps` steps each per round, so that load from other processes
    hits them alike; the result is the fastest round's mean (the least
    disturbed one)."""
    case = CASES[name]
    base = case.make_model()
    x, y = case.batch(0, case.batch_size)
    torch._dynamo.reset()
    runs = {}
    for backend in ("eager", "modelpar", "aot_eager"):
        model = copy.deepcopy(base)
        run = model if backend == "eager" else torch.compile(
            model, backend=backend, **({"options": {"strict": True}} if backend == "modelpar" else {}))
        opt = torch.optim.SGD(model.parameters(), lr=1e-3, momentum=0.9)

        def train(run=run, opt=opt) -> None:
            case.loss(run(x), y).backward()
            opt.step()
            opt.zero_grad()

        def infer(run=run) -> None:
            with torch.no_grad():
                run(x)

        for mode, fn in (("train", train), ("infer", infer)):
            for _ in range(warmup):  # compiles, then warms up
                fn()
            runs[f"{mode}/{backend}"] = fn
    best = {key: float("inf") for key in runs}
    for _ in range(rounds):
        for key, fn in runs.items():
            t0 = time.perf_counter()
            for _ in range(steps):
                fn()
            best[key] = min(best[key], (time.perf_counter() - t0) / steps * 1e3)
    plan = [p for p in modelpar.plans() if "forward" in p.graphs][-1]
    best["nodes"] = sum(g.graph.num_nodes for g in plan.graphs.values() if g.graph is not None)
    return best


def per_op_overhead(numel: int, ops: int = 999) -> dict[str, float]:
    """ns/op of a chain of add/mul/relu on `numel`-element tensors: Python
    eager (torch.add ...), the modelpar runtime called from Python, and the
    same graph through the C++ Interpreter."""
    t = f"f32[{numel}]"
    lines, prev = [], "%x"
    for i in range(ops):
        op = ("aten::add.Tensor({}, %w)", "aten::mul.Tensor({}, %w)", "aten::relu({})")[i % 3]
        lines.append(f"  %v{i}: {t} = {op.format(prev)}")
        prev = f"%v{i}"
    g = modelpar.parse_graph(f"graph @chain(%x: {t} input, %w: {t} input) {{\n"
                             + "\n".join(lines) + f"\n  return {prev}\n}}")
    cg = modelpar._C.CompiledGraph(g, [0], [])
    x, w = torch.randn(numel), torch.randn(numel)

    def eager() -> None:
        y = x
        for _ in range(ops // 3):
            y = torch.relu(torch.mul(torch.add(y, w), w))

    res = {}
    for label, fn in (("python eager", eager), ("modelpar runtime", lambda: cg.run([x, w]))):
        res[label] = min(_median_ms(fn, 11, 3) for _ in range(5)) * 1e6 / ops
    return res


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--rounds", type=int, default=7)
    ap.add_argument("--steps", type=int, default=5, help="steps per round and backend")
    ap.add_argument("--warmup", type=int, default=3)
    ap.add_argument("--models", default=",".join(CASES))
    args = ap.parse_args(argv)
    torch.manual_seed(0)
    print(f"torch {torch.__version__}, {torch.get_num_threads()} intra-op threads, "
          f"{platform.processor() or platform.machine()}, Python {platform.python_version()}")
    print(f"load average before: {os.getloadavg()[0]:.2f}")
    print()
    print("| model | batch | IR nodes (fw+bw) | train eager (ms) | train modelpar (ms) | "
          "train aot_eager (ms) | modelpar / eager | infer eager (ms) | infer modelpar (ms) | "
          "infer aot_eager (ms) |")
    print("|---|---|---|---|---|---|---|---|---|---|")
    for name in args.models.split(","):
        r = step_times(name, args.rounds, args.steps, args.warmup)
        print(f"| {name} | {CASES[name].batch_size} | {r['nodes']} | {r['train/eager']:.2f} | "
              f"{r['train/modelpar']:.2f} | {r['train/aot_eager']:.2f} | "
              f"{r['train/modelpar'] / r['train/eager']:.2f} | {r['infer/eager']:.2f} | "
              f"{r['infer/modelpar']:.2f} | {r['infer/aot_eager']:.2f} |", flush=True)
    print()
    print("| tensor numel | Python eager (ns/op) | modelpar runtime from Python (ns/op) |")
    print("|---|---|---|")
    for numel in (1, 64, 4096):
        r = per_op_overhead(numel)
        print(f"| {numel} | {r['python eager']:.0f} | {r['modelpar runtime']:.0f} |", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
