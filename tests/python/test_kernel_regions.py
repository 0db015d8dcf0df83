"""Kernel regions compiled by Inductor (issue 38, ``kernels="inductor"``;
Note [Kernel regions] in modelpar/kernels/regions.py): a program's runs
between transfers become single nodes and train like eager on one device,
placed and pipelined; random ops stay op by op and draw as without regions;
a region Inductor cannot compile runs op by op and says why.

Inductor compiles each distinct region once per process (a few seconds on
a 2-core machine), so these models are small and few.
"""

from __future__ import annotations

import copy

import pytest
import torch

import modelpar
from modelpar import _C
from modelpar.errors import ConfigError
from modelpar.planning.options import resolve_options
from ci_sample import full_only
from tolerances import Compiled

pytestmark = pytest.mark.skipif(not hasattr(_C, "fuse_kernel_regions"),
                                reason="modelpar built without passes/")


class _Block(torch.nn.Module):
    def __init__(self, width: int, dropout: float = 0.0) -> None:
        super().__init__()
        self.fc1 = torch.nn.Linear(width, 2 * width)
        self.fc2 = torch.nn.Linear(2 * width, width)
        self.norm = torch.nn.LayerNorm(width)
        self.drop = torch.nn.Dropout(dropout)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x + self.drop(self.fc2(torch.nn.functional.gelu(self.fc1(self.norm(x)))))


def _model(width: int = 16, dropout: float = 0.0) -> torch.nn.Module:
    torch.manual_seed(0)
    return torch.nn.Sequential(_Block(width, dropout), _Block(width, dropout),
                               torch.nn.Linear(width, 4))


def _train(model: torch.nn.Module, step, x: torch.Tensor, y: torch.Tensor, steps: int):
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    losses = []
    for _ in range(steps):
        loss = step(x, y)
        loss.backward()
        opt.step()
        opt.zero_grad()
        losses.append(loss.detach())
    return losses


# Two blocks of (norm, fc1, gelu, fc2, add) and a head: depth 5 forward and
# backward; the longest sum is the batch (16) or the hidden width (32).
TOL = Compiled(reduction=32, depth=10)

MODES = {
    "one device": {},
    "placed on 2": {"devices": 2},
    "1f1b on 2": {"devices": 2, "pipeline": {"schedule": "1f1b", "microbatches": 2}},
}


# CI: one device and the pipeline; placed by hand (MODELPAR_TEST_FULL=1).
@pytest.mark.parametrize("mode", ["one device", full_only("placed on 2"), "1f1b on 2"])
def test_trains_like_eager(mode: str) -> None:
    base = _model()
    x = torch.randn(16, 16, generator=torch.Generator().manual_seed(1))
    y = torch.randn(16, 4, generator=torch.Generator().manual_seed(2))
    eager = copy.deepcopy(base)
    ours = copy.deepcopy(base)
    mse = torch.nn.functional.mse_loss
    expected = _train(eager, lambda a, b: mse(eager(a), b), x, y, steps=2)
    step = torch.compile(lambda a, b: mse(ours(a), b), backend="modelpar",
                         options={**MODES[mode], "kernels": "inductor"})
    got = _train(ours, step, x, y, steps=2)
    for k, (g, e) in enumerate(zip(got, expected)):
        TOL.after(k + 1).assert_close(g, e, msg=lambda m: f"{mode}, loss of step {k}: {m}")
    for (name, p), q in zip(ours.named_parameters(), eager.parameters()):
        TOL.after(2).assert_close(p.detach(), q.detach(), msg=lambda m: f"{mode}, {name}: {m}")

    plan = modelpar.plans()[-1]
    reports = [r for _, r in plan.kernel_regions]
    assert reports, plan.summary()
    regions = [r for report in reports for r in report.regions]
    assert all(r.failure is None for r in regions), plan.summary()
    # Every region ran compiled code, and most nodes are in regions.
    assert all(r.compiled for r in regions)
    fused = sum(len(r.nodes) for r in regions)
    total = sum(report.num_nodes for report in reports)
    assert fused >= 0.75 * total, plan.summary()
    assert "kernels: inductor" in plan.summary()
    if "1f1b" in mode:
        # The micro-batches of a stage share compiled artifacts.
        assert reports[0].compiled_artifacts < len(reports[0].regions), plan.summary()


