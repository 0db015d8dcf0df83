"""A compute-bound training step pipelined over 2 logical devices of one GPU
against the same step on one device (issue 14): on one GPU the bound is
about 1x, so this checks correctness and overhead, not a speed-up.

The model is a stack of wide linear layers (--width, --layers) at batch
--batch; the step is loss + backward through torch.compile(backend=
"modelpar") with device_map="cuda:0": devices=1 (one logical device), and
devices=2 with a 1F1B pipeline of --microbatches micro-batches (with the
default checkpointing and without), devices=2 with strategy="auto"; eager
PyTorch for reference. Times are per step with CUDA events (median of
--repeats rounds of --steps steps); the loss of the last step is printed so
that runs can be compared.

    PYTHONPATH=build-gpu/python python3 bench/cuda_pipeline_step.py
"""

from __future__ import annotations

import argparse
import statistics
import sys
from typing import Callable

import torch
from torch import nn


def step_ms(fn: Callable[[], torch.Tensor], steps: int, repeats: int, warmup: int = 3) -> tuple[float, float]:
    for _ in range(warmup):
        fn()
    torch.cuda.synchronize()
    times = []
    loss = torch.zeros(())
    for _ in range(repeats):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        for _ in range(steps):
            loss = fn()
        end.record()
        end.synchronize()
        times.append(start.elapsed_time(end) / steps)
    return statistics.median(times), float(loss)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--width", type=int, default=4096)
    ap.add_argument("--layers", type=int, default=8)
    ap.add_argument("--batch", type=int, default=512)
    ap.add_argument("--microbatches", type=int, default=4)
    ap.add_argument("--steps", type=int, default=10)
    ap.add_argument("--repeats", type=int, default=5)
    args = ap.parse_args()
    if not torch.cuda.is_available():
        print("cuda_pipeline_step: no GPU visible; this benchmark needs one. Nothing measured.")
        return 0
    import modelpar
    if not modelpar.runtime.executor.cuda_devices_built():
        print("cuda_pipeline_step: this modelpar build has no CUDA devices; build against a CUDA "
              "torch (scripts/gpu_check.sh). Nothing measured.")
        return 0
    torch.backends.cuda.matmul.allow_tf32 = False
    torch.manual_seed(0)

    def make() -> nn.Module:
        torch.manual_seed(0)
        layers: list[nn.Module] = []
        for _ in range(args.layers):
            layers += [nn.Linear(args.width, args.width), nn.ReLU()]
        return nn.Sequential(*layers).cuda()

    x = torch.randn(args.batch, args.width, device="cuda")
    y = torch.randn(args.batch, args.width, device="cuda")

    def stepper(model: nn.Module, options: dict | None) -> Callable[[], torch.Tensor]:
        def step(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
            return nn.functional.mse_loss(model(a), b)
        run = step if options is None else torch.compile(step, backend="modelpar", options=options)

        def one() -> torch.Tensor:
            model.zero_grad(set_to_none=True)
            loss = run(x, y)
            loss.backward()
            return loss.detach()
        return one

    rows = []
    for name, options in [
        ("eager PyTorch", None),
        ("modelpar, 1 logical device", {"devices": 1, "device_map": "cuda:0"}),
        (f"modelpar, 2 logical devices, 1F1B x{args.microbatches}",
         {"devices": 2, "device_map": "cuda:0",
          "pipeline": {"microbatches": args.microbatches, "schedule": "1f1b"}}),
        (f"modelpar, 2 logical devices, 1F1B x{args.microbatches}, checkpoint never",
         {"devices": 2, "device_map": "cuda:0",
          "pipeline": {"microbatches": args.microbatches, "schedule": "1f1b", "checkpoint": "never"}}),
        ("modelpar, 2 logical devices, strategy auto", {"devices": 2, "device_map": "cuda:0",
                                                        "strategy": "auto"}),
    ]:
        torch._dynamo.reset()
        ms, loss = step_ms(stepper(make(), options), args.steps, args.repeats)
        if options is not None and options.get("strategy") == "auto":
            import modelpar
            chosen = [c for c in modelpar.plans()[-1].candidates if c["chosen"]][0]
            name += f" (chose: {chosen['label']})"
        rows.append((name, ms, loss))
    flops = 3 * 2 * args.batch * args.width * args.width * args.layers  # fwd + 2x bwd
    print(f"{args.layers} x Linear({args.width}, {args.width}) + ReLU, batch {args.batch}, fp32 "
          f"(TF32 off), loss + backward, {torch.cuda.get_device_name(0)}, torch {torch.__version__}")
    print("\n| run | ms / step | TFLOP/s | vs eager | last loss |\n|---|---:|---:|---:|---:|")
    for name, ms, loss in rows:
        print(f"| {name} | {ms:.2f} | {flops / ms / 1e9:.1f} | {rows[0][1] / ms:.2f}x | {loss:.6f} |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
