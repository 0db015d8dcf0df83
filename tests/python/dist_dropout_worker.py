"""One rank of tests/python/test_rank_dropout.py: a 2-stage pipeline with a
dropout of p = 0.5 on each stage (Note [Random ops over ranks] in
runtime/rank_executor.cpp), compiled over the Gloo group of the launching
test (RANK / WORLD_SIZE / MASTER_ADDR / MASTER_PORT from the environment).

After a first call (which compiles), each measured step reseeds with
``torch.manual_seed(100 + step)`` right before the call, runs forward and
backward, and records the loss and every gradient (summed over ranks: each
exists on its stage's rank only). The steps run twice. Rank 0 then runs the
same steps through the in-process pipeline on 2 CPU workers. Prints
``RESULT <json>``; exits 1 with the traceback otherwise.
"""

from __future__ import annotations

import json
import os
import sys
import traceback
from datetime import timedelta

import torch
import torch.distributed as dist

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import modelpar  # noqa: E402,F401

STEPS = 3
PIPELINE = {"schedule": "1f1b", "microbatches": 2, "partition": "balance-size",
            "checkpoint": "except_last", "allow_random": True}


def make_model() -> torch.nn.Module:
    torch.manual_seed(0)
    return torch.nn.Sequential(
        torch.nn.Linear(8, 32), torch.nn.ReLU(), torch.nn.Dropout(0.5),
        torch.nn.Linear(32, 32), torch.nn.ReLU(), torch.nn.Dropout(0.5),
        torch.nn.Linear(32, 4))


def run(options: dict, summed: bool) -> dict:
    model = make_model()
    fast = torch.compile(lambda x, y: torch.nn.functional.mse_loss(model(x), y),
                         backend="modelpar", options=options)
    g = torch.Generator().manual_seed(1)
    x, y = torch.randn(8, 8, generator=g), torch.randn(8, 4, generator=g)
    fast(x, y).backward()  # compiles
    out: dict = {"losses": [], "grads": []}
    for step in range(STEPS):
        model.zero_grad(set_to_none=False)
        torch.manual_seed(100 + step)
        loss = fast(x, y)
        loss.backward()
        grads = []
        for p in model.parameters():
            grad = p.grad.detach().clone() if p.grad is not None else torch.zeros_like(p)
            if summed:
                dist.all_reduce(grad)
            grads.append(grad.flatten().tolist())
        out["losses"].append(float(loss))
        out["grads"].append(grads)
    return out


def main() -> None:
    dist.init_process_group("gloo", timeout=timedelta(seconds=60))
    try:
        ranks = {"devices": "world", "strict": True, "peer_timeout": 20.0, "pipeline": PIPELINE}
        first = run(ranks, summed=True)
        again = run(ranks, summed=True)
        result = {"rank": dist.get_rank(), "first": first, "again": again}
        if dist.get_rank() == 0:
            result["in_process"] = run({"devices": 2, "strict": True, "pipeline": PIPELINE},
                                       summed=False)
        print("RESULT " + json.dumps(result), flush=True)
    except Exception:
        traceback.print_exc()
        sys.stdout.flush()
        os._exit(1)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
