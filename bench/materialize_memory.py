"""Peak memory per rank of a model built on the meta device and materialized
(issue 13, "memory really splits"), against the same model built whole on
every rank (then `release_unowned` after the first step) and one eager
process.

    PYTHONPATH=build/python .venv/bin/python bench/materialize_memory.py [--layers 16 --width 4096]

Runs each configuration in fresh processes (2 ranks over Gloo via
torch.distributed.run; eager in one process) and prints a Markdown table of
peak resident memory (ru_maxrss) per process: after importing torch and
modelpar, after the model exists (materialize / construction) and after 3
training steps (SGD, batch 8, MSE). The model: `layers` x Linear(width,
width) + Tanh, fp32.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import socket
import subprocess
import sys
import time

import torch


def _peak_mib() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


def _make(layers: int, width: int) -> torch.nn.Module:
    return torch.nn.Sequential(*[m for _ in range(layers)
                                 for m in (torch.nn.Linear(width, width), torch.nn.Tanh())])


def _worker(mode: str, layers: int, width: int, pipeline: bool) -> None:
    import modelpar  # noqa: F401  (counted in the baseline)
    out = {"imported": _peak_mib()}
    g = torch.Generator().manual_seed(1)
    batches = [(torch.randn(8, width, generator=g), torch.randn(8, width, generator=g))
               for _ in range(3)]
    if mode == "eager":
        torch.manual_seed(0)
        model = _make(layers, width)
        out["built"] = _peak_mib()
        step = lambda x, y: torch.nn.functional.mse_loss(model(x), y)  # noqa: E731
    else:
        import torch.distributed as dist
        dist.init_process_group("gloo")
        options: dict = {"devices": "world", "strict": True, "peer_timeout": 120.0}
        if pipeline:
            options["pipeline"] = {"schedule": "1f1b", "microbatches": 4}
        torch.manual_seed(0)
        with torch.device("meta" if mode == "meta" else "cpu"):
            model = _make(layers, width)
        step = torch.compile(lambda x, y: torch.nn.functional.mse_loss(model(x), y),
                             backend="modelpar", options=options)
        if mode == "meta":
            torch.manual_seed(0)
            start = time.perf_counter()
            report = modelpar.materialize(model, step, *batches[0])
            out["materialize_s"] = time.perf_counter() - start
            out["owned_mib"] = report.resident_bytes / 2**20
        out["built"] = _peak_mib()
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    for k, (x, y) in enumerate(batches):
        loss = step(x, y)
        loss.backward()
        opt.step()
        opt.zero_grad()
        if k == 0 and mode == "whole":
            modelpar.release_unowned(model)
        out.setdefault("losses", []).append(float(loss.detach()))
    out["trained"] = _peak_mib()
    out["rank"] = int(os.environ.get("RANK", "0"))
    print("RESULT " + json.dumps(out), flush=True)
    if mode != "eager":
        import torch.distributed as dist
        dist.destroy_process_group()


def _run(mode: str, a: argparse.Namespace) -> list[dict]:
    me = [os.path.abspath(__file__), "--worker", mode, "--layers", str(a.layers),
          "--width", str(a.width)] + (["--pipeline"] if a.pipeline else [])
    if mode == "eager":
        cmd = [sys.executable, *me]
    else:
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            port = s.getsockname()[1]
        cmd = [sys.executable, "-m", "torch.distributed.run", "--nproc-per-node", "2",
               "--master-port", str(port), *me]
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    run = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=1800)
    if run.returncode != 0:
        raise SystemExit(f"{mode} failed:\n{run.stdout[-3000:]}\n{run.stderr[-3000:]}")
    rows = [json.loads(line[7:]) for line in run.stdout.splitlines() if line.startswith("RESULT ")]
    return sorted(rows, key=lambda r: r["rank"])


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--worker", default=None)
    ap.add_argument("--layers", type=int, default=16)
    ap.add_argument("--width", type=int, default=4096)
    ap.add_argument("--pipeline", action="store_true", help="1F1B x4 instead of m-ETF placement")
    a = ap.parse_args()
    if a.worker:
        _worker(a.worker, a.layers, a.width, a.pipeline)
        return
    model_mib = a.layers * (a.width * a.width + a.width) * 4 / 2**20
    print(f"model: {a.layers} x Linear({a.width}, {a.width}), {model_mib:.0f} MiB of parameters; "
          f"{'1F1B x4' if a.pipeline else 'm-ETF placement'} over 2 ranks\n")
    print("| configuration | process | peak after import (MiB) | peak with the model (MiB) "
          "| peak after 3 steps (MiB) | parameters owned (MiB) | materialize (s) | losses |")
    print("|---|---|---:|---:|---:|---:|---:|---|")
    for mode, label in [("eager", "eager, one process"),
                        ("whole", "built whole on every rank, release_unowned after step 0"),
                        ("meta", "built on meta, materialize")]:
        for r in _run(mode, a):
            owned = f"{r['owned_mib']:.0f}" if "owned_mib" in r else ""
            took = f"{r['materialize_s']:.1f}" if "materialize_s" in r else ""
            losses = ", ".join(f"{v:.6f}" for v in r["losses"])
            who = "eager" if mode == "eager" else f"rank {r['rank']}"
            print(f"| {label} | {who} | {r['imported']:.0f} | {r['built']:.0f} | "
                  f"{r['trained']:.0f} | {owned} | {took} | {losses} |", flush=True)


if __name__ == "__main__":
    main()
