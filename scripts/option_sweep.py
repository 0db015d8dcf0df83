"""Random torch.compile option combinations, end to end, against eager (by hand).

    PYTHONPATH=build/python .venv/bin/python scripts/option_sweep.py \
        [--seed 0] [--count 40] [--models mlp,gpt,zoo:gpt2,...]
    PYTHONPATH=build/python .venv/bin/python -m torch.distributed.run \
        --nproc-per-node 2 scripts/option_sweep.py --seed 0   # devices="world"

Each case draws a model (tests/python/models.py, "graph-breaks": its
GraphBroken, four graphs; or "zoo:NAME" from tests/python/zoo.py), the loss inside or outside the compiled function, and a
combination of options (devices, placer / pipeline keys / strategy="auto",
trace into a folder that does not exist yet, memory, partitioner, strict,
dump_dir, cuda_graphs; now and then mode="max-autotune" or "reduce-overhead"
with the options in $MODELPAR_OPTIONS), trains three SGD steps (the third at
another batch size) and evaluates one batch under no_grad, comparing the loss
and every gradient with eager (relative to the largest; over ranks the gradients are summed
first: each is on its owner only). A case ends as one of

  ok        equal within 1e-3 (placement and micro-batching reorder fp32 sums)
  refused   a modelpar error (also inside Dynamo's BackendCompilerFailed):
            its first line is printed, to read whether it names the problem
  differs   a pipeline of a model with training-mode batch norm (deferred
            batch norm normalises each micro-batch by its own statistics)
  MISMATCH  anything else beyond 1e-3
  CRASH     any other exception (with its traceback)

and the script exits 1 if any case is a MISMATCH or a CRASH. The same seed
draws the same cases on every rank. Tests cover each bug this found (see
bench/history/2026-11.md, "Option combinations end to end"); this is the search.
"""

from __future__ import annotations

import argparse
import copy
import json
import os
import random
import shutil
import sys
import tempfile
import traceback
import warnings
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tests" / "python"))

import modelpar  # noqa: E402
from modelpar.planning.option_names import PIPELINE_SCHEDULES  # noqa: E402

TEST_MODELS = "mlp,gpt,cnn,unet,inception,looped,graph-breaks"
# Every schedule modelpar has (one list: passes/option_names.h).
PIPELINE_CHOICES = [("microbatches", [1, 2, 3, 4, 8]), ("schedule", list(PIPELINE_SCHEDULES)),
                    ("partition", ["balance-time", "balance-size", "balance-time-comm", "madpipe"]),
                    ("checkpoint", ["always", "except_last", "never"]), ("portals", [True, False])]


class _Model:
    """A test model or a transformers one, seen the same way."""

    def __init__(self, name: str) -> None:
        if name.startswith("zoo:"):
            from zoo import ZOO
            z = ZOO[name[4:]]
            self.make, self.batch, self.size = z.make_model, z.batch, z.batch_size
            self.step = z.step
            self.outside = lambda compiled, x, y: z.loss(z.predict(compiled, x), y)
        else:
            from models import CASES, GRAPH_BREAKS
            c = GRAPH_BREAKS if name == "graph-breaks" else CASES[name]
            self.make, self.batch, self.size = c.make_model, c.batch, 2 * c.batch_size
            self.step = lambda model, x, y: c.loss(model(x), y)
            self.outside = lambda compiled, x, y: c.loss(compiled(x), y)


def _options(rng: random.Random, world: bool, folder: str) -> dict:
    o: dict = {"strict": rng.random() < 0.5}
    if world:
        o.update(devices="world", peer_timeout=20.0)
    else:
        o["devices"] = rng.choice([1, 2, 2, 3])
    several = world or o["devices"] > 1
    kind = rng.choice(["none", "placer", "pipeline", "pipeline", "auto"])
    if kind == "placer" and several:
        o["placer"] = rng.choice(["m-topo", "m-etf", "m-sct"])
    elif kind == "pipeline" and several:
        o["pipeline"] = {k: rng.choice(v) for k, v in PIPELINE_CHOICES if rng.random() < 0.6}
    elif kind == "auto" and several:
        o["strategy"] = "auto"
    if rng.random() < 0.3:
        o["trace"] = os.path.join(folder, f"trace{rng.randrange(10**6)}", "step.json")
    if rng.random() < 0.15:
        o["memory"] = rng.choice(["1GiB", "64KiB"])
    if rng.random() < 0.2:
        o["partitioner"] = "min_cut"
    if rng.random() < 0.15:
        o["dump_dir"] = os.path.join(folder, f"dump{rng.randrange(10**6)}")
    if rng.random() < 0.1:
        o["cuda_graphs"] = True  # CPU workers: stream replay, and the plan says why
    return o


def _mode(rng: random.Random) -> str | None:
    """torch.compile's mode, given beside no options (torch.compile takes one
    or the other): the options then come from $MODELPAR_OPTIONS."""
    return rng.choice([None] * 8 + ["max-autotune", "reduce-overhead"])


