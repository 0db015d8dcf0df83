"""Measured pipeline throughput on CPU worker devices (issue 6).

A chain of L ReLU layers of width D (a symbolic batch B), one SGD step,
pipelined over n stages with m micro-batches by modelpar.plan_pipeline and run
by the Executor on n CPU workers (one intra-op thread each). Compared with the
same step on one device (the interpreter of the unsplit graph, one thread),
and with the bound n·m/(m+n−1) of a pipeline of uniform stages with free
transfers.

    PYTHONPATH=build/python .venv/bin/python bench/pipeline_throughput.py
"""

from __future__ import annotations

import argparse
import statistics
import time

import torch

import modelpar


def chain_step(layers: int, width: int) -> str:
    """The IR text of one SGD step of `layers` ReLU layers (mse loss)."""
    ins = [f"%x: f32[B, {width}] input", f"%y: f32[B, {width}] input"]
    ins += [f"%w{i}: f32[{width}, {width}] param" for i in range(layers)]
    body, h = [], "%x"
    for i in range(layers):
        body.append(f"%a{i}: f32[B, {width}] = aten::mm({h}, %w{i}) {{layer=\"l{i}\", phase=fwd}}")
        body.append(f"%h{i}: f32[B, {width}] = aten::relu(%a{i}) {{layer=\"l{i}\", phase=fwd}}")
        h = f"%h{i}"
    body.append(f"%loss: f32[] = aten::mse_loss({h}, %y, 1) {{layer=\"loss\", phase=fwd}}")
    body.append("%g: f32[] = aten::ones_like(%loss) {layer=\"loss\", phase=bwd}")
    body.append(f"%d{layers}: f32[B, {width}] = aten::mse_loss_backward(%g, {h}, %y, 1) "
                "{layer=\"loss\", phase=bwd}")
    for i in reversed(range(layers)):
        lay = f"{{layer=\"l{i}\", phase=bwd}}"
        prev = "%x" if i == 0 else f"%h{i - 1}"
        body.append(f"%da{i}: f32[B, {width}] = aten::threshold_backward(%d{i + 1}, %h{i}, 0) {lay}")
        body.append(f"%pt{i}: f32[{width}, B] = aten::t({prev}) {lay}")
        body.append(f"%dw{i}: f32[{width}, {width}] = aten::mm(%pt{i}, %da{i}) {lay}")
        if i > 0:
            body.append(f"%wt{i}: f32[{width}, {width}] = aten::t(%w{i}) {lay}")
            body.append(f"%d{i}: f32[B, {width}] = aten::mm(%da{i}, %wt{i}) {lay}")
    for i in range(layers):
        body.append(f"%n{i}: f32[{width}, {width}] = aten::sub.Tensor(%w{i}, %dw{i}, alpha=0.01) "
                    f"{{layer=\"l{i}\", phase=update}}")
    outs = ", ".join(["%loss"] + [f"%n{i}" for i in range(layers)])
    return (f"graph @chain({', '.join(ins)}) {{\n  " + "\n  ".join(body)
            + f"\n  return {outs}\n}}\n")


def time_it(fn, runs: int) -> float:
    fn()
    samples = []
    for _ in range(runs):
        t0 = time.perf_counter()
        fn()
        samples.append(time.perf_counter() - t0)
    return statistics.median(samples) * 1e3


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--layers", type=int, default=8)
    ap.add_argument("--width", type=int, default=512)
    ap.add_argument("--batch", type=int, default=512)
    ap.add_argument("--runs", type=int, default=10)
    args = ap.parse_args()
    torch.set_num_threads(1)
    step = modelpar.parse_graph(chain_step(args.layers, args.width))
    g = torch.Generator().manual_seed(0)
    inputs = [torch.randn(args.batch, args.width, generator=g),
              torch.randn(args.batch, args.width, generator=g)]
    inputs += [torch.randn(args.width, args.width, generator=g) * 0.05 for _ in range(args.layers)]
    one = time_it(lambda: modelpar.run_graph(step, inputs), args.runs)
    print(f"chain of {args.layers} layers x {args.width}, batch {args.batch}; one device "
          f"(interpreter, 1 thread): {one:.1f} ms")
    print("| devices | m | schedule | checkpoint | measured ms | speed-up | bound n·m/(m+n−1) "
          "| simulated speed-up |")
    print("|---|---|---|---|---|---|---|---|")
    for n, m, schedule, ck in [(1, 8, "gpipe", "never"), (2, 1, "gpipe", "never"),
                               (2, 4, "gpipe", "never"), (2, 8, "gpipe", "never"),
                               (2, 8, "1f1b", "never"), (2, 8, "gpipe", "except_last"),
                               (2, 8, "1f1b", "always")]:
        plan = modelpar.plan_pipeline(step, devices=n, microbatches=m, batch_size=args.batch,
                                      schedule=schedule, checkpoint=ck)
        ex = modelpar.Executor(plan.program, device_map="cpu-workers", threads_per_device=1)
        got = ex.run(list(inputs))
        want = modelpar.run_graph(step, inputs)
        for a, b in zip(got, want):
            torch.testing.assert_close(a, b, rtol=1e-4, atol=1e-5)
        ms = time_it(lambda: ex.run(list(inputs)), args.runs)
        bound = n * m / (m + n - 1)
        print(f"| {n} | {m} | {schedule} | {ck} | {ms:.1f} | {one / ms:.2f}x | {bound:.2f}x | "
              f"{plan.speedup:.2f}x |")


if __name__ == "__main__":
    main()
