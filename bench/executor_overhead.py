"""Host overhead per operator: eager PyTorch vs the reference interpreters vs
the multi-device Executor on CPU workers.

A chain of N tiny ops (`aten::add.Tensor` on f32[16]: the kernel is well under
a microsecond, so the time per op is the host's: dispatch, argument boxing,
value bookkeeping, synchronisation) is run eagerly from Python, by the reference interpreters, and by the
Executor as one-device and two-device Programs. Prints a Markdown table of the
best and median microseconds per op over the steps.

    PYTHONPATH=build/python .venv/bin/python bench/executor_overhead.py [--ops 2000] [--steps 30]
"""

from __future__ import annotations

import argparse
import statistics
import time
from typing import Callable

import torch

import modelpar


def chain_graph(n: int) -> str:
    lines = ["graph @chain(%x: f32[16] input, %c: f32[16] input) {"]
    prev = "%x"
    for i in range(n):
        lines.append(f"  %v{i}: f32[16] = aten::add.Tensor({prev}, %c)")
        prev = f"%v{i}"
    lines.append(f"  return {prev}\n}}")
    return "\n".join(lines)


def one_device_program(n: int) -> str:
    body = chain_graph(n).replace("input,", "input {device=0},").replace("input)", "input {device=0})")
    runs = "\n".join(f"  run %v{i}" + (f"\n  free %v{i - 1}" if i else "") for i in range(n))
    return f"program devices=1\n{body}\ndevice 0 {{\n{runs}\n}}\n"


def two_chains_program(n: int) -> str:
    """Two independent chains of n ops, one per device (no transfers)."""
    lines = ["program devices=2",
             "graph @two(%x: f32[16] input {device=0}, %c: f32[16] input {device=0},",
             "           %y: f32[16] input {device=1}, %d: f32[16] input {device=1}) {"]
    dev = [[], []]
    for k, (inp, c) in enumerate([("%x", "%c"), ("%y", "%d")]):
        prev = inp
        for i in range(n):
            lines.append(f"  %v{k}_{i}: f32[16] = aten::add.Tensor({prev}, {c}) {{device={k}}}")
            dev[k].append(f"  run %v{k}_{i}" + (f"\n  free %v{k}_{i - 1}" if i else ""))
            prev = f"%v{k}_{i}"
    lines.append(f"  return %v0_{n - 1}, %v1_{n - 1}\n}}")
    for k in range(2):
        lines.append(f"device {k} {{\n" + "\n".join(dev[k]) + "\n}")
    return "\n".join(lines)


def pipelined_program(n: int, every: int) -> str:
    """One chain of n ops alternating between 2 devices every `every` ops."""
    lines = ["program devices=2",
             "graph @pipe(%x: f32[16] input {device=0}, %c: f32[16] input {device=0},",
             "            %d: f32[16] input {device=1}) {"]
    dev: list[list[str]] = [[], []]
    prev = "%x"
    for i in range(n):
        d = (i // every) % 2
        if i and i % every == 0:
            dev[1 - d].append(f"  send {prev} -> {d}\n  free {prev}")
            dev[d].append(f"  recv {prev} <- {1 - d}")
        c = "%c" if d == 0 else "%d"
        lines.append(f"  %v{i}: f32[16] = aten::add.Tensor({prev}, {c}) {{device={d}}}")
        dev[d].append(f"  run %v{i}" + (f"\n  free {prev}" if i and i % every else ""))
        prev = f"%v{i}"
    lines.append(f"  return {prev}\n}}")
    for k in range(2):
        lines.append(f"device {k} {{\n" + "\n".join(dev[k]) + "\n}")
    return "\n".join(lines)


def us_per_op(fn: Callable[[], object], ops: int, steps: int) -> tuple[float, float]:
    """(best, median) microseconds per op over `steps` steps. On a shared
    machine the best step is the better estimate of the host's own cost."""
    fn()  # warm-up
    times = []
    for _ in range(steps):
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    return min(times) / ops * 1e6, statistics.median(times) / ops * 1e6


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--ops", type=int, default=2000)
    ap.add_argument("--steps", type=int, default=30)
    args = ap.parse_args()
    n, steps = args.ops, args.steps
    torch.set_num_threads(1)
    x, c, y, d = (torch.randn(16) for _ in range(4))

    def eager() -> torch.Tensor:
        v = x
        for _ in range(n):
            v = torch.add(v, c)
        return v

    graph = modelpar.parse_graph(chain_graph(n))
    compiled = modelpar._C.CompiledGraph(graph, [0], [])
    p1 = modelpar.parse_program(one_device_program(n))
    p2 = modelpar.parse_program(two_chains_program(n))
    pp = modelpar.parse_program(pipelined_program(n, 100))
    ex1 = modelpar.Executor(p1, threads_per_device=1)
    ex1t = modelpar.Executor(p1, threads_per_device=1, record_trace=True)
    ex2 = modelpar.Executor(p2, threads_per_device=1)
    exp = modelpar.Executor(pp, threads_per_device=1)

    # Every variant computes the same chain; check before timing.
    want = eager()
    for got in (compiled.run([x, c])[0], ex1.run([x, c])[0], exp.run([x, c, c])[0],
                ex2.run([x, c, x, c])[1]):
        torch.testing.assert_close(got, want)

    rows = [
        ("eager PyTorch from Python (`torch.add` loop)", n, eager),
        ("reference Interpreter, resolved once (`_C.CompiledGraph`, caller's thread)", n,
         lambda: compiled.run([x, c])),
        ("reference Interpreter incl. resolving every node (`modelpar.run_graph`)", n,
         lambda: modelpar.run_graph(graph, [x, c])),
        ("reference ProgramInterpreter incl. resolving (`modelpar.run_program`, 1 device)", n,
         lambda: modelpar.run_program(p1, [x, c])),
        ("Executor, 1 CPU worker", n, lambda: ex1.run([x, c])),
        ("Executor, 1 CPU worker, record_trace", n, lambda: ex1t.run([x, c])),
        ("Executor, 2 CPU workers, 2 independent chains (per op of 2N)", 2 * n,
         lambda: ex2.run([x, c, y, d])),
        ("Executor, 2 CPU workers, 1 chain, transfer every 100 ops", n,
         lambda: exp.run([x, c, c])),
    ]
    print(f"| configuration ({n} x aten::add.Tensor on f32[16]) | us/op, best of {steps} steps | median |")
    print("|---|---|---|")
    for name, ops, fn in rows:
        best, median = us_per_op(fn, ops, steps)
        print(f"| {name} | {best:.2f} | {median:.2f} |")


if __name__ == "__main__":
    main()
