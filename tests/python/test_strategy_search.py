"""Choosing the plan automatically (issue 17): ``modelpar.search_strategy``
on IR graphs, ``python -m modelpar plan --strategy auto``, and torch.compile's
``strategy="auto"`` / ``mode="max-autotune"``: the chosen candidate is the
simulator's minimum among those that fit, the chosen plan runs and equals
the unsplit step / eager PyTorch, and bad combinations are ConfigErrors."""

from __future__ import annotations

import copy
import json
import math
import subprocess
import sys
import warnings
from pathlib import Path

import pytest
import torch

import modelpar
from models import CASES
from tolerances import Reordered

ROOT = Path(__file__).resolve().parents[2]
STEP = ROOT / "examples/ir/skip_step_symbolic.txt"
# The skip step (16 -> 32 -> 32 -> 4 wide, batch 16, 4 layers forward and backward) placed
# or micro-batched reorders its sums (tests/python/tolerances.py).
STEP_TOL = Reordered(32, depth=8)
# The MLP and GPT test models pipelined or placed: GPT's 128-wide MLP, 34 reductions deep,
# micro-batching also splits the weight gradients' sums over the batch.
TOL = Reordered(128, depth=34)


def _compute_bound_machine(tmp_path: Path) -> str:
    """A machine on which compute dominates: no per-op overhead, 1 GFLOP/s,
    fast links. Pipelines overlap the stages' compute there, and m-ETF cannot
    parallelise a chain, so a pipeline wins the search."""
    path = tmp_path / "compute_bound.json"
    path.write_text(json.dumps({
        "format": "modelpar-machine-v1",
        "devices": [{"name": "slow", "memory_bytes": 1 << 30, "peak_flops": 1e9,
                     "memory_bandwidth_bytes_per_s": 1e12, "launch_overhead_us": 0.0}],
        "default_link": {"latency_us": 0.1, "bandwidth_bytes_per_s": 1e12}, "links": []}))
    return str(path)


def _step_inputs(batch: int) -> list[torch.Tensor]:
    g = torch.Generator().manual_seed(0)
    return [torch.randn(batch, 16, generator=g), torch.randn(batch, 4, generator=g),
            torch.randn(16, 32, generator=g) * 0.3, torch.randn(32, 32, generator=g) * 0.2,
            torch.randn(32, 32, generator=g) * 0.2, torch.randn(32, 4, generator=g) * 0.3]


def _ok(candidates: list[dict]) -> list[dict]:
    return [c for c in candidates if c["status"] == "ok"]


@pytest.mark.parametrize("machine", ["default", "compute_bound"])
def test_search_chooses_the_simulators_minimum_and_its_plan_runs(tmp_path, machine):
    profile = _compute_bound_machine(tmp_path) if machine == "compute_bound" else None
    s = modelpar.search_strategy(STEP, devices=2, batch_size=16, machine=profile, prune=False)
    ok = _ok(s.candidates)
    # m in {2, 4, 8, 16} x (gpipe, 1f1b, zb-h1: 3 partitions; 1f1b*: 4;
    # interleaved v=2 (4 layers) and zb-v: 2, not balance-time-comm) x 4
    # checkpoint modes (per_layer with them)
    assert len(s.candidates) == 1 + 3 + 4 * 17 * 4
    assert len(ok) >= 20
    chosen = s.candidates[s.chosen]
    assert chosen["chosen"] and sum(c["chosen"] for c in s.candidates) == 1
    assert chosen["step_us"] == min(c["step_us"] for c in ok)
    plan = s.pipeline if s.pipeline is not None else s.placement
    assert plan.step_time_us == pytest.approx(chosen["step_us"])
    if machine == "compute_bound":
        assert chosen["kind"] == "pipeline", s.table()
    for c in ok:  # the bound is a lower bound (Note [A lower bound per candidate])
        assert c["step_us"] >= c["lower_bound_us"] * (1 - 1e-9), c
    want = modelpar.run_graph(modelpar.ir.load_graph(STEP), _step_inputs(16))
    ex = modelpar.Executor(plan.program, device_map="cpu-workers", threads_per_device=1)
    got = ex.run(_step_inputs(16))
    for i, (a, b) in enumerate(zip(got, want)):
        STEP_TOL.assert_close(a, b, msg=lambda m, i=i: f"output {i}: {m}")
    # Pruning plans fewer candidates and chooses the same one.
    pruned = modelpar.search_strategy(STEP, devices=2, batch_size=16, machine=profile)
    assert pruned.chosen == s.chosen
    assert len(_ok(pruned.candidates)) <= len(ok)
    # Pruned by the bound, or per_layer where never fits (Note [Recompute per layer]).
    assert all(c["reason"].startswith("bound ") or
               (c["checkpoint"] == "per_layer" and c["reason"].startswith("checkpoint='never' fits"))
               for c in pruned.candidates if c["status"] == "pruned")


