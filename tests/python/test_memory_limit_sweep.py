"""Memory limits honoured by the pipelined steps that run (issue 35).

Random pipelined steps (test_fuzz_plans.py's random layer chains with
skips, or examples/ir/skip_step_symbolic.txt; small batches or large) x
every pipeline schedule (gpipe, 1f1b, 1f1b*, interleaved with 2 or 3 virtual
stages, zb-h1, zb-v; random partition, portals, micro-batches) x checkpoint
mode (per_layer included: Note [Recompute per layer]) x a memory limit: one for every device or one each, a factor between
0.3x and 3x of the unconstrained plan's simulated peak (Note [The memory
sweep's range]), or the least one limit that plan_pipeline accepts (found by
bisection, so that a plan's peak may sit at its limit). Per configuration:

* ``plan_pipeline(..., memory=limit)`` either refuses with
  PlanDoesNotFitError, raised while planning (nothing has run), or returns a
  plan;
* the plan's Program runs one step on CPU worker devices with
  ``measure_memory=True``, and every device's measured peak
  (runtime/memory_meter.h, Note [Measured memory]) is at most its limit.

A schedule that needs more stages than the step has layers (interleaved and
zb-v cut devices x virtual_stages stages) is refused with a ConfigError
before any limit applies: counted apart ("config"), not a failure. Anything
else raised, or a measured peak over its limit, is a failure, named with
its seed.

CI runs a fixed 60 configurations. By hand, the long sweep (bench/RESULTS.md,
"Peak memory per device: measured against simulated"):

    MODELPAR_MEMORY_SWEEP=200 pytest tests/python/test_memory_limit_sweep.py -q -s

or ``python tests/python/test_memory_limit_sweep.py --count 200 [--base S]``,
which prints the same counts. ``MODELPAR_MEMORY_SWEEP_BASE`` shifts the
seeds; ``MODELPAR_MEMORY_SWEEP_SEED=<seed>`` replays one configuration.
"""

from __future__ import annotations

import dataclasses
import os
import random
import time
from dataclasses import dataclass
from pathlib import Path

import pytest
import torch

import modelpar
from test_fuzz_plans import chain_inputs, random_chain

ROOT = Path(__file__).resolve().parents[2]
SKIP_STEP = ROOT / "examples/ir/skip_step_symbolic.txt"
SCHEDULES = ("gpipe", "1f1b", "1f1b*", "interleaved", "zb-h1", "zb-v")
CHECKPOINTS = ("always", "except_last", "never", "per_layer")
SALT = 3_000_000
# Note [The memory sweep's range]
# The limit per device is a factor in [LOW, HIGH] of the unconstrained plan's
# simulated peak on it. Not only 0.3-1.2: 1F1B* and MadPipe plans are
# still held to the partitioners' memory model (stageMemory in
# passes/pipeline/partition.cpp), which counts each stage's weights
# weight_copies = 3 times (MadPipe's two versions and a gradient) plus the
# activations of every micro-batch it may hold, about twice the simulated
# peak of these small steps; below that they are refused by the partition,
# before the simulation (a conservative refusal, typed, before launch). The
# other schedules are held to the simulated peak alone (Note [The simulated
# peak decides], plan_pipeline.cpp). Up to 3x, about half the draws get a
# plan, some of them at a limit near the simulated peak, where a meter above
# the simulation would show.
LOW, HIGH = 0.3, 3.0

COUNT = int(os.environ.get("MODELPAR_MEMORY_SWEEP", "60"))
BASE = int(os.environ.get("MODELPAR_MEMORY_SWEEP_BASE", "0"))
ONLY = os.environ.get("MODELPAR_MEMORY_SWEEP_SEED")


def skip_step_inputs(batch: int, seed: int) -> list[torch.Tensor]:
    """x, y, w1..w4 of examples/ir/skip_step_symbolic.txt."""
    g = torch.Generator().manual_seed(seed)
    return [torch.randn(batch, 16, generator=g), torch.randn(batch, 4, generator=g),
            torch.randn(16, 32, generator=g) * 0.3, torch.randn(32, 32, generator=g) * 0.2,
            torch.randn(32, 32, generator=g) * 0.2, torch.randn(32, 4, generator=g) * 0.3]


@dataclass
class SweepCase:
    seed: int
    step: str           # "skip" or "chain<seed>"
    text: str | Path    # the graph text, or the skip step's path
    inputs: list[torch.Tensor]
    batch: int
    devices: int
    microbatches: int
    schedule: str
    virtual_stages: int
    partition: str
    checkpoint: str
    portals: bool
    factors: list[float]  # limit / unconstrained simulated peak, one per device
    limit_mode: str       # "one": one limit for all, "per-device": a list, "tightest":
                          # the least one limit plan_pipeline accepts (bisection)

    @property
    def per_device(self) -> bool:
        return self.limit_mode == "per-device"

    def options(self) -> dict:
        return dict(devices=self.devices, microbatches=self.microbatches, batch_size=self.batch,
                    schedule=self.schedule, virtual_stages=self.virtual_stages,
                    partition=self.partition, checkpoint=self.checkpoint, portals=self.portals)

    def describe(self) -> str:
        return (f"memory sweep seed {self.seed} (replay: MODELPAR_MEMORY_SWEEP_SEED={self.seed}), "
                f"step {self.step}, {self.options()}, limit factors "
                f"{[round(f, 3) for f in self.factors]} ({self.limit_mode})")


