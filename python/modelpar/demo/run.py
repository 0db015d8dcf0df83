"""``python -m modelpar demo``: the main job on a small transformer.

A 4-layer Llama from Hugging Face transformers (demo/model.py) is trained
for a few SGD steps five ways, from the same initial weights on the same
batches:

1. eager PyTorch (the reference);
2. ``torch.compile(step, backend="modelpar")``: one device;
3. ``options={"devices": 4, "placer": "m-etf"}``: each operator placed on one
   of 4 CPU worker devices by Baechi's m-ETF;
4. ``options={"devices": 4, "pipeline": {"schedule": "1f1b", "microbatches": 4}}``:
   cut into 4 stages that 4 micro-batches stream through;
5. ``options={"devices": 4, "strategy": "auto"}``: the plan modelpar picks.

Each modelpar run's loss at every step and its parameters after the last
step are checked against eager's within the fp32 reduction-order tolerance
(demo/model.py). It prints every plan's summary (``modelpar.plans()``), then
the checks and the step times side by side (median of the last steps; the
first steps compile, and under ``strategy="auto"`` time the chosen plan
against one device), and writes into ``out_dir`` the pipelined run's
Chrome traces (its ``trace`` option: ``pipeline.json``, measured, and
``pipeline.simulated.json``; open them in ui.perfetto.dev) and
``pipeline_timeline.png``, that step simulated and measured (demo/timeline.py). A progress
line per stage goes to stderr.

The CPU workers are threads of this process: on a machine with fewer cores
than devices they share the cores, and the measured times say so.
"""

from __future__ import annotations

import os
import sys
import time
import traceback
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from ..compile.records import plans
from .model import Check, DemoModel, TrainingRun, build_model, compare, lm_step, train
from .timeline import plot_timeline

__all__ = ["Mode", "MODES", "run_demo"]


@dataclass(frozen=True)
class Mode:
    """One way of running the step: a name for the table, what it is, and
    the modelpar options (None: eager PyTorch)."""
    name: str
    what: str
    options: dict[str, Any] | None
    trace: str | None = None  # the trace option's file name in out_dir

    @property
    def dynamic_batch(self) -> bool:
        # A pipeline plans a symbolic batch (it splits it into micro-batches):
        # marked dynamic, Dynamo traces the step once instead of a static then
        # a symbolic graph.
        opts = self.options or {}
        return "pipeline" in opts or opts.get("strategy") == "auto"


MODES = [
    Mode("eager", "eager PyTorch, one CPU device", None),
    Mode("modelpar 1 device", "modelpar, one device", {}),
    Mode("placed (m-ETF)", "modelpar, m-ETF placement on 4 CPU worker devices",
         {"devices": 4, "placer": "m-etf"}),
    Mode("pipelined (1F1B)", "modelpar, 1F1B pipeline of 4 stages, 4 micro-batches, on 4 CPU "
         "worker devices", {"devices": 4, "pipeline": {"schedule": "1f1b", "microbatches": 4}},
         trace="pipeline.json"),
    Mode("auto", 'modelpar, strategy="auto" over 4 CPU worker devices',
         {"devices": 4, "strategy": "auto"}),
]
PIPELINED = MODES[3]
QUICK_MODES = ("eager", PIPELINED.name)


class _Progress:
    """One line per stage on stderr: stage k of n, the time so far."""

    def __init__(self, stages: int) -> None:
        self.stages, self.done, self.start = stages, 0, time.perf_counter()

    def __call__(self, what: str) -> None:
        self.done += 1
        print(f"modelpar demo [{self.done}/{self.stages}] {time.perf_counter() - self.start:5.1f} s: "
              f"{what}", file=sys.stderr, flush=True)


def _step_maker(mode: Mode, out: Path) -> Callable[[torch.nn.Module], Callable]:
    if mode.options is None:
        return lm_step
    options = dict(mode.options)
    if mode.trace:
        options["trace"] = str(out / mode.trace)

    def make(model: torch.nn.Module) -> Callable:
        return torch.compile(lm_step(model), backend="modelpar", options=options)
    return make


def _ms(seconds: float) -> str:
    return f"{seconds * 1e3:.1f} ms"


