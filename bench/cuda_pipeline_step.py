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
that runs can be compared. The last lines compare strategy auto's step with
the plain option of the plan it chose (issue 37 item 1: auto's one-device
plan within 2 % of the plain one-device option) and the 1F1B pipelines with
eager (item 2: goal >= 0.9x); the header names the card, driver and torch.

    PYTHONPATH=build-gpu/python python3 bench/cuda_pipeline_step.py
"""

from __future__ import annotations

import argparse
import statistics
import subprocess
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


def driver_version() -> str:
    try:
        out = subprocess.run(["nvidia-smi", "--query-gpu=driver_version", "--format=csv,noheader"],
                             capture_output=True, text=True, timeout=20, check=True).stdout
        return out.split()[0]
    except (OSError, subprocess.SubprocessError, IndexError):
        return "unknown"


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
    kept: list[Callable[[], torch.Tensor]] = []
    chose = ""
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
        fn = stepper(make(), options)
        ms, loss = step_ms(fn, args.steps, args.repeats)
        kept.append(fn)
        if options is not None and options.get("strategy") == "auto":
            import modelpar
            chosen = [c for c in modelpar.plans()[-1].candidates if c["chosen"]][0]
            chose = chosen["label"]
            name += f" (chose: {chose})"
        rows.append((name, ms, loss))
    flops = 3 * 2 * args.batch * args.width * args.width * args.layers  # fwd + 2x bwd
    print(f"{args.layers} x Linear({args.width}, {args.width}) + ReLU, batch {args.batch}, fp32 "
          f"(TF32 off), loss + backward, {torch.cuda.get_device_name(0)}, driver "
          f"{driver_version()}, torch {torch.__version__} (CUDA {torch.version.cuda}), "
          f"{args.steps} steps, median of {args.repeats}")
    print("\n| run | ms / step | TFLOP/s | vs eager | last loss |\n|---|---:|---:|---:|---:|")
    for name, ms, loss in rows:
        print(f"| {name} | {ms:.2f} | {flops / ms / 1e9:.1f} | {rows[0][1] / ms:.2f}x | {loss:.6f} |")
    one_ms, auto_ms = rows[1][1], rows[4][1]
    if chose == "one-device":
        # Item 1's 2 % is within drift between configurations timed one after
        # the other: time the two again in alternating rounds (each recompiles
        # once in its warm-up after the dynamo resets above).
        for fn in (kept[1], kept[4]):
            step_ms(fn, 1, 1)
        alt: list[list[float]] = [[], []]
        for _ in range(args.repeats):
            for k, fn in enumerate((kept[1], kept[4])):
                alt[k].append(step_ms(fn, args.steps, 1, warmup=0)[0])
        a_one, a_auto = statistics.median(alt[0]), statistics.median(alt[1])
        print(f"\nauto (one-device plan) / plain one logical device: {auto_ms / one_ms:.3f} "
              f"({auto_ms:.2f} / {one_ms:.2f} ms); in {args.repeats} alternating rounds "
              f"{a_auto / a_one:.3f} ({a_auto:.2f} / {a_one:.2f} ms); goal <= 1.02, issue 37 item 1")
    else:
        print(f"\nauto chose {chose!r}, not the one-device plan: {auto_ms:.2f} ms against one "
              f"logical device's {one_ms:.2f} ms (issue 37 item 1 compares the one-device plans)")
    print(f"1F1B on 2 logical devices / eager: {rows[0][1] / rows[2][1]:.2f}x, checkpoint never "
          f"{rows[0][1] / rows[3][1]:.2f}x (goal >= 0.9x, issue 37 item 2)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
