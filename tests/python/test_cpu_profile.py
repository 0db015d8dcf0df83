"""The CPU machine profile (modelpar/profiles/cpu.py): calibrated once with a
progress bar, cached under $XDG_CACHE_HOME/modelpar keyed by CPU model and
thread count, overridden or turned off by $MODELPAR_CPU_PROFILE, and used by
torch.compile's plans for CPU worker devices (joint placement and pipelines)
instead of passes' GPU-like default device."""

from __future__ import annotations

import json
import os

import pytest
import torch

import modelpar
from modelpar.profiles import cpu as cpu_profile
from modelpar.errors import ConfigError


@pytest.fixture
def cache(tmp_path, monkeypatch):
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    monkeypatch.delenv("MODELPAR_CPU_PROFILE", raising=False)
    return tmp_path / "modelpar"


def test_calibrates_once_with_a_progress_bar_then_reads_the_cache(cache, capsys):
    path = cpu_profile.cpu_profile_path(1)
    err = capsys.readouterr().err
    assert "calibrating this CPU (1 thread)" in err and "17/17" in err
    assert os.path.dirname(path) == str(cache)
    assert os.path.basename(path).endswith("-t1-v5.json")
    prof = json.loads(open(path).read())
    dev, link = prof["devices"][0], prof["default_link"]
    # A CPU core: far from the default device's 14 TFLOP/s, but not nothing.
    assert 1e8 < dev["peak_flops"] < 1.4e13
    assert dev["memory_bandwidth_bytes_per_s"] > 0
    assert dev["launch_overhead_us"] == prof["calibration"]["per_op_us"] > 0
    # The hand-off splits into the sender's send overhead and the link latency.
    cal = prof["calibration"]
    assert 0 <= prof["send_overhead_us"] == cal["send_overhead_us"] <= cal["handoff_us"]
    assert link["latency_us"] + prof["send_overhead_us"] >= cal["handoff_us"] - 1e-9
    assert cal["handoff_us"] >= 0
    assert prof["worker_overhead_us"] == cal["worker_overhead_us"] >= 0
    assert prof["calibration"]["threads"] == 1
    assert prof["step_overhead_us"] == prof["calibration"]["step_overhead_us"] >= 0
    mtime = os.path.getmtime(path)
    assert cpu_profile.cpu_profile_path(1) == path  # cached: no second calibration
    assert capsys.readouterr().err == ""
    assert os.path.getmtime(path) == mtime
    # The planners read it as a machine profile.
    g = modelpar.ir.load_graph(os.path.join(os.path.dirname(__file__), "../../examples/ir/mlp_step.txt"))
    p = modelpar.plan_graph(g, devices=2, machine=path, dump_dir="")
    assert json.loads(p.machine_json)["devices"][0]["peak_flops"] == pytest.approx(dev["peak_flops"])


def test_env_turns_it_off_or_names_a_profile(cache, monkeypatch, tmp_path):
    monkeypatch.setenv("MODELPAR_CPU_PROFILE", "off")
    assert cpu_profile.cpu_profile_path(1) is None
    assert cpu_profile.machine_for("cpu-workers") is None
    given = tmp_path / "given.json"
    given.write_text("{}")
    monkeypatch.setenv("MODELPAR_CPU_PROFILE", str(given))
    assert cpu_profile.cpu_profile_path(2) == str(given)
    monkeypatch.setenv("MODELPAR_CUDA_PROFILE", "off")
    assert cpu_profile.machine_for("cuda:0") is None  # CUDA maps: cuda_profile.py's
    monkeypatch.setenv("MODELPAR_CPU_PROFILE", str(tmp_path / "missing.json"))
    with pytest.raises(ConfigError, match="MODELPAR_CPU_PROFILE=.*missing.json.* is not a file"):
        cpu_profile.cpu_profile_path(1)
    monkeypatch.setenv("MODELPAR_CPU_PROFILE", "off")
    with pytest.raises(ConfigError, match="threads=0 is not valid"):
        cpu_profile.cpu_profile_path(0)


