"""Executor(measure_memory=True): each device's measured peak (bytes of the
distinct tensor storages its value slots hold, runtime/memory_meter.h Note
[Measured memory]) against the plan's simulated peak (Note [Memory model]),
for every pipeline schedule and checkpoint mode of the IR skip step
(bench/memory_measured_vs_simulated.py prints the same comparison)."""

from __future__ import annotations

import itertools
from pathlib import Path

import pytest
import torch

import modelpar

ROOT = Path(__file__).resolve().parents[2]
STEP = ROOT / "examples/ir/skip_step_symbolic.txt"
# Devices per schedule: interleaved and zb-v put 2 of the 4 stages on each of 2 devices.
DEVICES = {"gpipe": 4, "1f1b": 4, "1f1b*": 4, "interleaved": 2, "zb-h1": 4, "zb-v": 2}

# Tolerance: issue 35's bar, 10 %. Both sides count bytes, not time, so there
# is no noise to allow for: on this step every device measures its simulated
# peak exactly (bench/RESULTS.md). What may still separate them, and why the
# bar is one-sided in spirit: the meter cannot see a run's temporaries
# (Cost::temp_bytes, 0 in these plans), so it may fall below the simulation by
# them, and a kernel that returns its output on a larger buffer than the model
# knows would put it above (Note [Reduced losses keep their element-wise
# buffer] was found this way: 6.6 % over at batch 64 before the fix).
RTOL = 0.10


def inputs(batch: int, seed: int = 0) -> list[torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    return [torch.randn(batch, 16, generator=g), torch.randn(batch, 4, generator=g),
            torch.randn(16, 32, generator=g) * 0.3, torch.randn(32, 32, generator=g) * 0.2,
            torch.randn(32, 32, generator=g) * 0.2, torch.randn(32, 4, generator=g) * 0.3]


def measured_peaks(plan, batch: int) -> list[int]:
    ex = modelpar.Executor(plan.program, device_map="cpu-workers", threads_per_device=1,
                           measure_memory=True)
    ex.run(inputs(batch))
    report = ex.memory_report()
    assert report["steps"] == 1 and len(report["devices"]) == len(plan.peak_bytes)
    return [d["peak_bytes"] for d in report["devices"]]


@pytest.mark.parametrize("schedule,checkpoint", list(itertools.product(
    DEVICES, ["always", "except_last", "never"])))
def test_measured_peak_per_device_is_within_10_percent_of_simulated(schedule: str,
                                                                    checkpoint: str) -> None:
    # Batch 64 in 4 micro-batches: activations (16 x 32 floats, 2 KiB each)
    # weigh as much as the parameters, so the schedule's order shows.
    plan = modelpar.plan_pipeline(STEP, devices=DEVICES[schedule], microbatches=4, batch_size=64,
                                  schedule=schedule, checkpoint=checkpoint)
    simulated = list(plan.peak_bytes)
    measured = measured_peaks(plan, 64)
    for d, (sim, got) in enumerate(zip(simulated, measured)):
        assert abs(got - sim) <= RTOL * sim, (
            f"{schedule}, checkpoint={checkpoint}, device {d}: measured {got} B, simulated {sim} B")


def test_gpipe_keeps_every_loss_buffer_and_the_simulator_counts_it() -> None:
    """GPipe without checkpointing keeps each micro-batch's reduced mse_loss
    until the backward; each holds its [16, 4] buffer (256 B), not 4 B (Note
    [Reduced losses keep their element-wise buffer]). The last device
    measures exactly its simulated peak."""
    plan = modelpar.plan_pipeline(STEP, devices=4, microbatches=4, batch_size=64,
                                  schedule="gpipe", checkpoint="never")
    assert measured_peaks(plan, 64)[3] == plan.peak_bytes[3]


def test_memory_report_counts_steps_and_needs_measure_memory() -> None:
    plan = modelpar.plan_pipeline(STEP, devices=2, microbatches=2, batch_size=8, schedule="1f1b")
    ex = modelpar.Executor(plan.program, device_map="cpu-workers", threads_per_device=1,
                           measure_memory=True)
    assert ex.memory_report() == {"steps": 0, "devices": []}
    ex.run(inputs(8))
    ex.run(inputs(8, seed=1))
    report = ex.memory_report()
    assert report["steps"] == 2
    for d in report["devices"]:
        assert set(d) == {"start_bytes", "peak_bytes", "peak_instruction", "end_bytes"}
        assert 0 < d["start_bytes"] <= d["peak_bytes"] and d["end_bytes"] <= d["peak_bytes"]
        assert d["peak_instruction"] >= -1
    plain = modelpar.Executor(plan.program, device_map="cpu-workers", threads_per_device=1)
    with pytest.raises(modelpar.ConfigError, match="measure_memory"):
        plain.memory_report()


def _gpt_step(options: dict, outside: bool):
    """Two SGD-free steps of the GPT test model compiled with ``options``;
    the record of the step that ran."""
    import sys
    sys.path.insert(0, str(ROOT / "tests/python"))
    from models import CASES
    torch._dynamo.reset()
    modelpar.clear_plans()
    torch.manual_seed(0)
    case = CASES["gpt"]
    model = case.make_model()
    if outside:  # the model alone compiled: two programs, forward and backward
        compiled = torch.compile(model, backend="modelpar", options=options)
        step = lambda x, y: case.loss(compiled(x), y)  # noqa: E731
    else:
        step = torch.compile(lambda x, y: case.loss(model(x), y), backend="modelpar",
                             options=options)
    for seed in range(2):
        step(*case.batch(seed, 8)).backward()
    return next(r for r in modelpar.plans() if r.measured_peak_bytes)


@pytest.mark.parametrize("how", ["1f1b", "gpipe, loss outside", "placed"])
def test_torch_compile_reports_each_devices_measured_peak_beside_the_plans(how: str) -> None:
    """options={"measure_memory": True}: plans() shows what each device held
    at most in any step beside the simulated peak of the programs that ran,
    within issue 35's 10 % on each device of the GPT test model. A 1F1B step
    is one program (measured within bytes of it); GPipe with the loss outside
    and a placed training step run a forward and a backward program each,
    whose simulated peaks plans() shows the larger of, not the joint plan's
    (Note [Saved values cross after the forward]: per device that one is
    off by up to 23 % here, the sum over the devices within 10 %)."""
    options = {"devices": 2, "measure_memory": True}
    if how != "placed":
        options["pipeline"] = {"schedule": how.split(",")[0], "microbatches": 4,
                               "checkpoint": "never"}
    rec = _gpt_step(options, outside=how.endswith("outside"))
    simulated = rec.simulated_peak_bytes
    assert sorted(rec.measured_peak_bytes) == [0, 1]
    measured = [rec.measured_peak_bytes[d] for d in (0, 1)]
    assert "memory per device, measured (most any step held) / simulated: dev0 " in str(rec)
    for d in (0, 1):
        assert measured[d] == pytest.approx(simulated[d], rel=RTOL), (d, measured, simulated)
    if how == "placed":
        joint = list(rec.joint.peak_bytes)
        assert sum(measured) == pytest.approx(sum(joint), rel=RTOL), (measured, joint)
