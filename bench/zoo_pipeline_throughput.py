"""Pipelined training step of a Llama-style decoder (transformers, random
init) on 2 CPU workers against eager and modelpar on one device, and against
the n·m/(m+n-1) bound (issue 18's performance question).

    PYTHONPATH=build/python .venv/bin/python bench/zoo_pipeline_throughput.py \
        --hidden 512 --layers 8 --batch 32 --seq 128

Prints one row per configuration: median step time over --steps timed steps
(after one warm-up step), the speed-up over modelpar on one device, and for
pipelines the bound and the fraction of it reached against one device with
one intra-op thread (each CPU worker has one: on a 2-core machine two workers
share the cores one device with 2 threads already uses).
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
import types
from collections.abc import Callable
from typing import Any

import torch
import torch.nn.functional as F

import modelpar


def make_model(hidden: int, layers: int, seq: int, vocab: int) -> torch.nn.Module:
    import transformers
    cfg = transformers.LlamaConfig(vocab_size=vocab, hidden_size=hidden,
                                   intermediate_size=int(hidden * 8 / 3) // 64 * 64,
                                   num_hidden_layers=layers, num_attention_heads=hidden // 64,
                                   num_key_value_heads=max(1, hidden // 256),
                                   max_position_embeddings=seq, attention_dropout=0.0)
    cfg._attn_implementation = "sdpa"
    torch.manual_seed(0)
    return transformers.LlamaForCausalLM(cfg).train()


def own_code(fn: Callable[..., Any], tag: str) -> Callable[..., Any]:
    """``fn`` with a code object of its own. Dynamo caches compiled code per
    code object, at most ``cache_size_limit`` (8) entries: every runner's
    closure of one lambda would share one cache, and past 8 configurations
    Dynamo runs the function eagerly, silently."""
    code = fn.__code__.replace(co_name=f"step_{''.join(c if c.isalnum() else '_' for c in tag)}")
    return types.FunctionType(code, fn.__globals__, code.co_name, fn.__defaults__, fn.__closure__)


def first_pipelined_step(fn, x, y):
    """Runs ``fn(x, y).backward()`` once (it compiles and plans); the
    PipelinePlan it made (``plans()``), or None when nothing was pipelined."""
    modelpar.clear_plans()
    fn(x, y).backward()
    records = [r for r in modelpar.plans() if r.pipeline is not None]
    return records[-1].pipeline if records else None


def time_steps(step, x, y, steps: int) -> list[float]:
    times = []
    for i in range(steps + 1):
        t0 = time.perf_counter()
        step(x, y).backward()
        if i:  # the first is the warm-up (compile, plan)
            times.append(time.perf_counter() - t0)
    return times


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--hidden", type=int, default=512)
    ap.add_argument("--layers", type=int, default=8)
    ap.add_argument("--batch", type=int, default=32)
    ap.add_argument("--seq", type=int, default=128)
    ap.add_argument("--vocab", type=int, default=1024)
    ap.add_argument("--steps", type=int, default=3)
    ap.add_argument("--microbatches", default="4,8")
    args = ap.parse_args()
    g = torch.Generator().manual_seed(0)
    x = torch.randint(0, args.vocab, (args.batch, args.seq), generator=g)
    y = torch.roll(x, -1, dims=1)

    def loss_of(model):
        return lambda a, b: F.cross_entropy(model(a).logits.flatten(0, 1), b.flatten())

    print(f"Llama-style decoder: hidden {args.hidden}, {args.layers} layers, batch {args.batch}, "
          f"sequence {args.seq}; torch {torch.__version__}, {torch.get_num_threads()} threads")
    print("| configuration | step s (median) | vs modelpar 1 device | bound | vs 1 device, 1 thread | of bound |")
    print("|---|---:|---:|---:|---:|---:|")
    rows = {}
    model = make_model(args.hidden, args.layers, args.seq, args.vocab)
    rows["eager"] = statistics.median(time_steps(loss_of(model), x, y, args.steps))
    torch._dynamo.reset()
    one = torch.compile(loss_of(make_model(args.hidden, args.layers, args.seq, args.vocab)),
                        backend="modelpar")
    rows["modelpar, 1 device"] = statistics.median(time_steps(one, x, y, args.steps))
    # A CPU worker runs one intra-op thread; the fair one-device baseline for
    # the n·m/(m+n-1) bound is one device with the same hardware: one thread.
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    torch._dynamo.reset()
    one = torch.compile(loss_of(make_model(args.hidden, args.layers, args.seq, args.vocab)),
                        backend="modelpar")
    rows["modelpar, 1 device, 1 thread"] = statistics.median(time_steps(one, x, y, args.steps))
    torch.set_num_threads(threads)
    base = rows["modelpar, 1 device"]
    per_device = rows["modelpar, 1 device, 1 thread"]
    for name in ("eager", "modelpar, 1 device", "modelpar, 1 device, 1 thread"):
        print(f"| {name} | {rows[name]:.2f} | {base / rows[name]:.2f}x | | | |", flush=True)
    for m in (int(s) for s in args.microbatches.split(",")):
        torch._dynamo.reset()
        step = torch.compile(loss_of(make_model(args.hidden, args.layers, args.seq, args.vocab)),
                             backend="modelpar",
                             options={"devices": 2, "pipeline": {"schedule": "1f1b",
                                                                 "microbatches": m,
                                                                 "checkpoint": "never"}})
        t = statistics.median(time_steps(step, x, y, args.steps))
        bound = 2 * m / (m + 1)
        stages = modelpar.plans()[-1].pipeline.num_stages
        print(f"| 1F1B, {stages} stages on 2 CPU workers, m={m} | {t:.2f} | {base / t:.2f}x | "
              f"{bound:.2f}x | {per_device / t:.2f}x | {per_device / t / bound:.0%} |", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