def _mlp() -> torch.nn.Module:
    torch.manual_seed(0)
    return torch.nn.Sequential(torch.nn.Linear(16, 32), torch.nn.ReLU(), torch.nn.Linear(32, 4))


@pytest.mark.parametrize("pipeline", [None, {"microbatches": 2}])
def test_compiled_plans_for_cpu_workers_use_the_profile(cache, pipeline):
    path = cpu_profile.cpu_profile_path(1, progress=False)
    peak = json.loads(open(path).read())["devices"][0]["peak_flops"]
    torch._dynamo.reset()
    modelpar.clear_plans()
    model = _mlp()
    options = {"devices": 2, "strict": True}
    if pipeline is not None:
        options["pipeline"] = pipeline
    fast = torch.compile(lambda x, y: torch.nn.functional.mse_loss(model(x), y),
                         backend="modelpar", options=options)
    fast(torch.randn(8, 16), torch.randn(8, 4)).backward()
    rec = modelpar.plans()[-1]
    planned = rec.pipeline if pipeline is not None else rec.joint
    machine = json.loads(planned.machine_json)
    assert machine["devices"][0]["name"].startswith("cpu")  # replicated: cpu0, cpu1
    assert machine["devices"][0]["peak_flops"] == pytest.approx(peak)


def test_auto_times_the_step_on_copies_of_the_inputs(cache):
    """strategy="auto" with the calibrated profile: every node of the searched
    step carries a measured time, and timing it on copies leaves batch norm's
    running statistics as eager's (the step writes them in place)."""
    import copy

    from models import CASES
    from tolerances import Reordered
    case = CASES["cnn"]
    torch._dynamo.reset()
    modelpar.clear_plans()
    torch.manual_seed(0)
    model = case.make_model()
    eager = copy.deepcopy(model)
    fast = torch.compile(lambda x, y: case.loss(model(x), y), backend="modelpar",
                         options={"devices": 2, "strategy": "auto", "strict": True})
    x, y = case.batch(0, 8)
    loss = fast(x, y)
    loss.backward()
    want = case.loss(eager(x), y)
    want.backward()
    # Micro-batches and placement reorder the sums (tolerances.py): conv1's weight
    # gradient and batch norm sum over 8 x 16 x 16 = 2048 positions, 6 reductions deep.
    tol = Reordered(2048, depth=6)
    tol.assert_close(loss, want)
    for (n, b), e in zip(model.named_buffers(), eager.buffers()):
        if b.is_floating_point():
            tol.assert_close(b, e, msg=lambda m, n=n: f"buffer {n}: {m}")
    rec = modelpar.plans()[-1]
    text = str(rec.step_graph)
    assert text.count("cost={time_us=") == rec.step_graph.num_nodes
    # The search's machine carries the cores the two workers got (1..2), and
    # pipelines of m micro-batches their per-op overhead at B/m (m = 2, 4, 8).
    assert 1.0 <= json.loads(rec.search_machine)["host_cores"] <= 2.0
    launch = rec.search_microbatch_launch_us
    assert set(launch) <= {2, 4, 8} and 2 in launch and all(v >= 0 for v in launch.values())


def test_cpu_workers_share_the_hosts_memory(cache, monkeypatch, tmp_path):
    # Issue 36: each CPU worker was planned with the host's whole memory, so
    # a model needing more than the host has was planned on 2 workers and
    # run. A host of 20 KiB gives each of 2 workers 10 KiB (Note [Memory
    # shared by logical devices]); the MLP needs more than that on some
    # device: PlanDoesNotFitError at compile time, before anything ran.
    import json

    import torch

    from modelpar.planning.placement import calibrated_machine
    from models import MLP
    host = json.loads(calibrated_machine([(1e6, 1e6, 10.0), (2e6, 1e6, 15.0), (1e6, 4e6, 20.0)],
                                         [(1e3, 5.0), (1e6, 100.0)], memory=20 << 10))
    given = tmp_path / "host.json"
    given.write_text(json.dumps(host))
    monkeypatch.setenv("MODELPAR_CPU_PROFILE", str(given))
    torch._dynamo.reset()
    model = MLP()
    fast = torch.compile(model, backend="modelpar", options={"strict": True, "devices": 2})
    with pytest.raises(torch._dynamo.exc.BackendCompilerFailed) as err:
        fast(torch.randn(8, 16)).sum().backward()
    assert isinstance(err.value.inner_exception, modelpar.PlanDoesNotFitError), err.value
    assert "10.0 KiB" in str(err.value.inner_exception), err.value.inner_exception
    assert all(p.grad is None for p in model.parameters())


