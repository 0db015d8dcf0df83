"""modelpar.plan_pipeline end to end on CPU worker devices: every pipelined
Program (GPipe / 1F1B / 1F1B* / interleaved 1F1B / ZB-H1 / ZB-V, each checkpoint mode, with
and without portals, every partition method) computes exactly what the
unsplit step computes, and the example step's hand-written backward equals
autograd."""

from __future__ import annotations

import itertools
import json
from pathlib import Path

import pytest
import torch

import modelpar
from tolerances import Reordered

ROOT = Path(__file__).resolve().parents[2]
STEP = ROOT / "examples/ir/skip_step_symbolic.txt"
# Micro-batches and stages reorder the step's sums (tests/python/tolerances.py): the skip
# step is 16 -> 32 -> 32 -> 4 wide on batches up to 16, 4 layers forward and backward.
TOL = Reordered(32, depth=8)


def inputs(batch: int, seed: int = 0) -> list[torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    return [torch.randn(batch, 16, generator=g), torch.randn(batch, 4, generator=g),
            torch.randn(16, 32, generator=g) * 0.3, torch.randn(32, 32, generator=g) * 0.2,
            torch.randn(32, 32, generator=g) * 0.2, torch.randn(32, 4, generator=g) * 0.3]


def reference(batch: int, seed: int = 0) -> list[torch.Tensor]:
    return modelpar.run_graph(modelpar.ir.load_graph(STEP), inputs(batch, seed))


def run_pipelined(plan, batch: int, seed: int = 0) -> list[torch.Tensor]:
    ex = modelpar.Executor(plan.program, device_map="cpu-workers", threads_per_device=1)
    return ex.run(inputs(batch, seed))


def assert_same(got: list, want: list) -> None:
    assert len(got) == len(want)
    for i, (a, b) in enumerate(zip(got, want)):
        TOL.assert_close(a, b, msg=lambda m, i=i: f"output {i}: {m}")


def test_example_step_backward_equals_autograd() -> None:
    x, y, *ws = inputs(8)
    ws = [w.clone().requires_grad_(True) for w in ws]
    h1 = torch.relu(x @ ws[0])
    h2 = torch.relu(h1 @ ws[1])
    h3 = torch.relu(h2 @ ws[2]) + h1
    p = h3 @ ws[3]
    loss = torch.nn.functional.mse_loss(p, y)
    loss.backward()
    got = reference(8)
    torch.testing.assert_close(got[0], loss.detach())
    torch.testing.assert_close(got[1], p.detach())
    for w, new in zip(ws, got[2:]):
        TOL.assert_close(new, w.detach() - 0.1 * w.grad)


@pytest.mark.parametrize("schedule,checkpoint,portals", list(itertools.product(
    ["gpipe", "1f1b", "1f1b*"], ["always", "except_last", "never"], [True, False])))
def test_pipelined_step_equals_the_unsplit_step(schedule: str, checkpoint: str,
                                                portals: bool) -> None:
    plan = modelpar.plan_pipeline(STEP, devices=4, microbatches=4, batch_size=8,
                                  schedule=schedule, checkpoint=checkpoint, portals=portals)
    assert plan.num_stages == 4 and plan.microbatch_sizes == [2, 2, 2, 2]
    assert_same(run_pipelined(plan, 8), reference(8))


@pytest.mark.parametrize("microbatches,batch", [(4, 8), (1, 8), (5, 10)])
@pytest.mark.parametrize("checkpoint,portals", [("except_last", True), ("never", False)])
def test_interleaved_step_equals_the_unsplit_step(microbatches: int, batch: int, checkpoint: str,
                                                  portals: bool) -> None:
    """Interleaved 1F1B: the 5 layers cut into 2 devices x 2 virtual stages
    placed looping; one micro-batch (fewer than devices) and 5 (rounds of 3
    and 2) too."""
    plan = modelpar.plan_pipeline(STEP, devices=2, microbatches=microbatches, batch_size=batch,
                                  schedule="interleaved", checkpoint=checkpoint, portals=portals)
    assert (plan.num_stages, plan.stage_device, plan.virtual_stages) == (4, [0, 1, 0, 1], 2)
    assert "schedule interleaved (v=2 stages per device, placed looping)" in str(plan)
    assert_same(run_pipelined(plan, batch), reference(batch))


@pytest.mark.parametrize("microbatches,batch", [(4, 8), (1, 8), (5, 10)])
@pytest.mark.parametrize("checkpoint,portals", [("always", True), ("never", False)])
def test_zb_h1_step_equals_the_unsplit_step(microbatches: int, batch: int, checkpoint: str,
                                            portals: bool) -> None:
    """ZB-H1: backwards split into B and W (W's deferred, gradient sums in
    micro-batch order); one micro-batch (fewer than devices) and 5 too; the
    same stages as 1F1B and a shorter simulated step."""
    plan = modelpar.plan_pipeline(STEP, devices=4, microbatches=microbatches, batch_size=batch,
                                  schedule="zb-h1", checkpoint=checkpoint, portals=portals)
    assert plan.num_stages == 4 and plan.schedule == "zb-h1"
    assert_same(run_pipelined(plan, batch), reference(batch))
    one = modelpar.plan_pipeline(STEP, devices=4, microbatches=microbatches, batch_size=batch,
                                 schedule="1f1b", checkpoint=checkpoint, portals=portals)
    assert plan.stage_device == one.stage_device
    if microbatches > 1:
        assert plan.step_time_us < one.step_time_us


@pytest.mark.parametrize("microbatches,batch", [(4, 8), (1, 8), (5, 10)])
@pytest.mark.parametrize("checkpoint,portals", [("always", True), ("never", False)])
def test_zb_v_step_equals_the_unsplit_step(microbatches: int, batch: int, checkpoint: str,
                                           portals: bool) -> None:
    """ZB-V: the 5 layers cut into 4 stages placed in a V on 2 devices
    (device 0 holds the first and the last), backwards split into B and W;
    one micro-batch (fewer than devices) and 5 too; the step equals the
    unsplit step's, and its simulated step is shorter than 1F1B's."""
    plan = modelpar.plan_pipeline(STEP, devices=2, microbatches=microbatches, batch_size=batch,
                                  schedule="zb-v", checkpoint=checkpoint, portals=portals)
    assert (plan.num_stages, plan.stage_device, plan.virtual_stages) == (4, [0, 1, 1, 0], 2)
    assert "schedule zb-v (v=2 stages per device, placed in a V)" in str(plan)
    assert_same(run_pipelined(plan, batch), reference(batch))
    one = modelpar.plan_pipeline(STEP, devices=2, microbatches=microbatches, batch_size=batch,
                                 schedule="1f1b", checkpoint=checkpoint, portals=portals)
    assert plan.step_time_us < one.step_time_us


@pytest.mark.parametrize("partition,schedule", [("balance-size", "gpipe"), ("balance-time-comm", "1f1b"),
                                                ("madpipe", "1f1b*")])
def test_every_partition_method_runs_exactly(partition: str, schedule: str) -> None:
    plan = modelpar.plan_pipeline(STEP, devices=3, microbatches=4, batch_size=10,
                                  schedule=schedule, partition=partition)
    assert plan.microbatch_sizes == [3, 3, 3, 1]  # torch.chunk's rule, uneven last
    assert plan.partition_method == partition
    assert_same(run_pipelined(plan, 10, seed=1), reference(10, seed=1))


def test_madpipe_periodic_pattern_is_executed_and_exact() -> None:
    """MadPipe puts stages 0 and 2 on device 0 here: its phase-2 pattern
    orders that device (schedule's Note [Lowering the periodic pattern]) and
    the program still computes the unsplit step."""
    plan = modelpar.plan_pipeline(STEP, devices=2, microbatches=4, batch_size=16,
                                  schedule="1f1b*", partition="madpipe")
    assert plan.stage_device == [0, 1, 0]
    assert "MadPipe's periodic pattern" in str(plan)
    assert_same(run_pipelined(plan, 16, seed=2), reference(16, seed=2))


def test_same_program_runs_new_inputs_every_step() -> None:
    plan = modelpar.plan_pipeline(STEP, devices=2, microbatches=8, batch_size=16, schedule="1f1b")
    ex = modelpar.Executor(plan.program, device_map="cpu-workers", threads_per_device=1)
    for seed in range(3):
        assert_same(ex.run(inputs(16, seed)), reference(16, seed))


def test_summary_trace_and_numbers(tmp_path: Path) -> None:
    trace = tmp_path / "pipe.json"
    plan = modelpar.plan_pipeline(STEP, devices=4, microbatches=8, batch_size=8, trace=trace)
    text = str(plan)
    assert "4 stages on 4 devices, 8 micro-batches of 1, schedule gpipe" in text
    assert "stage 0 on device 0" in text and "bubble" in text
    assert plan.ideal_speedup == pytest.approx(4 * 8 / 11)
    assert 0 < plan.bubble_fraction < 1
    assert list(plan.stage_of_layer) == ["l1", "l2", "l3", "l4", "loss"]
    events = json.loads(trace.read_text())["traceEvents"]
    assert {e.get("pid") for e in events if e.get("ph") == "X"} >= {0, 1, 2, 3}


def test_errors_name_the_problem() -> None:
    with pytest.raises(modelpar.ConfigError, match="schedule='zigzag' is not valid"):
        modelpar.plan_pipeline(STEP, devices=2, microbatches=2, batch_size=8, schedule="zigzag")
    with pytest.raises(modelpar.ConfigError, match="microbatches=9 is more than the batch size 8"):
        modelpar.plan_pipeline(STEP, devices=2, microbatches=9, batch_size=8)
    with pytest.raises(modelpar.ConfigError, match="dynamic=True"):
        modelpar.plan_pipeline(ROOT / "examples/ir/mlp_step.txt", devices=2, microbatches=2,
                               batch_size=8)
    with pytest.raises(modelpar.PlanDoesNotFitError, match="KiB"):
        modelpar.plan_pipeline(STEP, devices=2, microbatches=2, batch_size=8, memory=4096)
    with pytest.raises(modelpar.ConfigError, match="devices=0 is not valid"):
        modelpar.plan_pipeline(STEP, devices=0, microbatches=2, batch_size=8)
    with pytest.raises(modelpar.ConfigError, match="virtual_stages=2 needs schedule='interleaved'"):
        modelpar.plan_pipeline(STEP, devices=2, microbatches=2, batch_size=8, virtual_stages=2)
    with pytest.raises(modelpar.ConfigError, match="virtual_stages=True is not valid; "
                                                   "virtual_stages takes an int >= 0"):
        modelpar.plan_pipeline(STEP, devices=2, microbatches=2, batch_size=8,
                               schedule="interleaved", virtual_stages=True)
    with pytest.raises(modelpar.ConfigError, match="has 5 layers, so it cannot be cut into "
                                                   "devices=2 x virtual_stages=3 = 6 stages"):
        modelpar.plan_pipeline(STEP, devices=2, microbatches=2, batch_size=8,
                               schedule="interleaved", virtual_stages=3)


@pytest.mark.parametrize("schedule", ["gpipe", "1f1b"])
def test_deferred_batch_norm_pipeline_updates_running_stats_from_the_whole_batch(
        schedule: str) -> None:
    from test_microbatch import BN_STEP, bn_inputs
    step = modelpar.parse_graph(BN_STEP)
    with pytest.raises(modelpar.UnsupportedOpError, match="batch_norm"):
        modelpar.plan_pipeline(step, devices=2, microbatches=2, batch_size=8)
    plan = modelpar.plan_pipeline(step, devices=2, microbatches=4, batch_size=8,
                                  schedule=schedule, batch_norm="deferred")
    torch.manual_seed(3)
    xs = bn_inputs(8)
    got = modelpar.Executor(plan.program, device_map="cpu-workers", threads_per_device=1).run(xs)
    split = modelpar.microbatch(step, microbatches=4, batch_size=8, batch_norm="deferred")
    assert_same(got, modelpar.run_graph(split, xs))
    rm, rv = xs[4].clone(), xs[5].clone()
    torch.nn.functional.batch_norm(xs[0], rm, rv, xs[2], xs[3], training=True, momentum=0.1)
    TOL.assert_close(got[2], rm)  # %rm2
    TOL.assert_close(got[3], rv)  # %rv2


@pytest.mark.parametrize("checkpoint", ["always", "never"])
def test_split_gpipe_step_run_in_two_calls_equals_the_unsplit_step(checkpoint: str) -> None:
    """splitPhases (passes/pipeline/split_phases.h): the forward part, then the
    backward part fed the carried values, give the step's outputs."""
    from modelpar import _C
    plan = modelpar.plan_pipeline(modelpar.ir.load_graph(STEP), devices=4, microbatches=4,
                                  batch_size=8, schedule="gpipe", checkpoint=checkpoint)
    first, second, carried = _C.split_phases(plan)
    names = list(modelpar.ir.load_graph(STEP).input_names)
    values = dict(zip(names, inputs(8)))
    ex1 = modelpar.Executor(first, device_map="cpu-workers", threads_per_device=1)
    out1 = dict(zip(first.graph.output_names, ex1.run([values[n] for n in first.graph.input_names])))
    assert set(carried) <= set(out1)
    values.update(out1)
    ex2 = modelpar.Executor(second, device_map="cpu-workers", threads_per_device=1)
    out2 = dict(zip(second.graph.output_names,
                    ex2.run([values[n] for n in second.graph.input_names])))
    got = {**out1, **out2}
    want = reference(8)
    step_outputs = list(modelpar.ir.load_graph(STEP).output_names)
    assert_same([got[n] for n in step_outputs], want)