def sweep_case(seed: int) -> SweepCase:
    rng = random.Random(seed)
    schedule = SCHEDULES[seed % len(SCHEDULES)]  # every schedule equally often
    # Small batches, where the weights weigh as much as the activations, and
    # large ones, where the activations of the micro-batches in flight dominate.
    large = rng.random() < 0.5
    if rng.random() < 0.3:
        batch = rng.randint(64, 512) if large else rng.randint(4, 64)
        step, text = "skip", SKIP_STEP
        inputs = skip_step_inputs(batch, seed)
    else:
        rc = random_chain(seed)
        if large:  # the step's batch is symbolic: any size runs
            rc = dataclasses.replace(rc, batch=rng.randint(16, 256))
        batch = rc.batch
        step, text, inputs = f"chain{seed}", rc.text, chain_inputs(rc)
    virtual = {"interleaved": rng.choice([2, 2, 3]), "zb-v": 2}.get(schedule, 1)
    devices = rng.randint(2, 4) if virtual == 1 else rng.choice([2, 2, 3])
    # interleaved and zb-v cut exactly devices x v stages only with these two
    # (balance-time-comm and madpipe may leave out cuts: a ConfigError).
    partitions = ["balance-time", "balance-size"]
    if virtual == 1:
        partitions.append("balance-time-comm")
        if schedule == "1f1b*":
            partitions.append("madpipe")
    factors = [rng.uniform(LOW, HIGH) for _ in range(devices)]
    limit_mode = rng.choices(["one", "per-device", "tightest"], weights=[2, 2, 1])[0]
    return SweepCase(seed, step, text, inputs, batch, devices,
                     microbatches=rng.randint(1, min(batch, 8)), schedule=schedule,
                     virtual_stages=virtual, partition=rng.choice(partitions),
                     checkpoint=rng.choice(CHECKPOINTS), portals=rng.random() < 0.5,
                     factors=factors, limit_mode=limit_mode)


@dataclass
class Outcome:
    kind: str                  # "fit", "does_not_fit", "config"
    stage: str = ""            # a refusal's pass: "partition" or "simulated peak"
    conservative: bool = False  # refused although the unconstrained peaks fit the limits
    limits: list[int] | None = None
    simulated: list[int] | None = None
    measured: list[int] | None = None
    detail: str = ""


