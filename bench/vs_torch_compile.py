"""Is modelpar ever slower than the plain choice? One training step (forward,
loss, backward, SGD) of mid-size models from transformers, timed under the
configurations a user would compare (issue 38):

- ``eager``: the model as written;
- ``compile``: ``torch.compile(step)``, Inductor's default (the peer);
- ``mp-1``: ``torch.compile(step, backend="modelpar")`` on one device;
- ``mp-etf``: placed by m-ETF on 2 CPU worker devices;
- ``mp-1f1b``: pipelined, 1F1B with 4 micro-batches on 2 CPU worker devices;
- ``mp-auto``: ``strategy="auto"`` on 2 CPU worker devices (what it chose is
  printed; its first steps time the choice against one device, Note [Never
  slower than one device]);
- ``mp-1-inductor``, ``mp-1f1b-inductor``: ``mp-1`` and ``mp-1f1b`` with
  ``kernels="inductor"`` (each run of a device's operators between transfers
  compiled by Inductor: Note [Kernel regions]).

Models (random init, nothing downloaded): a Llama-style decoder (RoPE, GQA:
4 layers, hidden 256, 8 heads, 2 KV heads), a GPT-2-style decoder of the
same sizes (sequence 128, batch 8), and a ResNet-18-style CNN (64x64 images,
batch 8). Every configuration trains its own copy of the model in this one
process, with the same intra-op threads (``--threads``, default 2); after
each has compiled and run ``--warmup`` steps, ``--rounds`` rounds time
``--steps`` steps of each configuration in turn (interleaved, so drift in
the machine's speed falls on all), and the table gives each one's median
step and its speed against ``compile``, plus auto's against the best plain
modelpar option.

    PYTHONPATH=build/python .venv/bin/python bench/vs_torch_compile.py \\
        [--models llama,gpt2,resnet] [--configs eager,compile,mp-1,mp-etf,mp-1f1b,mp-auto]
"""

from __future__ import annotations

import argparse
import copy
import os
import platform
import statistics
import sys
import time
from collections.abc import Callable
from typing import Any

os.environ.setdefault("HF_HUB_OFFLINE", "1")

import torch  # noqa: E402

import modelpar  # noqa: E402,F401  (the backend; the plans() of mp-auto)
from zoo_pipeline_throughput import own_code  # noqa: E402  (one compiled cache per configuration)

CONFIGS: dict[str, dict[str, Any] | None] = {
    "eager": None,
    "compile": None,
    "mp-1": {},
    "mp-etf": {"devices": 2, "placer": "m-etf"},
    "mp-1f1b": {"devices": 2, "pipeline": {"schedule": "1f1b", "microbatches": 4}},
    "mp-auto": {"devices": 2, "strategy": "auto"},
    "mp-1-inductor": {"kernels": "inductor"},
    "mp-1f1b-inductor": {"devices": 2, "kernels": "inductor",
                         "pipeline": {"schedule": "1f1b", "microbatches": 4}},
}


def _llama() -> tuple[torch.nn.Module, Callable[[], tuple]]:
    import transformers
    cfg = transformers.LlamaConfig(vocab_size=1024, hidden_size=256, intermediate_size=688,
                                   num_hidden_layers=4, num_attention_heads=8,
                                   num_key_value_heads=2, max_position_embeddings=256)
    return transformers.LlamaForCausalLM(cfg), _tokens(1024)


def _gpt2() -> tuple[torch.nn.Module, Callable[[], tuple]]:
    import transformers
    cfg = transformers.GPT2Config(vocab_size=1024, n_positions=256, n_embd=256, n_layer=4,
                                  n_head=8, resid_pdrop=0.0, embd_pdrop=0.0, attn_pdrop=0.0)
    return transformers.GPT2LMHeadModel(cfg), _tokens(1024)


def _tokens(vocab: int) -> Callable[[], tuple]:
    g = torch.Generator().manual_seed(0)
    x = torch.randint(0, vocab, (8, 128), generator=g)
    return lambda: (x, x)


def _resnet() -> tuple[torch.nn.Module, Callable[[], tuple]]:
    import transformers
    cfg = transformers.ResNetConfig(embedding_size=64, hidden_sizes=[64, 128, 256, 512],
                                    depths=[2, 2, 2, 2], layer_type="basic", num_labels=10)
    g = torch.Generator().manual_seed(0)
    x, y = torch.randn(8, 3, 64, 64, generator=g), torch.randint(0, 10, (8,), generator=g)
    return transformers.ResNetForImageClassification(cfg), lambda: (x, y)