def _fake_timer(slow: dict[int, list[float]]):
    """A timer for calibration.copy_times: a copy of n bytes takes n / 1000
    us, except the times queued in ``slow[n]``, used one per call first (a
    core busy with something else while that size was timed)."""
    def timer(fn, reps, wait):
        nbytes = fn().numel() * 4
        queued = slow.get(nbytes)
        return queued.pop(0) if queued else nbytes / 1000
    return timer


def test_copy_times_keep_each_sizes_fastest_round_on_a_busy_machine(recwarn):
    # Note [Copies timed on a busy machine]: one size timed slower than the
    # next (a core busy with something else) would leave the link fit with
    # no bandwidth.
    from modelpar.profiles import calibration
    target = calibration.Target.cpu(1)
    bar = calibration.Progress(len(target.copy_sizes), False, "")
    mib = 1 << 20
    times = calibration.copy_times(target, bar, timer=_fake_timer({mib: [5000.0]}))
    assert times == [(float(n), n / 1000) for n in target.copy_sizes]
    assert not [w for w in recwarn if "copy times" in str(w.message)]
    # Slow in every round of the first try: timed again, the second try is clean.
    rounds = calibration.COPY_ROUNDS
    times = calibration.copy_times(target, bar, timer=_fake_timer({mib: [5000.0] * rounds}))
    assert times == [(float(n), n / 1000) for n in target.copy_sizes]
    # Slow whenever it is timed: the times come back as measured, with a warning that
    # says why and how to go on; the fit still finds a bandwidth from them.
    always = {mib: [5000.0] * (rounds * calibration.COPY_ATTEMPTS)}
    with pytest.warns(RuntimeWarning, match="did not grow with size.*MODELPAR_CPU_PROFILE"):
        times = calibration.copy_times(target, bar, timer=_fake_timer(always))
    assert dict(times)[float(mib)] == 5000.0
    kernels = [(3 * 4 * n * n, 2 * n ** 3, n ** 3 / 5e4 + 3) for n in target.mm_sizes]
    profile = json.loads(modelpar._C.calibrated_machine(kernels, times, 1 << 30, "cpu", 1.0))
    assert profile["default_link"]["bandwidth_bytes_per_s"] > 0


def test_the_first_plan_calibrates_inside_the_compiler_on_real_tensors(cache):
    # Note [Calibrated on real tensors]: with no profile cached, the first
    # placed step calibrates from inside AOTAutograd's partitioner, under its
    # fake mode; there every copy timed ~140 us whatever its size and the
    # step failed ("transfer time does not grow with size").
    torch._dynamo.reset()
    modelpar.clear_plans()
    model = _mlp()
    fast = torch.compile(lambda x, y: torch.nn.functional.mse_loss(model(x), y),
                         backend="modelpar", options={"devices": 2, "strict": True})
    fast(torch.randn(8, 16), torch.randn(8, 4)).backward()
    path = cpu_profile.cpu_profile_path(1, progress=False)  # what the step calibrated
    assert os.path.dirname(path) == str(cache)
    prof = json.loads(open(path).read())
    # Real copies: a link of this machine's memory (tens of MB/s at least, not the
    # flat fit of fake tensors' constant time), and kernels that take time.
    assert prof["default_link"]["bandwidth_bytes_per_s"] > 5e7
    assert 1e8 < prof["devices"][0]["peak_flops"] < 1.4e13
