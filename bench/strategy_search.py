"""Does strategy="auto" choose well, and does the simulator rank the
strategies as the machine does? (issue 17's proof; results in bench/RESULTS.md)

    PYTHONPATH=build/python .venv/bin/python bench/strategy_search.py \
        [--models mlp,cnn,unet,gpt,inception,looped] [--devices 2] [--runs 16]
    # on a GPU (issue 37 item 4): N logical devices of one GPU
    PYTHONPATH=build-gpu/python python3 bench/strategy_search.py \
        --device-map cuda:0 --devices 2|4 [--models mlp,gpt] [--batch-scale 4]

Per model of tests/python/models.py, at 4x its test batch:

1. ``torch.compile(..., options={"devices": N, "strategy": "auto"})`` runs
   one training step: the step graph is joined, its nodes are timed on a CPU
   worker, and the search runs on this CPU's calibrated profile
   (modelpar/profiles/cpu.py) with the step's measured per-op overhead (per
   micro-batch count) and
   the cores the workers get (``cores``, Note [Shared host cores]); its
   time is reported (``search``, candidates planned in parentheses).
2. Every candidate of the search, without pruning, is planned again and its
   Program run on N CPU worker devices (``Executor``, one thread each) on
   inputs of the step graph's types; the measured step is the median of
   ``--runs`` runs, taken in 4 passes over all the candidates (each pass a
   fresh executor, 3 warm-ups, a quarter of the runs), so that a burst of
   other load lands on one pass of a few candidates, not on all the runs of
   one (measured: gpt's one-device plan, timed first, once ran 1.6x its
   usual step through all 15 of its runs).
3. Reported per model: the chosen candidate's measured step against the best
   measured candidate the search could choose (goal: within 5 %; for the CNN
   not its pipelines, which would normalise batch norm per micro-batch), and
   the simulator's fidelity over all the candidates that ran (with deferred
   batch norm): Spearman's rank correlation of simulated and
   measured steps (goal >= 0.95) and the mean absolute relative error
   |simulated - measured| / measured (goal <= 10 %). And the measurement's
   own error, ``retest``: each candidate's median over passes 1 and 3
   against its median over passes 2 and 4, |a - b| / b averaged over the
   candidates. An MAE near it is as close as this machine lets the
   simulator be checked: a perfect simulator would score about that.

With ``--device-map cuda:0`` the same is done on N logical devices of one
GPU (issue 37 item 4): the model and its inputs are on the GPU,
torch.compile plans with ``device_map="cuda:0"``, so the search costs the
candidates on the GPU's calibrated profile (modelpar/profiles/cuda.py, each
logical device with its share of the GPU's memory, Note [Logical devices
share their GPU]) as it does for any CUDA device map: no node is timed (Note
[The searched step] times nodes on CPU workers only), and every candidate's
Program runs on an ``Executor(device_map="cuda:0")``, each step timed from
a synchronised start to its synchronised end (the host's issue time
included, as the simulator's per-op overhead models it). The header names
the card, its driver, torch and CUDA versions and the profile's calibration.
Without a GPU (or with a modelpar built without CUDA devices) it exits with
status 2 and says so. ``--batch-scale`` (default 4) sets the batch as a
multiple of the test batch: the test models at 4x are launch-bound on a GPU.

``--json out.json`` writes every candidate's numbers.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import torch

import modelpar
from modelpar.profiles.cpu import cpu_profile_path
from modelpar.planning.placement import example_inputs
from modelpar.planning.strategy import search_strategy

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests" / "python"))
from models import CASES  # noqa: E402


def capture(name: str, devices: int, batch: int, device_map: str):
    """The joined step graph of one model and the search torch.compile ran
    (on ``device_map``: the model and its batch are moved to the GPU of a
    CUDA map)."""
    case = CASES[name]
    torch.manual_seed(0)
    torch._dynamo.reset()
    modelpar.clear_plans()
    on = torch.device(device_map) if device_map != "cpu-workers" else torch.device("cpu")
    model = case.make_model().to(on)
    options = {"devices": devices, "strategy": "auto", "strict": True}
    if device_map != "cpu-workers":
        options["device_map"] = device_map
    fast = torch.compile(lambda x, y: case.loss(model(x), y), backend="modelpar",
                         options=options)
    x, y = (t.to(on) for t in case.batch(0, batch))
    t0 = time.perf_counter()
    fast(x, y).backward()
    first_call = time.perf_counter() - t0
    rec = modelpar.plans()[-1]
    return (rec.step_graph, rec.search, rec.search_machine, rec.search_microbatch_launch_us,
            first_call)


def step_inputs(graph, batch: int) -> list:
    """Inputs of the step graph's types at this batch: the batch symbol and
    the int inputs that carry it (``s0``, ``s0_1``) are ``batch``."""
    specs = modelpar._C.graph_input_specs(graph)
    symbols = {d for s in specs if s["kind"] == "tensor" for d in s["shape"][:1]
               if isinstance(d, str)}
    sizes = {sym: batch for sym in symbols}
    for s in specs:
        if s["kind"] == "int" and any(s["name"] == sym or s["name"].startswith(sym + "_")
                                      for sym in symbols):
            sizes[s["name"]] = batch
    return example_inputs(graph, sizes)


def plan_of(graph, c: dict, devices: int, batch: int, machine: str | None, launch: dict):
    """The plan of one candidate, planned alone."""
    kind = c["kind"]
    s = search_strategy(graph, devices, batch, machine=machine, prune=False,
                        microbatch_launch_us=launch,
                        one_device=kind == "one-device", placements=kind == "placement",
                        pipelines=kind == "pipeline",
                        placers=[c["placer"]] if kind == "placement" else (),
                        schedules=[c["schedule"]] if kind == "pipeline" else (),
                        partitions=[c["partition"]] if kind == "pipeline" else (),
                        checkpoints=[c["checkpoint"]] if kind == "pipeline" else (),
                        microbatches=[c["microbatches"]] if kind == "pipeline" else (),
                        batch_norm="deferred")
    return s.pipeline if s.pipeline is not None else s.placement


PASSES = 4


def measure(program, inputs: list, runs: int, device_map: str = "cpu-workers") -> list[float]:
    """``runs`` step times (microseconds) of ``program`` after 3 warm-ups. On
    a CUDA map each step is timed from a synchronised start to its
    synchronised end (the executor ends a step with the caller's stream
    joined, not with a host wait)."""
    if device_map == "cpu-workers":
        ex = modelpar.Executor(program, device_map="cpu-workers", threads_per_device=1)
        sync = None
    else:
        ex = modelpar.Executor(program, device_map=device_map)
        sync = torch.cuda.synchronize
    for _ in range(3):
        ex.run(list(inputs))
    times = []
    for _ in range(runs):
        if sync is not None:
            sync()
        t0 = time.perf_counter_ns()
        ex.run(list(inputs))
        if sync is not None:
            sync()
        times.append((time.perf_counter_ns() - t0) / 1e3)
    return times


def ranks(xs: list[float]) -> list[float]:
    """Ranks 1..n, ties get their average rank."""
    order = sorted(range(len(xs)), key=lambda i: xs[i])
    out = [0.0] * len(xs)
    i = 0
    while i < len(order):
        j = i
        while j + 1 < len(order) and xs[order[j + 1]] == xs[order[i]]:
            j += 1
        for k in range(i, j + 1):
            out[order[k]] = (i + j) / 2 + 1
        i = j + 1
    return out


def spearman(a: list[float], b: list[float]) -> float:
    ra, rb = ranks(a), ranks(b)
    ma, mb = statistics.fmean(ra), statistics.fmean(rb)
    cov = sum((x - ma) * (y - mb) for x, y in zip(ra, rb))
    va = sum((x - ma) ** 2 for x in ra) ** 0.5
    vb = sum((y - mb) ** 2 for y in rb) ** 0.5
    return cov / (va * vb) if va and vb else float("nan")


def bench_model(name: str, devices: int, runs: int, device_map: str = "cpu-workers",
                batch_scale: int = 4) -> dict:
    batch = CASES[name].batch_size * batch_scale
    graph, search, machine_text, launch, first_call = capture(name, devices, batch, device_map)
    # The machine the search planned on: on CPU workers the CPU profile with
    # the step's measured per-op overhead (Note [The searched step]); on a
    # CUDA map the GPU's profile, shared by the logical devices.
    machine = None
    cores = json.loads(machine_text).get("host_cores", 0.0) if machine_text else 0.0
    if machine_text is not None:
        machine = os.path.join(tempfile.mkdtemp(), f"{name}.json")
        Path(machine).write_text(machine_text)
    chosen_label = search.candidates[search.chosen]["label"]
    full = search_strategy(graph, devices, batch, machine=machine, prune=False,
                           batch_norm="deferred", microbatch_launch_us=launch)
    inputs = step_inputs(graph, batch)
    if device_map != "cpu-workers":  # once, not an input copy per step
        inputs = [v.to(device_map) if isinstance(v, torch.Tensor) else v for v in inputs]
    ok = [c for c in full.candidates if c["status"] == "ok"]
    programs = [plan_of(graph, c, devices, batch, machine, launch).program for c in ok]
    # passes[k][j]: candidate k's runs in pass j.
    passes: list[list[list[float]]] = [[] for _ in ok]
    for _ in range(PASSES):
        for k, program in enumerate(programs):
            passes[k].append(measure(program, inputs, max(1, runs // PASSES), device_map))
    times = [[t for p in ps for t in p] for ps in passes]
    rows = [{"label": c["label"], "simulated_us": c["step_us"],
             "measured_us": statistics.median(t), "peak_bytes": c["peak_bytes"],
             "retest_us": [statistics.median(t for p in ps[h::2] for t in p) for h in (0, 1)]}
            for c, t, ps in zip(ok, times, passes)]
    sim = [r["simulated_us"] for r in rows]
    meas = [r["measured_us"] for r in rows]
    # The chosen plan is compared with the best the search could choose (its
    # ok and pruned candidates; Note [Searched pipelines keep the pipeline
    # option's defaults] in compile/step_search.py).
    choosable = {c["label"] for c in search.candidates if c["status"] in ("ok", "pruned")}
    best = min((r for r in rows if r["label"] in choosable), key=lambda r: r["measured_us"])
    chosen = next(r for r in rows if r["label"] == chosen_label)
    return {"model": name, "device_map": device_map, "devices": devices, "batch": batch,
            "nodes": graph.num_nodes,
            "candidates": len(full.candidates), "ran": len(rows),
            "search_s": search.seconds, "search_planned": sum(
                c["status"] != "pruned" for c in search.candidates),
            "first_call_s": first_call, "host_cores": cores, "launch_us": launch,
            "chosen": chosen_label,
            "chosen_us": chosen["measured_us"], "chosen_sim_us": chosen["simulated_us"],
            "best": best["label"], "best_us": best["measured_us"],
            "chosen_over_best": chosen["measured_us"] / best["measured_us"],
            "spearman": spearman(sim, meas),
            "mae": statistics.fmean(abs(s - m) / m for s, m in zip(sim, meas)),
            "retest": statistics.fmean(abs(a - b) / b for a, b in (r["retest_us"] for r in rows)),
            "rows": rows}


def gpu_unavailable(device_map: str) -> str | None:
    """Why ``device_map`` cannot be measured here, or None."""
    if not torch.cuda.is_available():
        return (f"--device-map {device_map} needs a GPU, and torch {torch.__version__} sees none "
                "(torch.cuda.is_available() is False); run it on a GPU machine "
                "(scripts/gpu_check.sh, step fidelity), or leave --device-map out to measure on "
                "CPU workers")
    from modelpar.runtime.executor import cuda_devices_built
    if not cuda_devices_built():
        return (f"--device-map {device_map}: this modelpar build has no CUDA devices; build it "
                "against a CUDA torch (scripts/gpu_check.sh builds build-gpu)")
    from modelpar.errors import ConfigError
    from modelpar.profiles.cuda import gpus_of
    try:
        gpus = gpus_of(device_map)
    except ConfigError as e:
        return str(e)
    if "," in device_map or max(gpus) >= torch.cuda.device_count():
        return (f"--device-map {device_map}: give one visible GPU, cuda:K (K < "
                f"{torch.cuda.device_count()}), whose logical devices the plans share")
    return None


def driver_version() -> str:
    try:
        out = subprocess.run(["nvidia-smi", "--query-gpu=driver_version", "--format=csv,noheader"],
                             capture_output=True, text=True, timeout=20, check=True).stdout
        return out.split()[0]
    except (OSError, subprocess.SubprocessError, IndexError):
        return "unknown"


def header(device_map: str) -> str:
    """The machine, torch and the profile the plans were costed on."""
    if device_map == "cpu-workers":
        machine = cpu_profile_path(1)
        where = f"{platform.processor() or platform.machine()}, {os.cpu_count()} cores"
    else:
        from modelpar.profiles.cuda import cuda_profile_path, gpus_of
        machine = cuda_profile_path(device_map)
        index = gpus_of(device_map)[0]
        where = (f"{torch.cuda.get_device_name(index)} ({device_map}), driver {driver_version()}, "
                 f"CUDA {torch.version.cuda}, {os.cpu_count()} host cores, TF32 matmul "
                 f"{torch.backends.cuda.matmul.allow_tf32}")
    prof = json.loads(Path(machine).read_text()) if machine else {}
    return (f"# {time.strftime('%Y-%m-%d %H:%M')}, {where}, torch {torch.__version__}, profile "
            f"{json.dumps(prof.get('calibration', {}))}")


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--models", default="mlp,cnn,unet,gpt,inception,looped")
    ap.add_argument("--devices", type=int, default=2,
                    help="logical devices (CPU workers, or of the GPU of --device-map)")
    ap.add_argument("--device-map", default="cpu-workers",
                    help="cpu-workers (default) or cuda:K: N logical devices of GPU K")
    ap.add_argument("--batch-scale", type=int, default=4,
                    help="the batch as a multiple of the model's test batch (default 4)")
    ap.add_argument("--runs", type=int, default=16)
    ap.add_argument("--json", default=None)
    args = ap.parse_args()
    if args.devices < 2:
        ap.error("--devices must be at least 2 (the search compares plans over several devices)")
    if args.device_map != "cpu-workers":
        why = gpu_unavailable(args.device_map)
        if why is not None:
            print(f"strategy_search: {why}", file=sys.stderr)
            return 2
    torch.set_num_threads(1)
    print(header(args.device_map))
    print(f"# {args.devices} logical devices on {args.device_map}, batch {args.batch_scale}x the "
          f"test batch, {args.runs} runs per candidate in {PASSES} passes", flush=True)
    print("| model | batch | candidates | ran | search (planned) | cores | chosen | chosen meas. | "
          "best measured | chosen/best | Spearman | MAE | retest |")
    print("|---|---|---|---|---|---|---|---|---|---|---|---|---|")
    results = []
    for name in args.models.split(","):
        r = bench_model(name, args.devices, args.runs, args.device_map, args.batch_scale)
        results.append(r)
        print(f"| {name} | {r['batch']} | {r['candidates']} | {r['ran']} | "
              f"{r['search_s'] * 1e3:.0f} ms ({r['search_planned']}) | {r['host_cores']:.2f} | "
              f"{r['chosen']} | "
              f"{r['chosen_us']:.0f} us | {r['best']}: {r['best_us']:.0f} us | "
              f"{r['chosen_over_best']:.3f} | {r['spearman']:.3f} | {r['mae'] * 100:.0f} % | "
              f"{r['retest'] * 100:.0f} % |",
              flush=True)
    if args.json:
        Path(args.json).write_text(json.dumps(results, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