def test_one_shared_host_core_leaves_no_plan_faster_than_one_device(tmp_path):
    # Note [Shared host cores]: on the compute-bound machine pipelines win
    # (above); with host_cores=1 every plan's step is at least the compute of
    # all its devices on one core, which is no less than the one-device step
    # (micro-batching adds no compute there: no per-op overhead).
    prof = json.loads(Path(_compute_bound_machine(tmp_path)).read_text())
    prof["host_cores"] = 1
    path = tmp_path / "one_core.json"
    path.write_text(json.dumps(prof))
    s = modelpar.search_strategy(STEP, devices=2, batch_size=16, machine=str(path), prune=False)
    ok = _ok(s.candidates)
    one = next(c for c in ok if c["kind"] == "one-device")
    for c in ok:
        assert c["step_us"] >= one["step_us"] * (1 - 1e-9), c
        assert c["step_us"] >= c["lower_bound_us"] * (1 - 1e-9), c
    assert s.candidates[s.chosen]["step_us"] == pytest.approx(one["step_us"])
    free = modelpar.search_strategy(STEP, devices=2, batch_size=16,
                                    machine=_compute_bound_machine(tmp_path), prune=False)
    assert free.candidates[free.chosen]["step_us"] < 0.9 * one["step_us"], free.table()
    pruned = modelpar.search_strategy(STEP, devices=2, batch_size=16, machine=str(path))
    assert pruned.candidates[pruned.chosen]["step_us"] == pytest.approx(one["step_us"])


def test_microbatch_launch_overhead_applies_to_its_count_only(tmp_path):
    # StrategySearchOptions::microbatch_launch_overhead_us: pipelines of 2
    # micro-batches planned with a 5 us per-op overhead (each micro-batch's
    # copy of a node pays it whole) get slower; those of 4 and the placements
    # keep the machine's (0 us) and their times; the bound stays a bound.
    machine = _compute_bound_machine(tmp_path)
    base = modelpar.search_strategy(STEP, devices=2, batch_size=16, machine=machine, prune=False)
    more = modelpar.search_strategy(STEP, devices=2, batch_size=16, machine=machine, prune=False,
                                    microbatch_launch_us={2: 5.0})
    for a, b in zip(_ok(base.candidates), _ok(more.candidates)):
        assert a["label"] == b["label"]
        assert b["step_us"] >= b["lower_bound_us"] * (1 - 1e-9), b
        if a["kind"] == "pipeline" and a["microbatches"] == 2:
            assert b["step_us"] > a["step_us"] + 5.0, (a, b)
        else:
            assert b["step_us"] == pytest.approx(a["step_us"]), (a, b)
    with pytest.raises(modelpar.ConfigError, match="microbatch_launch_us=.* is not valid"):
        modelpar.search_strategy(STEP, devices=2, batch_size=16, microbatch_launch_us={2: -1.0})


