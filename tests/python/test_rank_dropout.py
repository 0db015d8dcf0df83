"""Dropout over ranks (Note [Random ops over ranks] in
runtime/rank_executor.cpp): a 2-stage pipeline over 2 Gloo ranks, dropout p
= 0.5 on each stage, draws the masks the same pipeline draws on 2 CPU
workers in one process after the same torch.manual_seed, and the same masks
again when run again. Before ranks reseeded, each rank drew from its own
generator in its own order: the losses differed from the one-process
pipeline's."""

from __future__ import annotations

import json
import os
from pathlib import Path

import torch

from rank_processes import free_port, start_ranks

WORKER = Path(__file__).with_name("dist_dropout_worker.py")
LIMIT_S = 300


def _launch(world: int) -> list[dict]:
    # Ranks forked from a warm process (Note [Ranks forked from a warm
    # process] in rank_processes.py).
    env = {**os.environ, "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(free_port())}
    procs = start_ranks(world, WORKER, [], env)
    results = []
    try:
        for rank, p in enumerate(procs):
            text, _ = p.communicate(timeout=LIMIT_S)
            lines = [ln for ln in text.splitlines() if ln.startswith("RESULT ")]
            assert p.returncode == 0 and lines, f"rank {rank} failed (exit {p.returncode}):\n{text[-4000:]}"
            results.append(json.loads(lines[-1][len("RESULT "):]))
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
                p.wait(timeout=10)
    return results


def test_dropout_over_two_ranks_draws_the_one_process_pipelines_masks_every_run() -> None:
    r0, r1 = _launch(2)
    # Every rank returns the replicated loss and the gradients summed over ranks.
    for key in ("first", "again"):
        assert r0[key]["losses"] == r1[key]["losses"]
    # Reproducible under torch.manual_seed: a second run draws the same masks.
    assert r0["first"]["losses"] == r0["again"]["losses"]
    assert r0["first"]["grads"] == r0["again"]["grads"]
    # The steps reseed differently, so a step's masks are not the last step's.
    assert len(set(r0["first"]["losses"])) == len(r0["first"]["losses"])
    # The same masks as the pipeline on 2 CPU workers in one process
    # (Note [Reproducible random ops over workers]), up to the order of sums.
    ours, theirs = r0["first"], r0["in_process"]
    torch.testing.assert_close(torch.tensor(ours["losses"]), torch.tensor(theirs["losses"]),
                               rtol=1e-5, atol=1e-6)
    for step, (g_ours, g_theirs) in enumerate(zip(ours["grads"], theirs["grads"])):
        for k, (a, b) in enumerate(zip(g_ours, g_theirs)):
            torch.testing.assert_close(torch.tensor(a), torch.tensor(b), rtol=1e-4, atol=1e-6,
                                       msg=lambda m, s=step, k=k: f"step {s}, parameter {k}: {m}")