def test_random_ops_stay_op_by_op_and_draw_as_without_regions() -> None:
    base = _model(width=12, dropout=0.25)
    x = torch.randn(8, 12, generator=torch.Generator().manual_seed(3))
    outs = {}
    for kernels in ("aten", "inductor"):
        model = copy.deepcopy(base)
        fn = torch.compile(lambda a: model(a).sum(), backend="modelpar",
                           options={"kernels": kernels})
        torch.manual_seed(7)
        outs[kernels] = fn(x)
        plan = modelpar.plans()[-1]
    Compiled(reduction=24, depth=5).assert_close(outs["inductor"], outs["aten"])
    report = plan.kernel_regions[0][1]
    assert any("random" in why for why in report.op_by_op), report.summary()
    assert report.regions


def test_a_region_inductor_cannot_compile_runs_op_by_op_and_says_why(monkeypatch) -> None:
    def refuse(gm, examples, options=None):
        raise RuntimeError("no C++ compiler here\nsecond line")

    monkeypatch.setattr(torch._inductor, "compile", refuse)
    base = _model(width=10)
    x = torch.randn(4, 10, generator=torch.Generator().manual_seed(4))
    model = copy.deepcopy(base)
    fn = torch.compile(lambda a: model(a), backend="modelpar", options={"kernels": "inductor"})
    with torch.no_grad():
        got = fn(x)
        expected = base(x)
    Compiled(reduction=20, depth=5).assert_close(got, expected)
    summary = modelpar.plans()[-1].summary()
    assert "runs op by op: RuntimeError: no C++ compiler here" in summary, summary
    assert "second line" not in summary
    assert "0 compiled artifacts" in summary, summary


def test_executor_runs_a_program_of_regions_over_two_devices() -> None:
    program = modelpar.parse_program("""program devices=2
graph @g(%x: f32[4, 8] input {device=0}, %w: f32[8, 8] param {device=0}, %v: f32[4, 8] param {device=1}) {
  %a: f32[4, 8] = aten::mm(%x, %w) {device=0}
  %b: f32[4, 8] = aten::tanh(%a) {device=0}
  %c: f32[4, 8] = aten::mul.Tensor(%b, 3.0) {device=0}
  %d: f32[4, 8] = aten::add.Tensor(%c, %v) {device=1}
  %e: f32[4, 8] = aten::sigmoid(%d) {device=1}
  return %e, %a
}
device 0 {
  run %a
  run %b
  run %c
  send %c -> 1
}
device 1 {
  recv %c <- 0
  run %d
  run %e
}
""")
    g = torch.Generator().manual_seed(5)
    inputs = [torch.randn(4, 8, generator=g), torch.randn(8, 8, generator=g),
              torch.randn(4, 8, generator=g)]
    expected = modelpar.Executor(program).run(inputs)
    ex = modelpar.Executor(program, kernels="inductor")
    got = ex.run(inputs)
    for a, b in zip(got, expected):
        Compiled(reduction=8, depth=2).assert_close(a, b)
    report = ex.kernel_regions
    assert [len(r.nodes) for r in report.regions] == [3, 2]
    assert report.regions[0].ops == ["aten::mm", "aten::tanh", "aten::mul.Tensor"]
    assert report.op_by_op == {}
    with pytest.raises(ConfigError, match="kernels must be 'aten' or 'inductor'"):
        modelpar.Executor(program, kernels="triton")


def test_the_option_takes_aten_or_inductor() -> None:
    assert resolve_options({}).kernels == "aten"
    assert resolve_options({"kernels": "inductor"}).kernels == "inductor"
    with pytest.raises(ConfigError, match="kernels='tvm' is not valid; kernels takes one of "
                                          "'aten', 'inductor'"):
        resolve_options({"kernels": "tvm"})