def tightest_limit(graph, case: SweepCase, peak: int) -> int:
    """The least limit for every device (to 1 %) under which plan_pipeline
    returns a plan: there a simulated peak may sit right at the limit."""
    def fits(limit: int) -> bool:
        try:
            modelpar.plan_pipeline(graph, **case.options(), memory=limit)
            return True
        except modelpar.PlanDoesNotFitError:
            return False
    lo, hi = int(0.3 * peak), int(4 * peak)  # lo refused (below the simulated peak)
    if not fits(hi):
        return hi
    while hi - lo > max(1, hi // 100):
        mid = (lo + hi) // 2
        if fits(mid):
            hi = mid
        else:
            lo = mid
    return hi


def check_case(case: SweepCase) -> Outcome:
    """Plans without a limit, draws the limit, plans with it and runs what fits.
    Raises AssertionError on a violation (with the case described)."""
    where = case.describe()
    graph = modelpar.parse_graph(case.text) if isinstance(case.text, str) else case.text
    try:
        free = modelpar.plan_pipeline(graph, **case.options())
    except modelpar.ConfigError as e:
        # Only a step with fewer layers than the schedule's stages may be refused.
        assert "cannot be cut into" in str(e), f"{where}\nConfigError: {e}"
        return Outcome("config", detail=str(e).splitlines()[0])
    peaks = [int(p) for p in free.peak_bytes]
    if case.limit_mode == "tightest":
        limits = [tightest_limit(graph, case, max(peaks))] * case.devices
    elif case.per_device:
        limits = [max(1, int(f * p)) for f, p in zip(case.factors, peaks)]
    else:
        limits = [max(1, int(case.factors[0] * max(peaks)))] * case.devices
    memory = limits if case.per_device else limits[0]
    try:
        plan = modelpar.plan_pipeline(graph, **case.options(), memory=memory)
    except modelpar.PlanDoesNotFitError as e:
        first = str(e).splitlines()[0]
        stage = "simulated peak" if "simulated peak" in first else "partition"
        return Outcome("does_not_fit", limits=limits, simulated=peaks, detail=first, stage=stage,
                       conservative=all(p <= lim for p, lim in zip(peaks, limits)))
    except Exception as e:  # noqa: BLE001 - a refusal of another type is a failure
        raise AssertionError(f"{where}, limits {limits} B (unconstrained peaks {peaks} B): "
                             f"refused with {type(e).__name__}, not PlanDoesNotFitError: {e}") from e
    simulated = [int(p) for p in plan.peak_bytes]
    assert all(s <= lim for s, lim in zip(simulated, limits)), (
        f"{where}: planned with simulated peaks {simulated} B over the limits {limits} B")
    ex = modelpar.Executor(plan.program, device_map="cpu-workers", threads_per_device=1,
                           measure_memory=True)
    ex.run(case.inputs)
    report = ex.memory_report()
    # MadPipe and balance-time-comm may use fewer devices than asked for.
    assert report["steps"] == 1 and len(report["devices"]) == len(simulated) <= case.devices, where
    measured = [d["peak_bytes"] for d in report["devices"]]
    for d, (got, lim, sim) in enumerate(zip(measured, limits, simulated)):
        assert got <= lim, (f"{where}: device {d} measured a peak of {got} B over its limit "
                            f"{lim} B (simulated {sim} B)\n{plan.summary()}")
    return Outcome("fit", limits=limits, simulated=simulated, measured=measured)


def sweep(seeds: list[int], verbose: bool = False) -> dict:
    counts = {"fit": 0, "does_not_fit": 0, "config": 0}
    per_schedule: dict[str, dict[str, int]] = {s: dict(counts) for s in SCHEDULES}
    refused_by = {"partition": 0, "simulated peak": 0}
    conservative = 0  # refusals whose unconstrained plan fits the limits
    worst_limit = 0.0      # largest measured / limit over every device run
    near_limit = 0         # plans run with some device at >= 95 % of its limit
    sim_ratios: list[float] = []  # measured / simulated, per device run
    start = time.monotonic()
    for seed in seeds:
        case = sweep_case(seed)
        try:
            out = check_case(case)
        except AssertionError:
            raise
        except Exception as e:  # noqa: BLE001 - anything else is a sweep failure too
            raise AssertionError(f"{case.describe()} raised {type(e).__name__}: {e}") from e
        counts[out.kind] += 1
        per_schedule[case.schedule][out.kind] += 1
        if out.kind == "does_not_fit":
            refused_by[out.stage] += 1
            conservative += out.conservative
        if out.kind == "fit":
            ratios = [m / lim for m, lim in zip(out.measured, out.limits)]
            worst_limit = max(worst_limit, *ratios)
            near_limit += max(ratios) >= 0.95
            sim_ratios += [m / s for m, s in zip(out.measured, out.simulated)]
        if verbose:
            print(f"seed {seed}: {case.schedule} v={case.virtual_stages} {case.step} "
                  f"checkpoint={case.checkpoint} -> {out.kind} {out.measured or ''} "
                  f"{out.limits or ''} {out.detail}")
    return {"configs": len(seeds), **counts, "exceeded": 0, "per_schedule": per_schedule,
            "does_not_fit_by": refused_by, "conservative_refusals": conservative,
            "largest_measured_over_limit": worst_limit, "plans_within_5pct_of_limit": near_limit,
            "measured_over_simulated": (min(sim_ratios), max(sim_ratios)) if sim_ratios else None,
            "devices_run": len(sim_ratios), "seconds": time.monotonic() - start}


def seeds_for(count: int, base: int) -> list[int]:
    if ONLY is not None:
        return [int(ONLY)]
    return [SALT + base + k for k in range(count)]


def test_memory_limits_are_honoured_or_refused_before_launch() -> None:
    result = sweep(seeds_for(COUNT, BASE))
    print(f"\nmemory sweep: {result}")
    if ONLY is None and COUNT >= 12:
        # The draw must exercise both sides of the limit.
        assert result["fit"] > 0 and result["does_not_fit"] > 0, result


def test_interleaved_with_more_stages_than_layers_is_a_config_error() -> None:
    """The one refusal that is not about memory: interleaved on 3 devices x 3
    virtual stages needs 9 stages; the skip step has 5 layers."""
    with pytest.raises(modelpar.ConfigError, match="cannot be cut into"):
        modelpar.plan_pipeline(SKIP_STEP, devices=3, microbatches=2, batch_size=8,
                               schedule="interleaved", virtual_stages=3, memory="1GiB")


if __name__ == "__main__":
    import argparse
    ap = argparse.ArgumentParser(description="the long memory-limit sweep (issue 35)")
    ap.add_argument("--count", type=int, default=200)
    ap.add_argument("--base", type=int, default=0)
    ap.add_argument("-v", "--verbose", action="store_true")
    args = ap.parse_args()
    r = sweep(seeds_for(args.count, args.base), verbose=args.verbose)
    for k, v in r.items():
        print(f"{k}: {v}")
