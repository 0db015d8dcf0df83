"""``python -m modelpar demo --ir``: the IR walk-through. A hand-written
Program for a two-layer MLP training step, pipelined over 2 logical devices
with 2 micro-batches (DistIR's Figure 2), then an automatic pipeline of a
4-layer step with a skip connection.

It parses and verifies the Program, runs it on CPU, checks the loss and the
updated weights against the single-device graph and against eager PyTorch
autograd, shows the verifier rejecting two broken copies, and writes Graphviz
files of the graph and the per-device schedule. Then ``plan_pipeline`` splits
``skip_step_symbolic.txt`` into 8 micro-batches over 4 stages (1F1B,
checkpointing all but the last micro-batch, the skip tensor through a
portal), the executor runs it on 4 CPU worker devices, the result is checked
against the unsplit step, and the simulated step is written as a Chrome trace.
"""
from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path

import torch

import modelpar

EXAMPLES = Path(__file__).resolve().parents[1] / "examples"


def _examples_dir() -> Path:
    """The ``examples/ir`` folder: installed beside the package, or in the source tree."""
    for candidate in (EXAMPLES, Path(__file__).resolve().parents[3] / "examples" / "ir",
                      Path(os.getcwd()) / "examples" / "ir"):
        if (candidate / "mlp_pipeline_2dev.txt").exists():
            return candidate
    raise FileNotFoundError("modelpar demo --ir: cannot find examples/ir/mlp_pipeline_2dev.txt; "
                            "run the demo from the repository root")


def _eager_step(x: torch.Tensor, y: torch.Tensor, w1: torch.Tensor, w2: torch.Tensor,
                lr: float = 0.1) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """The same training step in plain eager PyTorch with autograd."""
    w1 = w1.clone().requires_grad_()
    w2 = w2.clone().requires_grad_()
    loss = torch.nn.functional.mse_loss(torch.relu(x @ w1) @ w2, y)
    loss.backward()
    with torch.no_grad():
        return loss.detach(), w1 - lr * w1.grad, w2 - lr * w2.grad


def run_ir_demo(out_dir: str = "modelpar-demo", seed: int = 0) -> int:
    """Runs the walk-through and prints what it checks. Returns 0 on success, 1 on a mismatch."""
    ex = _examples_dir()
    program = modelpar.ir.load_program(str(ex / "mlp_pipeline_2dev.txt"))
    single = modelpar.ir.load_graph(str(ex / "mlp_step.txt"))
    program.verify()
    g = program.graph
    print(f"modelpar demo --ir: {ex / 'mlp_pipeline_2dev.txt'}")
    print(f"  program: {g.num_nodes} ops over {program.num_devices} devices, "
          f"2 micro-batches; verified (placement, send/recv matching, liveness, no deadlock)")

    torch.manual_seed(seed)
    x, y = torch.randn(8, 16), torch.randn(8, 4)
    w1, w2 = torch.randn(16, 32) * 0.3, torch.randn(32, 4) * 0.3
    inputs = [x, y, w1, w2]
    pipelined = modelpar.run_program(program, inputs)
    reference = modelpar.run_graph(single, inputs)
    eager = _eager_step(x, y, w1, w2)

    ok = True
    for name, a, b, c in zip(["loss", "w1_new", "w2_new"], pipelined, reference, eager):
        d_ref = (a - b).abs().max().item()
        d_eager = (a - c).abs().max().item()
        good = torch.allclose(a, b, rtol=1e-5, atol=1e-6) and torch.allclose(a, c, rtol=1e-5, atol=1e-6)
        ok &= good
        print(f"  {name:7s} 2-device pipeline vs 1-device graph: max |diff| {d_ref:.2e}; "
              f"vs eager autograd: {d_eager:.2e}  {'OK' if good else 'MISMATCH'}")
    print(f"  loss {pipelined[0].item():.6f}")

    for broken in ("mlp_pipeline_2dev_missing_send.txt", "mlp_pipeline_2dev_deadlock.txt"):
        try:
            modelpar.ir.load_program(str(ex / broken)).verify()
            print(f"  {broken}: NOT rejected (bug)")
            ok = False
        except modelpar.InvalidIrError as e:
            print(f"  {broken}: rejected as expected:\n      {e}")

    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    ok &= _pipeline_demo(ex, out)
    (out / "mlp_pipeline_graph.dot").write_text(g.to_dot())
    (out / "mlp_pipeline_program.dot").write_text(program.to_dot())
    dots = [out / "mlp_pipeline_graph.dot", out / "mlp_pipeline_program.dot"]
    if shutil.which("dot"):
        for d in dots:
            subprocess.run(["dot", "-Tpng", str(d), "-o", str(d.with_suffix(".png"))], check=False)
        print(f"  wrote {', '.join(str(d.with_suffix('.png')) for d in dots)} (and the .dot sources)")
    else:
        print(f"  wrote {', '.join(map(str, dots))} (install graphviz to render: dot -Tpng FILE -o out.png)")
    print("modelpar demo --ir: " + ("all checks passed" if ok else "FAILED"))
    return 0 if ok else 1


def _pipeline_demo(ex: Path, out: Path) -> bool:
    """plan_pipeline on the skip-connection step, run on 4 CPU workers."""
    step = modelpar.ir.load_graph(str(ex / "skip_step_symbolic.txt"))
    plan = modelpar.plan_pipeline(step, devices=4, microbatches=8, batch_size=32,
                                  schedule="1f1b", checkpoint="except_last",
                                  trace=out / "pipeline_simulated.json")
    print(f"modelpar demo --ir: automatic pipeline of {ex / 'skip_step_symbolic.txt'}")
    stages = ", ".join(f"{layer}->{stage}" for layer, stage in plan.stage_of_layer.items())
    print(f"  {plan.num_stages} stages (layer->stage: {stages}), 8 micro-batches of 4, 1F1B, "
          f"checkpoint except_last; simulated step {plan.step_time_us:.0f} us, ideal speed-up "
          f"{plan.ideal_speedup:.2f}x, bubble {100 * plan.bubble_fraction:.0f} %")
    g = torch.Generator().manual_seed(1)
    inputs = [torch.randn(32, 16, generator=g), torch.randn(32, 4, generator=g),
              torch.randn(16, 32, generator=g) * 0.3, torch.randn(32, 32, generator=g) * 0.2,
              torch.randn(32, 32, generator=g) * 0.2, torch.randn(32, 4, generator=g) * 0.3]
    got = modelpar.Executor(plan.program, device_map="cpu-workers", threads_per_device=1).run(inputs)
    want = modelpar.run_graph(step, inputs)
    diff = max((a - b).abs().max().item() for a, b in zip(got, want))
    good = all(torch.allclose(a, b, rtol=1e-5, atol=1e-6) for a, b in zip(got, want))
    print(f"  4 CPU worker devices vs the unsplit step: loss, outputs, updated weights "
          f"max |diff| {diff:.2e}  {'OK' if good else 'MISMATCH'}")
    print(f"  wrote {out / 'pipeline_simulated.json'} (open in ui.perfetto.dev)")
    return good