MODELS = {"llama": _llama, "gpt2": _gpt2, "resnet": _resnet}


def _loss(model: torch.nn.Module, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    return model(x, labels=y).loss


def _step_fn(name: str, model: torch.nn.Module) -> Callable[..., torch.Tensor]:
    """The compiled (or eager) function returning the step's loss."""
    fn = own_code(lambda x, y: _loss(model, x, y), name)
    if name == "eager":
        return fn
    if name == "compile":
        return torch.compile(fn)
    return torch.compile(fn, backend="modelpar", options=CONFIGS[name])


class _Runner:
    def __init__(self, name: str, base: torch.nn.Module, batch: Callable[[], tuple]) -> None:
        torch.manual_seed(0)
        self.name = name
        self.model = copy.deepcopy(base).train()
        self.opt = torch.optim.SGD(self.model.parameters(), lr=1e-3)
        self.fn = _step_fn(name, self.model)
        self.batch = batch
        self.times_ms: list[float] = []
        self.compile_s = 0.0
        self.chose = ""

    def step(self) -> float:
        x, y = self.batch()
        t0 = time.perf_counter()
        loss = self.fn(x, y)
        loss.backward()
        self.opt.step()
        self.opt.zero_grad(set_to_none=True)
        return (time.perf_counter() - t0) * 1e3


def _bench(model_name: str, configs: list[str], warmup: int, rounds: int, steps: int) -> list[dict]:
    torch._dynamo.reset()  # the previous model's compiled code and its memory
    base, batch = MODELS[model_name]()
    runners = []
    for name in configs:
        r = _Runner(name, base, batch)
        t0 = time.perf_counter()
        for _ in range(warmup):
            r.step()
        r.compile_s = time.perf_counter() - t0
        if name == "mp-auto":
            plans = modelpar.plans()
            r.chose = plans[-1].runs_on if plans else ""
        print(f"  {model_name} {name}: compiled and warmed up in {r.compile_s:.1f} s "
              f"{r.chose}", file=sys.stderr, flush=True)
        runners.append(r)
    for k in range(rounds):
        for r in runners:
            r.times_ms.extend(r.step() for _ in range(steps))
        print(f"  {model_name}: round {k + 1}/{rounds}", file=sys.stderr, flush=True)
    ref = next((statistics.median(r.times_ms) for r in runners if r.name == "compile"), None)
    rows = []
    for r in runners:
        med = statistics.median(r.times_ms)
        rows.append({"model": model_name, "config": r.name, "median_ms": med,
                     "min_ms": min(r.times_ms), "max_ms": max(r.times_ms),
                     "vs_compile": (ref / med) if ref else float("nan"),
                     "warmup_s": r.compile_s, "chose": r.chose})
    plain = [row["median_ms"] for row in rows if row["config"] in ("mp-1", "mp-etf", "mp-1f1b")]
    for row in rows:
        if row["config"] == "mp-auto" and plain:
            row["auto_vs_best_plain"] = min(plain) / row["median_ms"]
    return rows


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--models", default="llama,gpt2,resnet")
    ap.add_argument("--configs", default=",".join(CONFIGS))
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--warmup", type=int, default=2)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--steps", type=int, default=3)
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    configs = [c for c in args.configs.split(",") if c]
    unknown = [c for c in configs if c not in CONFIGS]
    if unknown:
        ap.error(f"unknown configs {unknown}; known: {', '.join(CONFIGS)}")
    print(f"# {platform.processor() or platform.machine()}, {os.cpu_count()} cores, "
          f"torch {torch.__version__}, {args.threads} intra-op threads, warmup {args.warmup}, "
          f"{args.rounds} rounds x {args.steps} steps, interleaved")
    print("| model | config | median ms | min-max ms | vs compile | auto vs best plain | "
          "warm-up s | auto chose |")
    print("|---|---|---:|---:|---:|---:|---:|---|")
    for m in [m for m in args.models.split(",") if m]:
        for row in _bench(m, configs, args.warmup, args.rounds, args.steps):
            avb = row.get("auto_vs_best_plain")
            print(f"| {row['model']} | {row['config']} | {row['median_ms']:.1f} | "
                  f"{row['min_ms']:.1f}-{row['max_ms']:.1f} | {row['vs_compile']:.2f}x | "
                  f"{'' if avb is None else f'{avb:.2f}x'} | {row['warmup_s']:.1f} | "
                  f"{row['chose']} |", flush=True)


if __name__ == "__main__":
    main()