def run_demo(out_dir: str = "modelpar-demo", steps: int = 12, quick: bool = False,
             seed: int = 0) -> int:
    """Runs the demo (module docstring) and prints what it checks; returns 0
    when every run matches eager and the files are written, else 1.

    ``steps``: SGD steps of each run (the table's times are the median of
    the last ``max(1, steps // 3)``). ``quick``: a 2-layer model, only eager
    and the pipeline (what the picture needs), for tests.
    """
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    modes = [m for m in MODES if not quick or m.name in QUICK_MODES]
    png = out / "pipeline_timeline.png"
    for m in modes:  # no file of an earlier run passes for this one's
        if m.trace:
            (out / m.trace).unlink(missing_ok=True)
            (out / m.trace).with_suffix(".simulated.json").unlink(missing_ok=True)
    png.unlink(missing_ok=True)
    progress = _Progress(len(modes) + 2)
    progress("building the model (transformers, random init)")
    demo: DemoModel = build_model(layers=2 if quick else 4, seed=seed, steps=steps)
    print(f"modelpar demo: {demo.description}; {steps} SGD steps (lr {demo.lr}) each way")
    torch._dynamo.reset()
    runs: dict[str, TrainingRun] = {}
    checks: dict[str, Check] = {}
    failed: list[str] = []
    executor_us: dict[str, float] = {}  # modelpar's own step time: its executors' runs
    names = {m.name: m.name for m in modes}  # auto's gets what it chose
    for mode in modes:
        progress(f"{mode.what}: {steps} steps" + ("" if mode.options is None else
                                                  ", the first compiles"))
        torch._dynamo.reset()  # each run traces its own step
        first_plan = len(plans())
        try:
            run = train(demo, _step_maker(mode, out), dynamic_batch=mode.dynamic_batch)
        except Exception:  # the other runs still show what they show
            if mode.options is None:
                raise
            traceback.print_exc()
            failed.append(mode.name)
            continue
        runs[mode.name] = run
        if mode.options is None:
            continue
        print(f"\n=== {mode.what}: options={mode.options}")
        made = plans()[first_plan:]
        for p in made:
            print(p)
        if made and made[-1].measured_median_us is not None:
            executor_us[mode.name] = made[-1].measured_median_us
        if made and made[-1].search is not None:  # strategy="auto": say what it chose
            s = made[-1].search
            chose = s.candidates[s.chosen]["label"]
            if any("switched" in note for note in made[-1].guard_batches.values()):
                chose += ", then one device (faster when run)"
            names[mode.name] = f"{mode.name}: {chose}"
        checks[mode.name] = compare(demo, run, runs["eager"])
    torch._dynamo.reset()

    progress("drawing the pipeline's timeline, simulated and measured")
    files_ok = True
    pipe = out / str(PIPELINED.trace)
    sim = pipe.with_name(pipe.stem + ".simulated.json")
    if pipe.exists() and sim.exists():
        try:
            plot_timeline(pipe, sim, png, f"{PIPELINED.what}: one training step")
        except ImportError as e:
            print(f"modelpar demo: no picture ({e}); pip install matplotlib", file=sys.stderr)
            files_ok = False
    else:
        files_ok = False

    last = max(1, steps // 3)
    print("\n=== modelpar demo: against eager PyTorch (tolerance: fp32 sums in another order)")
    for name, check in checks.items():
        print(f"  {name:<18} {check.line()}")
    print(f"\n=== step times (forward, backward, SGD; median of the last {last} of {steps} steps)")
    print(f"  {_machine()}")
    eager_s = runs["eager"].median_step_s(last)
    width = max(len(n) for n in names.values())
    print(f"  {'':<{width}} {'step':>10} {'vs eager':>9} {'executor':>10} "
          f"{'first step (compiles)':>22}")
    for name, run in runs.items():
        med = run.median_step_s(last)
        ex = _ms(executor_us[name] / 1e6) if name in executor_us else "-"
        print(f"  {names[name]:<{width}} {_ms(med):>10} {eager_s / med:>8.2f}x {ex:>10} "
              f"{run.step_s[0]:>20.1f} s")
    print("  step: wall time of loss, backward and SGD step as the caller sees it; executor: "
          "modelpar's executors alone (plans()[-1].measured_median_us).")
    traced = [names[m.name] for m in modes if m.trace and m.name in runs]
    if traced:
        print(f"  {', '.join(traced)}: with the trace option, which writes the measured trace "
              "after every step, part of its wall time.")
    print("\n  traces (open in ui.perfetto.dev): "
          + ", ".join(str(out / m.trace) for m in modes if m.trace)
          + " and the simulated step beside it (.simulated.json)")
    print(f"  picture: {png}" if png.exists() else "  picture: not written")
    for name in failed:
        print(f"  {name}: FAILED (the traceback is above)")
    ok = all(c.ok for c in checks.values()) and files_ok and not failed
    print("modelpar demo: " + ("all checks passed" if ok else "FAILED"))
    return 0 if ok else 1


def _machine() -> str:
    """The cores, threads and load the times were measured with: the CPU
    workers are threads of this process and share the cores with whatever
    else runs."""
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count()
    load = os.getloadavg()[0] if hasattr(os, "getloadavg") else float("nan")
    text = (f"{cores} cores, load average {load:.1f}; eager and one device use "
            f"{torch.get_num_threads()} intra-op threads, each CPU worker device 1")
    if cores and load > cores:
        text += "; the machine is busy with other work, so the times are too"
    return text
