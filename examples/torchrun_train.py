"""Training over the ranks of a torch.distributed group with modelpar
(issue 13): one process per logical device, launched by torchrun.

    PYTHONPATH=build/python torchrun --nproc-per-node 2 examples/torchrun_train.py
    PYTHONPATH=build/python torchrun --nproc-per-node 2 examples/torchrun_train.py --pipeline 1f1b
    PYTHONPATH=build/python torchrun --nproc-per-node 2 examples/torchrun_train.py --meta
    # several machines: torchrun --nnodes 2 --nproc-per-node 4 --rdzv-endpoint HOST:PORT ...
    # surviving a lost rank: checkpoints every 2 steps, resumed from the last after a restart
    # (a fresh store per restart: see below)
    TORCH_DISABLE_SHARE_RDZV_TCP_STORE=1 PYTHONPATH=build/python \
        torchrun --nproc-per-node 2 --max-restarts 1 --rdzv-backend c10d --rdzv-endpoint 127.0.0.1:29400 \
        examples/torchrun_train.py --steps 6 --resume ckpt --checkpoint-every 2

Every rank builds the same model (same seed), compiles the same step and
feeds the same batches; modelpar plans over the ranks, rank r runs device r's
part, and every rank gets the loss. Rank 0 prints one line per step,
``step K loss L``, and the loss of the first batch after training under
``torch.no_grad()``, ``eval loss L``. With ``--meta`` the model is built on the meta device and
``modelpar.materialize`` gives each rank only the parameters it owns (the
values a normal construction with the same seed gives); without it, every
rank builds the whole model and frees other ranks' parameters after the
first step (``modelpar.release_unowned``).

With ``--resume DIR`` the model and optimizer are saved every
``--checkpoint-every`` steps to ``DIR/step<k>`` (``modelpar.distributed.checkpoint``,
DCP format, each tensor from the rank that holds it), and a start (or a
restart by ``torchrun --max-restarts N`` after a rank died: the others raise
ExecutionError naming it within ``peer_timeout`` and torchrun restarts the
group) resumes from the last complete one: the batches depend on the step
only, so the loss curve from there on is the uninterrupted run's.
``--kill-at K`` (for the test) makes rank 1 SIGKILL itself at step K of the
first attempt. Restarts need a fresh store per attempt: torchrun's static
rendezvous, and its c10d rendezvous unless TORCH_DISABLE_SHARE_RDZV_TCP_STORE=1,
keep one store for every attempt, and a restarted rank can read the dead
attempt's Gloo address and fail to connect or hang (pytorch#135712).
"""

from __future__ import annotations

import argparse
import os
import re
import signal

import torch
import torch.distributed as dist
import torch.nn.functional as F

import modelpar
from modelpar.planning.option_names import PIPELINE_SCHEDULES


def latest_checkpoint(folder: str) -> tuple[int, str] | None:
    """(steps done, path) of the last complete checkpoint in ``folder``: DCP
    writes its ``.metadata`` last, once every rank has written its part."""
    if not os.path.isdir(folder):
        return None
    done = [(int(m.group(1)), os.path.join(folder, name)) for name in os.listdir(folder)
            if (m := re.fullmatch(r"step(\d+)", name))
            and os.path.exists(os.path.join(folder, name, ".metadata"))]
    return max(done) if done else None


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--pipeline", choices=PIPELINE_SCHEDULES, default=None,
                    help="pipeline the step over the ranks with this schedule")
    ap.add_argument("--steps", type=int, default=3)
    ap.add_argument("--meta", action="store_true", help="build on the meta device, materialize")
    ap.add_argument("--resume", metavar="DIR", default=None,
                    help="checkpoint to DIR/step<k> and resume from the last one there")
    ap.add_argument("--checkpoint-every", type=int, default=2)
    ap.add_argument("--kill-at", type=int, default=None,
                    help="rank 1 SIGKILLs itself at this step of the first attempt (tests)")
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
    start = 0
    last = latest_checkpoint(a.resume) if a.resume else None
    if last is not None:  # every rank loads every tensor, before the first step
        start, path = last
        modelpar.distributed.checkpoint.load(model, opt, path)
        if dist.get_rank() == 0:
            print(f"resumed from {path}", flush=True)
    first_attempt = os.environ.get("TORCHELASTIC_RESTART_COUNT", "0") == "0"
    for k, (x, y) in enumerate(batches):
        if k < start:
            continue
        if k == a.kill_at and first_attempt and dist.get_rank() == 1:
            os.kill(os.getpid(), signal.SIGKILL)
        loss = step(x, y)
        loss.backward()  # each parameter's .grad lands on the rank that owns it
        # Clipped by the whole model's gradient norm, summed over the ranks'
        # shares (torch.nn.utils.clip_grad_norm_ would see this rank's only).
        modelpar.clip_grad_norm_(model, max_norm=0.5)
        opt.step()
        opt.zero_grad()
        if k == start and not a.meta:
            modelpar.release_unowned(model)  # free the parameters other ranks own
        if dist.get_rank() == 0:
            print(f"step {k} loss {loss.item()!r}", flush=True)
        if a.resume and (k + 1) % a.checkpoint_every == 0:  # every rank calls it
            modelpar.distributed.checkpoint.save(model, opt, os.path.join(a.resume, f"step{k + 1}"))
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