def test_search_errors_name_the_problem():
    with pytest.raises(modelpar.ConfigError, match="batch_size=0 is not valid"):
        modelpar.search_strategy(STEP, devices=2, batch_size=0)
    with pytest.raises(modelpar.ConfigError, match="schedule='zigzag' is not valid"):
        modelpar.search_strategy(STEP, devices=2, batch_size=8, schedules=["zigzag"])
    with pytest.raises(modelpar.PlanDoesNotFitError, match="none of the .* candidates"):
        modelpar.search_strategy(STEP, devices=2, batch_size=8, memory=64)


def _cli(*args: str) -> subprocess.CompletedProcess:
    import os
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)}
    return subprocess.run([sys.executable, "-m", "modelpar", "plan", *args], capture_output=True,
                          text=True, env=env, timeout=120)


def test_cli_strategy_auto_lists_candidates_and_the_chosen_plan(tmp_path):
    trace = tmp_path / "chosen.json"
    r = _cli(str(STEP), "--strategy", "auto", "--devices", "2", "--batch-size", "16",
             "--trace", str(trace))
    assert r.returncode == 0, r.stderr
    assert any(e.get("ph") == "X" for e in json.loads(trace.read_text())["traceEvents"])
    assert "candidate" in r.stdout and "lower bound" in r.stdout
    starred = [line for line in r.stdout.splitlines() if line.startswith("* ")]
    assert len(starred) == 1
    assert "chosen: " + starred[0][2:].split("  ")[0].strip() in r.stdout
    assert "search: 276 candidates" in r.stdout
    r = _cli(str(STEP), "--strategy", "auto")
    assert r.returncode == 1 and "needs --batch-size" in r.stderr
    r = _cli(str(STEP), "--strategy", "best")
    assert r.returncode == 1 and "strategy='best' is not valid" in r.stderr


def test_options_strategy_and_max_autotune(monkeypatch):
    assert modelpar.planning.options.resolve_options({"devices": 2, "strategy": "auto"}).strategy == "auto"
    assert modelpar.planning.options.resolve_options({"devices": 2}).strategy == "manual"
    o = modelpar.planning.options.resolve_options({"devices": 2}, "max-autotune")
    assert o.strategy == "auto" and o.planned and o.whole_step
    with pytest.warns(UserWarning, match="nothing to autotune \\(one device\\)"):
        assert modelpar.planning.options.resolve_options({"devices": 1}, "max-autotune").strategy == "manual"
    monkeypatch.setattr(modelpar.planning.options.os, "cpu_count", lambda: 3)
    o = modelpar.planning.options.resolve_options(None, "max-autotune-no-cudagraphs")  # what torch.compile passes
    assert (o.devices, o.strategy) == (3, "auto")
    with pytest.warns(UserWarning, match="placer picks the plan by hand"):
        o = modelpar.planning.options.resolve_options({"devices": 2, "placer": "m-sct"}, "max-autotune")
    assert o.strategy == "manual" and o.placer == "m-sct"
    with pytest.raises(modelpar.ConfigError, match="strategy='auto' searches .* but "
                                                   "placer='m-etf' picks one by hand"):
        modelpar.planning.options.resolve_options({"devices": 2, "strategy": "auto", "placer": "m-etf"})
    with pytest.raises(modelpar.ConfigError, match="strategy='auto' searches the pipelines' "
                                                   "microbatches.* but pipeline gives microbatches"):
        modelpar.planning.options.resolve_options({"devices": 2, "strategy": "auto",
                                                   "pipeline": {"microbatches": 4}})
    with pytest.raises(modelpar.ConfigError, match="strategy='fast' is not valid; strategy "
                                                   "takes one of 'manual', 'auto'"):
        modelpar.planning.options.resolve_options({"devices": 2, "strategy": "fast"})


