"""Training over the ranks of a torch.distributed group with modelpar
(issue 13): one process per logical device, launched by torchrun.

    PYTHONPATH=build/python torchrun --nproc-per-node 2 examples/torchrun_train.py
    PYTHONPATH=build/python torchrun --nproc-per-node 2 examples/torchrun_train.py --pipeline 1f1b
    PYTHONPATH=build/python torchrun --nproc-per-node 2 examples/torchrun_train.py --meta
    # several machines: torchrun --nnodes 2 --nproc-per-node 4 --rdzv-endpoint HOST:PORT ...

Every rank builds the same model (same seed), compiles the same step and
feeds the same batches; modelpar plans over the ranks, rank r runs device r's
part, and every rank gets the loss. Rank 0 prints one line per step,
``step K loss L``, and the loss of the first batch after training under
``torch.no_grad()``, ``eval loss L``. With ``--meta`` the model is built on the meta device and
``modelpar.materialize`` gives each rank only the parameters it owns (the
values a normal construction with the same seed gives); without it, every
rank builds the whole model and frees other ranks' parameters after the
first step (``modelpar.release_unowned``).
"""

from __future__ import annotations

import argparse

import torch
import torch.distributed as dist
import torch.nn.functional as F

import modelpar


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--pipeline", choices=["gpipe", "1f1b", "1f1b*"], default=None)
    ap.add_argument("--steps", type=int, default=3)
    ap.add_argument("--meta", action="store_true", help="build on the meta device, materialize")
    a = ap.parse_args()
    dist.init_process_group("gloo")  # MASTER_ADDR, RANK, WORLD_SIZE from torchrun
    torch.manual_seed(0)
    with torch.device("meta" if a.meta else "cpu"):
        model = torch.nn.Sequential(torch.nn.Linear(16, 32), torch.nn.ReLU(),
                                    torch.nn.Linear(32, 32), torch.nn.Tanh(),
                                    torch.nn.Linear(32, 4))
    options: dict = {"devices": "world", "peer_timeout": 30}
    if a.pipeline:
        options["pipeline"] = {"schedule": a.pipeline, "microbatches": 4}
    step = torch.compile(lambda x, y: F.mse_loss(model(x), y), backend="modelpar", options=options)
    g = torch.Generator().manual_seed(1)
    batches = [(torch.randn(8, 16, generator=g), torch.randn(8, 4, generator=g))
               for _ in range(a.steps)]
    if a.meta:  # plans with the first batch, then initialises what this rank owns
        torch.manual_seed(0)
        print(modelpar.materialize(model, step, *batches[0]), flush=True)
    opt = torch.optim.SGD(model.parameters(), lr=0.05)
    for k, (x, y) in enumerate(batches):
        loss = step(x, y)
        loss.backward()  # each parameter's .grad lands on the rank that owns it
        # Clipped by the whole model's gradient norm, summed over the ranks'
        # shares (torch.nn.utils.clip_grad_norm_ would see this rank's only).
        modelpar.clip_grad_norm_(model, max_norm=0.5)
        opt.step()
        opt.zero_grad()
        if k == 0 and not a.meta:
            modelpar.release_unowned(model)  # free the parameters other ranks own
        if dist.get_rank() == 0:
            print(f"step {k} loss {loss.item()!r}", flush=True)
    # Evaluation through the same compiled step: its graph, planned apart,
    # reads every parameter on the rank that trained it.
    with torch.no_grad():
        x, y = batches[0]
        loss = step(x, y)
    if dist.get_rank() == 0:
        print(f"eval loss {loss.item()!r}", flush=True)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
