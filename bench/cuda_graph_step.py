"""CUDA Graph replay vs stream replay vs eager vs torch.compile(backend="cudagraphs")
for a launch-bound model: the small GPT decoder of tests/python/models.py at
batch 1, inference (issue 5, "Benchmarks"). Needs a GPU; exits with a message
otherwise.

The modelpar rows run the model's ATen inference graph (captured with
torch.compile(backend="modelpar") on CPU, then planned with plan_graph on
--devices logical devices, all mapped to cuda:0) through the Executor with
replay="streams" and replay="graphs", each with ATen's kernels and with
Inductor's (kernels="inductor": Note [Kernel regions]); torch.compile's
mode="reduce-overhead" (Inductor + CUDA graphs) is the peer for the latter.
Times are per step, after warm-up,
measured with CUDA events around --steps steps (median of --repeats).

    PYTHONPATH=build/python python3 bench/cuda_graph_step.py [--devices 2] [--steps 50]
"""

from __future__ import annotations

import argparse
import pathlib
import statistics
import sys
from typing import Callable

import torch

ROOT = pathlib.Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tests" / "python"))


def step_ms(fn: Callable[[], object], steps: int, repeats: int, warmup: int = 3) -> float:
    for _ in range(warmup):
        fn()
    torch.cuda.synchronize()
    times = []
    for _ in range(repeats):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        for _ in range(steps):
            fn()
        end.record()
        end.synchronize()
        times.append(start.elapsed_time(end) / steps)
    return statistics.median(times)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--devices", type=int, default=2, help="logical devices, all on cuda:0")
    ap.add_argument("--steps", type=int, default=50)
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--layers", type=int, default=8, help="decoder blocks (small: launch-bound)")
    args = ap.parse_args()
    if not torch.cuda.is_available():
        print("cuda_graph_step: no GPU visible (torch.cuda.is_available() is False); this "
              "benchmark needs one. Nothing measured.")
        return 0
    import modelpar
    from models import GPT, GPTConfig
    if not modelpar.runtime.executor.cuda_devices_built():
        print("cuda_graph_step: this modelpar build has no CUDA devices (MODELPAR_WITH_CUDA=OFF); "
              "build against a CUDA torch (scripts/gpu_check.sh). Nothing measured.")
        return 0

    torch.manual_seed(0)
    cfg = GPTConfig(layers=args.layers)
    model = GPT(cfg).eval()
    idx = torch.randint(0, cfg.vocab, (1, cfg.block))

    # The ATen inference graph, traced on the GPU (a CPU trace would hold the
    # CPU-only attention kernel).
    model = model.cuda()
    modelpar.clear_plans()
    with torch.no_grad():
        torch.compile(model, backend="modelpar")(idx.cuda())
    graph = modelpar.plans()[-1].graphs["inference"].graph
    placement = modelpar.plan_graph(graph, devices=args.devices)
    program = placement.program
    inputs = [x.cuda() if isinstance(x, torch.Tensor) else x
              for x in modelpar.planning.placement.example_inputs(graph)]
    issues = modelpar.runtime.executor.cuda_graph_issues(program, "cuda:0")

    rows: list[tuple[str, float, str]] = []
    gpu_model = model
    gpu_idx = idx.cuda()
    with torch.no_grad():
        rows.append(("eager PyTorch", step_ms(lambda: gpu_model(gpu_idx), args.steps, args.repeats), ""))
        torch._dynamo.reset()
        cg = torch.compile(gpu_model, backend="cudagraphs")
        rows.append(('torch.compile(backend="cudagraphs")',
                     step_ms(lambda: cg(gpu_idx), args.steps, args.repeats), ""))
        torch._dynamo.reset()
        ro = torch.compile(gpu_model, mode="reduce-overhead")
        rows.append(('torch.compile(mode="reduce-overhead")',
                     step_ms(lambda: ro(gpu_idx), args.steps, args.repeats), ""))
    for kernels in ("aten", "inductor"):  # issue 38: Inductor's kernel regions
        for replay in ("streams", "graphs"):
            ex = modelpar.Executor(program, device_map="cuda:0", replay=replay, kernels=kernels)
            ms = step_ms(lambda: ex.run(inputs), args.steps, args.repeats)
            regions = f"; {ex.kernel_regions.summary()}" if ex.kernel_regions is not None else ""
            rows.append((f"modelpar Executor, {args.devices} logical devices on cuda:0, "
                         f"replay={replay}, kernels={kernels}", ms,
                         ex.replay_status()["summary"] + regions))

    # The floor: the GPU time of the step's kernels (eager's, from the
    # profiler), with no launch gaps between them.
    from torch.profiler import ProfilerActivity, profile
    with torch.no_grad(), profile(activities=[ProfilerActivity.CUDA]) as prof:
        for _ in range(args.steps):
            gpu_model(gpu_idx)
        torch.cuda.synchronize()
    kernel_ms = sum(e.self_device_time_total for e in prof.key_averages()) / 1e3 / args.steps
    rows.append(("sum of eager's kernel times (profiler)", kernel_ms, "floor: no launch gaps"))

    print(f"GPT decoder (vocab {cfg.vocab}, block {cfg.block}, d_model {cfg.d_model}, "
          f"{cfg.layers} layers), batch 1, inference, {torch.cuda.get_device_name(0)}, "
          f"torch {torch.__version__}; {graph.num_nodes} ATen nodes; capture issues: "
          f"{len(issues)}")
    print("\n| run | ms / step | replay status | / kernel sum |\n|---|---:|---|---:|")
    for name, ms, note in rows:
        print(f"| {name} | {ms:.3f} | {note} | {ms / kernel_ms:.2f}x |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