def _train(name: str, options: dict, mode: str | None, steps: int, loss_inside: bool):
    case = CASES[name]
    torch._dynamo.reset()
    modelpar.clear_plans()
    torch.manual_seed(0)
    model = case.make_model()
    eager = copy.deepcopy(model)
    opt = torch.optim.SGD(model.parameters(), lr=0.05)
    eager_opt = torch.optim.SGD(eager.parameters(), lr=0.05)
    if loss_inside:
        fast = torch.compile(lambda x, y: case.loss(model(x), y), backend="modelpar",
                             options=options, mode=mode)
    else:
        compiled = torch.compile(model, backend="modelpar", options=options, mode=mode)
        fast = lambda x, y: case.loss(compiled(x), y)  # noqa: E731
    batch = 2 * case.batch_size
    for step in range(steps):
        x, y = case.batch(step, batch)
        loss = fast(x, y)
        loss.backward()
        want = case.loss(eager(x), y)
        want.backward()
        tol = TOL.after(step + 1)
        tol.assert_close(loss, want)
        # A bias before batch norm has a gradient that is zero in exact
        # arithmetic: its rounding noise has the size of the other gradients.
        scale = max(float(q.grad.abs().max()) for q in eager.parameters())
        for (n, p), q in zip(model.named_parameters(), eager.parameters()):
            tol.assert_close(p.grad, q.grad, scale=scale, msg=lambda m, n=n: f"grad of {n}: {m}")
        opt.step(), eager_opt.step(), opt.zero_grad(), eager_opt.zero_grad()
    return modelpar.plans()[-1]


@pytest.mark.parametrize("name", ["mlp", "gpt"])
def test_compiled_auto_equals_eager_and_reports_the_candidates(name):
    plan = _train(name, {"devices": 2, "strategy": "auto", "strict": True}, None, 2, True)
    cands = plan.candidates
    assert cands is not None and sum(c["chosen"] for c in cands) == 1
    chosen = next(c for c in cands if c["chosen"])
    assert chosen["step_us"] == min(c["step_us"] for c in _ok(cands))
    assert plan.simulated_step_us == pytest.approx(chosen["step_us"])
    assert plan.search.seconds > 0
    text = str(plan)
    assert f"strategy: auto, chose {chosen['label']}" in text and "[search]" in text


@pytest.mark.parametrize("machine", ["cpu_profile", "compute_bound"])
def test_auto_with_a_trace_writes_the_chosen_plans_traces(tmp_path, monkeypatch, machine):
    # The search's plans once kept no simulated timeline, and a trace asked for
    # beside strategy="auto" raised ConfigError ("the report has no timeline").
    if machine == "compute_bound":  # the chosen plan is a pipeline there
        monkeypatch.setenv("MODELPAR_CPU_PROFILE", _compute_bound_machine(tmp_path))
    trace = tmp_path / "runs" / "step.json"  # its folder made by modelpar
    plan = _train("mlp", {"devices": 2, "strategy": "auto", "strict": True,
                          "trace": str(trace)}, None, 1, True)
    assert plan.trace_path == str(trace) and trace.exists()
    assert plan.simulated_trace_path == str(tmp_path / "runs" / "step.simulated.json")
    spans = [e for e in json.loads(Path(plan.simulated_trace_path).read_text())["traceEvents"]
             if e.get("ph") == "X"]
    assert spans, "the simulated trace has no spans"
    # The simulated timeline ends where the search's chosen step time does.
    end = max(e["ts"] + e["dur"] for e in spans) - min(e["ts"] for e in spans)
    assert end == pytest.approx(plan.simulated_step_us, rel=1e-3, abs=0.01)
    chosen = next(c for c in plan.candidates if c["chosen"])
    if machine == "compute_bound":
        assert chosen["kind"] == "pipeline", plan.search.table()