def _worst(model: torch.nn.Module, eager: torch.nn.Module, world: bool) -> float:
    """The largest gradient difference relative to eager's largest gradient."""
    import torch.distributed as dist
    scale = max(float(q.grad.abs().max()) for q in eager.parameters() if q.grad is not None)
    worst = 0.0
    for p, q in zip(model.parameters(), eager.parameters()):
        if q.grad is None:
            continue
        g = p.grad if p.grad is not None else torch.zeros_like(q.grad)
        if world:
            g = g.clone()
            dist.all_reduce(g)
        worst = max(worst, float((g - q.grad).abs().max()) / max(scale, 1e-12))
    return worst


def _case(name: str, inside: bool, options: dict, mode: str | None, world: bool) -> float:
    m = _Model(name)
    kw: dict = {"options": options}
    os.environ.pop("MODELPAR_OPTIONS", None)
    if mode is not None:
        os.environ["MODELPAR_OPTIONS"] = json.dumps(options)
        kw = {"mode": mode}
    torch._dynamo.reset()
    modelpar.clear_plans()
    torch.manual_seed(0)
    model = m.make()
    eager = copy.deepcopy(model)
    if inside:
        fast = torch.compile(lambda x, y: m.step(model, x, y), backend="modelpar", **kw)
    else:
        compiled = torch.compile(model, backend="modelpar", **kw)
        fast = lambda x, y: m.outside(compiled, x, y)  # noqa: E731
    worst = 0.0
    for step, size in enumerate([m.size, m.size, m.size + 2]):  # a new batch size plans again
        x, y = m.batch(step, size)
        loss, want = fast(x, y), m.step(eager, x, y)
        loss.backward()
        want.backward()
        worst = max(worst, abs(float(loss) - float(want)) / max(abs(float(want)), 1e-12),
                    _worst(model, eager, world))
        with torch.no_grad():  # eager's SGD step, copied into the compiled model
            for p, q in zip(model.parameters(), eager.parameters()):
                if q.grad is not None:
                    q -= 0.05 * q.grad
                p.copy_(q)
                p.grad = q.grad = None
    with torch.no_grad():  # evaluation through the same compiled function
        x, y = m.batch(3, m.size)
        loss, want = fast(x, y), m.step(eager, x, y)
        worst = max(worst, abs(float(loss) - float(want)) / max(abs(float(want)), 1e-12))
    return worst


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--count", type=int, default=40)
    ap.add_argument("--models", default=TEST_MODELS)
    args = ap.parse_args()
    warnings.filterwarnings("ignore")
    torch.set_num_threads(1)
    world = "WORLD_SIZE" in os.environ
    rank = 0
    if world:
        import datetime

        import torch.distributed as dist
        dist.init_process_group("gloo", timeout=datetime.timedelta(seconds=120))
        rank = dist.get_rank()
    # One folder for every rank (the options, trace paths included, are the same everywhere).
    run = os.environ.get("TORCHELASTIC_RUN_ID", str(os.getpid()))
    folder = os.path.join(tempfile.gettempdir(), f"option_sweep.{run}.seed{args.seed}")
    rng = random.Random(args.seed)
    names = args.models.split(",")
    bad = 0
    for i in range(args.count):
        name = rng.choice(names)
        options = _options(rng, world, folder)
        mode = _mode(rng)
        inside = rng.random() < 0.6
        label = (f"{i} {name} loss {'inside' if inside else 'outside'} {options}"
                 + (f" mode={mode} (options from $MODELPAR_OPTIONS)" if mode else ""))
        try:
            worst = _case(name, inside, options, mode, world)
            batch_norm = any(isinstance(mod, torch.nn.modules.batchnorm._BatchNorm)
                             for mod in _Model(name).make().modules())
            if worst <= 1e-3:
                verdict = "ok"
            elif batch_norm and "pipeline" in options:
                verdict = "differs"
            else:
                verdict, bad = "MISMATCH", bad + 1
            if rank == 0:
                print(f"{verdict:8s} {label} rel {worst:.1e}", flush=True)
        except Exception as e:  # noqa: BLE001 -- the sweep reports every kind
            inner = getattr(e, "inner_exception", e)
            if isinstance(inner, modelpar.Error):
                first = str(inner).splitlines()[0] if str(inner) else ""
                print(f"refused  {label} [rank {rank}] {type(inner).__name__}: {first[:300]}",
                      flush=True)
            else:
                bad += 1
                print(f"CRASH    {label} [rank {rank}] {type(e).__name__}", flush=True)
                traceback.print_exc(limit=-4)
        if world:
            import torch.distributed as dist
            dist.barrier()
    if rank == 0:
        shutil.rmtree(folder, ignore_errors=True)
        print(f"{args.count} cases, {bad} mismatches or crashes")
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