def test_max_autotune_picks_a_pipeline_on_a_compute_bound_machine(tmp_path, monkeypatch):
    monkeypatch.setenv("MODELPAR_CPU_PROFILE", _compute_bound_machine(tmp_path))
    # torch.compile takes mode or options: max-autotune plans one device per core.
    monkeypatch.setattr(modelpar.planning.options.os, "cpu_count", lambda: 2)
    plan = _train("mlp", None, "max-autotune", 2, True)
    assert plan.options.devices == 2 and plan.options.strategy == "auto"
    chosen = next(c for c in plan.candidates if c["chosen"])
    assert chosen["kind"] == "pipeline", plan.search.table()
    assert plan.pipeline is not None and plan.joint is None
    assert plan.simulated_step_us == pytest.approx(chosen["step_us"])


def test_auto_with_the_loss_outside_searches_gpipe_pipelines_only(tmp_path, monkeypatch):
    monkeypatch.setenv("MODELPAR_CPU_PROFILE", _compute_bound_machine(tmp_path))
    plan = _train("mlp", {"devices": 2, "strategy": "auto", "strict": True}, None, 2, False)
    assert plan.pipeline_mode == "split"
    assert {c["kind"] for c in plan.candidates} == {"pipeline"}
    assert {c["schedule"] for c in plan.candidates} == {"gpipe"}
    assert not math.isnan(plan.simulated_step_us)


@pytest.mark.parametrize("loss_inside", [True, False])
def test_auto_keeps_eagers_batch_norm_when_asked(tmp_path, monkeypatch, loss_inside):
    # Note [Searched pipelines keep the pipeline option's defaults]: with
    # pipeline={"batch_norm": "refuse"} every pipeline of several
    # micro-batches of the CNN (training-mode batch norm) fails saying why,
    # once in the table, and the chosen plan trains like eager (checked in
    # _train) even on a machine where pipelines win. With the loss outside
    # (GPipe only) a pipeline of one micro-batch is the plan.
    monkeypatch.setenv("MODELPAR_CPU_PROFILE", _compute_bound_machine(tmp_path))
    plan = _train("cnn", {"devices": 2, "strategy": "auto", "strict": True,
                          "pipeline": {"batch_norm": "refuse"}}, None, 2, loss_inside)
    split = [c for c in plan.candidates if c["kind"] == "pipeline" and c["microbatches"] > 1]
    assert split and all(c["status"] == "failed" and "batch norm" in c["reason"] for c in split)
    table = plan.search.table()
    assert table.count(split[0]["reason"]) == 1 and f"[1] {len(split)} candidates (" in table, table
    chosen = next(c for c in plan.candidates if c["chosen"])
    if not loss_inside:
        assert (chosen["kind"], chosen["microbatches"]) == ("pipeline", 1), plan.search.table()


def test_auto_defers_batch_norm_as_the_pipeline_option_does_and_says_so(tmp_path, monkeypatch):
    # By default the searched pipelines are the pipeline option's: batch norm
    # deferred, so the CNN's pipelines of several micro-batches are
    # candidates (all failed before issue 38), and choosing one warns.
    from modelpar.compile.graph_breaks import forget_warnings
    forget_warnings()
    monkeypatch.setenv("MODELPAR_CPU_PROFILE", _compute_bound_machine(tmp_path))
    torch._dynamo.reset()
    modelpar.clear_plans()
    case = CASES["cnn"]
    torch.manual_seed(0)
    model = case.make_model()
    fast = torch.compile(lambda x, y: case.loss(model(x), y), backend="modelpar",
                         options={"devices": 2, "strategy": "auto", "strict": True})
    x, y = case.batch(0, 2 * case.batch_size)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        fast(x, y).backward()
    plan = modelpar.plans()[-1]
    split = [c for c in plan.candidates if c["kind"] == "pipeline" and c["microbatches"] > 1]
    assert split and not any("batch norm" in c["reason"] for c in split), plan.search.table()
    chosen = next(c for c in plan.candidates if c["chosen"])
    said = [str(w.message) for w in caught if "DeferredBatchNorm" in str(w.message)]
    if chosen["kind"] == "pipeline" and chosen["microbatches"] > 1:
        assert len(said) == 1 and "'batch_norm': 'refuse'" in said[0], said
    else:
        assert not said


def test_auto_takes_only_the_pipeline_keys_it_does_not_search():
    with pytest.raises(modelpar.ConfigError,
                       match=r"pipeline gives schedule.*pipeline takes only portals, batch_norm"):
        modelpar.planning.options.resolve_options(
            {"devices": 2, "strategy": "auto", "pipeline": {"schedule": "1f1b", "batch_norm": "refuse"}})
    opts = modelpar.planning.options.resolve_options(
        {"devices": 2, "strategy": "auto", "pipeline": {"batch_norm": "refuse"}})
    assert opts.strategy == "auto" and not opts.pipeline_by_hand
    assert opts.pipeline["batch_norm"] == "refuse"


class _FixedBatch(torch.nn.Module):
    """Writes its batch size into its code: Dynamo keeps the batch static."""

    def __init__(self) -> None:
        super().__init__()
        self.fc1, self.fc2 = torch.nn.Linear(16, 8), torch.nn.Linear(8, 4)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.fc2(torch.relu(self.fc1(x)).reshape(8, 8))


def test_auto_plans_a_static_batch_without_micro_batches():
    # Note [A static batch under strategy="auto"]: the pipeline option refuses
    # such a model (tests/python/test_compile_pipeline.py); auto runs it on a
    # plan without micro-batches and lists why no pipeline was possible.
    model = _FixedBatch()
    eager = copy.deepcopy(model)
    fast = torch.compile(lambda x, y: torch.nn.functional.mse_loss(model(x), y),
                         backend="modelpar", options={"devices": 2, "strategy": "auto",
                                                      "strict": True})
    g = torch.Generator().manual_seed(0)
    x, y = torch.randn(8, 16, generator=g), torch.randn(8, 4, generator=g)
    loss = fast(x, y)
    loss.backward()
    want = torch.nn.functional.mse_loss(eager(x), y)
    want.backward()
    tol = Reordered(16, depth=4)  # 16-wide sums, moved between devices by a placement
    tol.assert_close(loss, want)
    for (n, p), q in zip(model.named_parameters(), eager.parameters()):
        tol.assert_close(p.grad, q.grad, msg=lambda m, n=n: f"grad of {n}: {m}")
    cands = modelpar.plans()[-1].candidates
    chosen = next(c for c in cands if c["chosen"])
    assert chosen["kind"] in ("one-device", "placement") and any(
        c["kind"] == "placement" for c in _ok(cands)), [(c["label"], c["status"]) for c in cands]
    failed = [c for c in cands if c["kind"] == "pipeline"]
    assert failed and all(c["status"] == "failed" and "batch dimension is static" in c["reason"]
                          for c in failed), cands
    # With the loss outside only pipelines split the step at its backward.
    outside = torch.compile(_FixedBatch(), backend="modelpar",
                            options={"devices": 2, "strategy": "auto"})
    with pytest.raises(Exception) as err:
        outside(x).sum().backward()
    inner = getattr(err.value, "inner_exception", None) or err.value
    assert isinstance(inner, modelpar.ConfigError), inner
    assert "uses the batch size as a number" in str(inner), inner
    assert "only when the compiled function returns the loss" in str(inner), inner


def test_timing_restores_the_inputs_a_step_writes_through_views():
    # Note [Timing a step that writes its inputs] (planning.InputRewind): a
    # static cache is written through a view of it (copy_ into a select) and
    # its position in place; the timers must rewind both, found as the
    # placement and the pipeline find them (op_family's writtenInput).
    from modelpar.planning.placement import InputRewind
    g = modelpar.parse_graph("""graph @advance(%pos: i64[1] input, %cache: f32[4, 2] input,
                                               %x: f32[2] input) {
  %row: f32[2] = aten::select.int(%cache, 0, 1)
  %row2: f32[2] = aten::copy_(%row, %x)
  %pos2: i64[1] = aten::add_.Scalar(%pos, 1)
  %y: f32[2] = aten::mul.Tensor(%x, %x)
  return %y
}
""")
    assert modelpar._C.graph_written_inputs(g) == [0, 1]
    pos, cache, x = torch.tensor([3]), torch.zeros(4, 2), torch.full((2,), 5.0)
    rewind = InputRewind(g, [pos, cache, x])
    modelpar.run_graph(g, [pos, cache, x])
    assert pos.item() == 4 and cache[1].tolist() == [5.0, 5.0]  # the step wrote both
    rewind.restore()
    assert pos.item() == 3 and torch.equal(cache, torch.zeros(4, 2))


def test_auto_places_the_pieces_of_a_broken_model_it_cannot_pipeline():
    # Note [A graph the pipeline cannot cut]: the pieces before the loss
    # return no loss, so the search would try only GPipe pipelines, and the
    # embed and head pieces have one layer for three devices: they are
    # placed by m-ETF (no candidate fitted before); the blocks and the loss
    # piece are searched. Two momentum-SGD steps equal eager.
    from models import GRAPH_BREAKS as case
    torch._dynamo.reset()
    modelpar.clear_plans()
    torch.manual_seed(0)
    model = case.make_model()
    eager = copy.deepcopy(model)
    step = torch.compile(lambda x, y: case.loss(model(x), y), backend="modelpar",
                         options={"devices": 3, "strategy": "auto"})
    opt = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    ref_opt = torch.optim.SGD(eager.parameters(), lr=0.1, momentum=0.9)
    tol = case.tol.after(steps=2)
    with pytest.warns(UserWarning, match=r"strategy='auto' searches only GPipe pipelines for a "
                                         r"graph that does not return the loss\): it has 1 layer "
                                         r"\(embed\)"):
        for seed in range(2):
            x, y = case.batch(seed, 16)
            loss, ref = step(x, y), case.loss(eager(x), y)
            tol.assert_close(loss.detach(), ref.detach())
            loss.backward()
            ref.backward()
            for p, q in zip(model.parameters(), eager.parameters()):
                tol.assert_close(p.grad, q.grad)
            opt.step()
            ref_opt.step()
            opt.zero_grad()
            ref_opt.zero_grad()
    runs = [p.runs_on for p in modelpar.plans()]
    assert sum("not pipelined" in r for r in runs) == 3, runs
    assert any("strategy auto" in r for r in runs), runs


def test_auto_pipelines_a_model_with_dropout_and_not_one_that_permutes_its_batch(
        tmp_path, monkeypatch):
    """Note [Searched pipelines keep the pipeline option's defaults]: dropout drawn per
    micro-batch has its full-batch distribution, so a model with dropout
    (GPT-2's 0.1) gets pipeline candidates (every one failed before); a
    batch permutation drawn per
    micro-batch would permute within micro-batches, so that model's
    pipelines of several micro-batches stay failed, naming randperm."""
    transformers = pytest.importorskip("transformers")
    import torch.nn.functional as F
    monkeypatch.setenv("MODELPAR_CPU_PROFILE", _compute_bound_machine(tmp_path))
    torch._dynamo.reset()
    modelpar.clear_plans()
    torch.manual_seed(0)
    cfg = transformers.GPT2Config(vocab_size=64, n_positions=32, n_embd=32, n_layer=2,
                                  n_head=4)  # every dropout at its default 0.1
    gpt = transformers.GPT2LMHeadModel(cfg).train()
    fast = torch.compile(lambda x, y: F.cross_entropy(gpt(x).logits.flatten(0, 1), y.flatten()),
                         backend="modelpar", options={"devices": 2, "strategy": "auto"})
    x = torch.randint(0, 64, (8, 16), generator=torch.Generator().manual_seed(0))
    loss = fast(x, torch.roll(x, -1, 1))
    loss.backward()
    assert math.isfinite(float(loss))
    assert all(p.grad is not None for p in gpt.parameters())
    plan = modelpar.plans()[-1]
    pipelines = [c for c in plan.candidates if c["kind"] == "pipeline"]
    assert pipelines and not [c for c in pipelines if c["status"] == "failed"], plan.search.table()

    class Shuffled(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.fc1, self.fc2 = torch.nn.Linear(16, 16), torch.nn.Linear(16, 4)

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            h = torch.relu(self.fc1(x))
            return self.fc2(h[torch.randperm(h.shape[0])])

    torch._dynamo.reset()
    modelpar.clear_plans()
    model = Shuffled()
    fast = torch.compile(lambda x, y: F.mse_loss(model(x), y), backend="modelpar",
                         options={"devices": 2, "strategy": "auto"})
    fast(torch.randn(8, 16), torch.randn(8, 4)).backward()
    plan = modelpar.plans()[-1]
    split = [c for c in plan.candidates if c["kind"] == "pipeline" and c["microbatches"] > 1]
    assert split and all(c["status"] == "failed" and "randperm" in c["reason"] for c in split), \
        plan.search.table()


def test_the_guard_decides_only_when_every_step_was_faster():
    # Note [Never slower than one device]: the one-device plan is kept only
    # when its timed steps and the chosen plan's do not overlap.
    from modelpar.compile.plan_guard import PlanGuard, slower_beyond_noise
    assert slower_beyond_noise([10, 11, 12], [5, 6, 9.9])
    assert not slower_beyond_noise([10, 11, 12], [5, 6, 10])   # overlap: noise
    assert not slower_beyond_noise([], [1])
    chosen, one = object(), object()
    guard = PlanGuard(chosen, one, steps=2)
    runs = []
    for elapsed in [99, 98, 10, 5, 11, 6]:  # two warm-ups, then turns
        build = guard.next_build()
        runs.append("c" if build is chosen else "o")
        decided = guard.record(build, elapsed)
    assert runs == ["c", "o", "c", "o", "c", "o"] and decided
    assert guard.times_us == ([10, 11], [5, 6]) and guard.winner is one
    assert "switched to the one-device plan" in guard.summary


@pytest.mark.parametrize("one_device_wins", [True, False])
def test_auto_times_its_choice_against_one_device_and_keeps_the_faster(
        tmp_path, monkeypatch, one_device_wins):
    # The compute-bound machine makes a pipeline win the search; the guard
    # then times it against the one-device plan on the first steps (forced
    # here, since timings on a shared machine are not a test's to decide).
    # Training equals eager before, during and after the switch.
    from modelpar.compile import plan_guard
    monkeypatch.setattr(plan_guard, "slower_beyond_noise", lambda c, o: one_device_wins)
    monkeypatch.setenv("MODELPAR_CPU_PROFILE", _compute_bound_machine(tmp_path))
    steps = 2 + 2 * plan_guard.GUARD_STEPS + 1
    plan = _train("mlp", {"devices": 2, "strategy": "auto", "strict": True}, None, steps, True)
    chosen = next(c for c in plan.candidates if c["chosen"])
    assert chosen["kind"] == "pipeline", plan.search.table()
    (batch, note), = plan.guard_batches.items()
    assert batch == 2 * CASES["mlp"].batch_size
    text = str(plan)
    assert f"run-time check at batch {batch}: measured {plan_guard.GUARD_STEPS} steps" in text
    if one_device_wins:
        assert "switched to the one-device plan" in note
        assert plan.pipeline is None and plan.joint is not None and plan.joint.num_devices == 1
    else:
        assert "kept the chosen plan" in note and plan.pipeline is not None
