"""torch.compile(backend="modelpar", options={"devices": N, ...}): the
forward and backward graphs planned as one (passes/plan_joint.h) and run by the
multi-device Executor on N CPU worker devices. Outputs, every gradient,
buffers and momentum-SGD steps equal eager for every test model; a layer's
backward runs on its forward's device and saved activations are bound where
they were produced; the memory, device_map and trace options; the measured
and simulated step times of ``modelpar.plans()[-1]``; failures on a worker."""

from __future__ import annotations

import copy
import json
import re
import threading

import pytest
import torch

import modelpar
from modelpar import _C
from models import CASES, MLP, InceptionNet
from tolerances import Reordered

# Placement on several devices changes the order of fp32 sums (tests/python/tolerances.py).
# Per-model tests use `case.tol`; the MLP and Inception tests below that build models of
# their own use the Inception bound (longest sum 256 positions, 10 reductions deep).
TOL = Reordered(256, depth=10)


@pytest.fixture(autouse=True)
def _fresh_dynamo() -> None:
    torch._dynamo.reset()
    torch.manual_seed(0)


def _compiled(model: torch.nn.Module, **options) -> torch.nn.Module:
    return torch.compile(model, backend="modelpar", options={"strict": True, **options})


def _state(m: torch.nn.Module) -> dict[str, torch.Tensor]:
    return {**dict(m.named_parameters()), **dict(m.named_buffers())}


def _train_and_compare(name: str, devices: int, placer: str = "m-etf") -> modelpar.compile.records.PlanRecord:
    """Outputs, gradients and 3 momentum-SGD steps against eager; returns the plan."""
    case = CASES[name]
    tol = case.tol.after(steps=3)
    model = case.make_model()
    eager = copy.deepcopy(model)
    fast = _compiled(model, devices=devices, placer=placer)
    opt = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)
    ref_opt = torch.optim.SGD(eager.parameters(), lr=0.05, momentum=0.9)
    for step in range(3):
        x, y = case.batch(step, case.batch_size)
        out, ref = fast(x), eager(x)
        tol.assert_close(out, ref)
        case.loss(out, y).backward()
        case.loss(ref, y).backward()
        if step == 0:
            for (n, p), q in zip(model.named_parameters(), eager.parameters()):
                assert (p.grad is None) == (q.grad is None), n
                if p.grad is not None:
                    tol.assert_close(p.grad, q.grad, msg=lambda m: f"grad of {n}: {m}")
        opt.step()
        ref_opt.step()
        opt.zero_grad()
        ref_opt.zero_grad()
    sa, sb = _state(model), _state(eager)
    for n in sa:  # parameters and buffers (BatchNorm's running statistics)
        tol.assert_close(sa[n], sb[n], msg=lambda m: f"{n}: {m}")
    plan = modelpar.plans()[-1]
    with torch.no_grad():  # an inference graph, planned alone
        x, _ = case.batch(9, case.batch_size)
        tol.assert_close(fast(x), eager(x))
    return plan


@pytest.mark.parametrize("devices", [2, 4])
@pytest.mark.parametrize("name", list(CASES))
def test_training_equals_eager_with_forward_and_backward_placed_as_one(name: str, devices: int) -> None:
    plan = _train_and_compare(name, devices)
    assert set(plan.graphs) == {"forward", "backward"}
    assert all(r.runs_on == "modelpar" for r in plan.graphs.values()), plan
    # Both graphs run the split of one joint plan, not plans of their own.
    assert plan.joint is not None and plan.joint.num_devices == devices
    for rec in plan.graphs.values():
        assert rec.placement.stats[1]["pass"] == "fixed-placement"
    assert plan.simulated_step_us == plan.joint.step_time_us > 0
    assert len(plan.step_times_us) == 3 and all(t > 0 for t in plan.step_times_us)
    assert f"{devices} CPU worker devices (m-etf)" in str(plan)


@pytest.mark.parametrize("name", ["mlp", "inception"])
def test_m_topo_places_the_joint_graph_too(name: str) -> None:
    plan = _train_and_compare(name, 2, placer="m-topo")
    assert plan.joint.placer == "place-mtopo"


def _nodes(rec) -> list[tuple[str, str, str, int]]:
    """(name, layer, phase, device) of every node of a planned graph, in order."""
    return [(n, layer, phase, dev) for (op, layer, phase), (n, dev)
            in zip(_C.graph_nodes(rec.graph), rec.placement.placement.items())]


@pytest.mark.parametrize("devices", [2, 4])
@pytest.mark.parametrize("name", list(CASES))
def test_backward_runs_on_its_forwards_device_and_saved_values_stay_put(name: str, devices: int) -> None:
    case = CASES[name]
    fast = _compiled(case.make_model(), devices=devices)
    x, y = case.batch(0, case.batch_size)
    case.loss(fast(x), y).backward()
    plan = modelpar.plans()[-1]
    fw, bw = plan.graphs["forward"], plan.graphs["backward"]
    layer_device: dict[str, int] = {}
    for _n, layer, _phase, dev in _nodes(fw):
        if layer:
            layer_device.setdefault(layer, dev)
    checked = 0
    for n, layer, phase, dev in _nodes(bw):
        if layer in layer_device:
            assert dev == layer_device[layer], f"{phase} node %{n} of layer {layer}"
            checked += 1
    assert checked > 0
    # A backward input the forward produced is bound on its producer's
    # device (the Executor puts inputs on their `device`): no transfer
    # between the two graphs. Inputs the forward read too stay where they were.
    fw_made = fw.placement.value_devices
    fw_inputs = fw.placement.input_devices
    saved = 0
    for name_, dev in bw.placement.input_devices.items():
        if name_ in fw_made:
            assert dev == fw_made[name_], f"saved %{name_}"
            saved += name_ not in fw_inputs
    assert saved > 0
    # Gradients land on their parameter's device: the backward returns one
    # gradient per parameter, in the order of the forward's inputs.
    roles = dict(zip(fw.graph.input_names, _C.graph_input_roles(fw.graph)))
    params = [n for n in fw.graph.input_names if roles[n] == "param"]
    grads = bw.graph.output_names
    assert len(params) == len(grads)
    bw_made = bw.placement.value_devices
    for param, grad in zip(params, grads):
        assert bw_made[grad] == fw_inputs[param], f"gradient %{grad} of {param}"


def test_too_small_memory_raises_before_anything_runs() -> None:
    model = MLP()
    before = copy.deepcopy(model.state_dict())
    fast = _compiled(model, devices=2, memory=4096)
    with pytest.raises(torch._dynamo.exc.BackendCompilerFailed) as err:
        fast(torch.randn(8, 16)).sum().backward()
    inner = err.value.inner_exception
    assert isinstance(inner, modelpar.PlanDoesNotFitError), inner
    msg = str(inner)
    assert re.search(r"layer 'fc\d' needs [\d.]+ KiB on device \d, which has [\d.]+ KiB", msg), msg
    for k, v in model.state_dict().items():
        torch.testing.assert_close(v, before[k])
    assert all(p.grad is None for p in model.parameters())


def test_memory_that_fits_is_the_plans_capacity() -> None:
    plan = _train_and_compare("mlp", 2)
    assert plan.joint.capacity_bytes == [16 << 30] * 2  # the default
    torch._dynamo.reset()
    fast = _compiled(MLP(), devices=2, memory="64MiB")
    fast(torch.randn(8, 16)).sum().backward()
    assert modelpar.plans()[-1].joint.capacity_bytes == [64 << 20] * 2


def test_device_map_cpu_runs_on_cpu_workers_and_cuda_needs_a_gpu() -> None:
    fast = _compiled(MLP(), devices=2, device_map="cpu")
    fast(torch.randn(8, 16)).sum().backward()
    assert "2 CPU worker devices" in str(modelpar.plans()[-1])
    if _C.cuda_devices_built() and _C.cuda_device_count() > 0:
        pytest.skip("a GPU is present: the error paths below do not apply")
    for dm in ("cuda", "cuda:0", ["cuda:0", "cuda:1"]):
        with pytest.raises(modelpar.ConfigError,
                           match="exist only in a CUDA build of modelpar on a machine with a GPU"):
            modelpar.planning.options.resolve_options({"devices": 2, "device_map": dm})
    with pytest.raises(modelpar.ConfigError, match="names 1 devices but devices=2"):
        modelpar.planning.options.resolve_options({"devices": 2, "device_map": ["cuda:0"]})
    with pytest.raises(modelpar.ConfigError, match="device_map takes None, 'cpu', 'cuda'"):
        modelpar.planning.options.resolve_options({"devices": 2, "device_map": "tpu"})
    # Checked before tracing: compiling says the same.
    fast = torch.compile(MLP(), backend="modelpar", options={"devices": 2, "device_map": "cuda"})
    with pytest.raises(torch._dynamo.exc.BackendCompilerFailed, match="machine with a GPU"):
        fast(torch.randn(2, 16))


@pytest.mark.parametrize("how", [{"options": {"devices": 2, "cuda_graphs": True}},
                                 {"mode": "reduce-overhead"}])
def test_cuda_graphs_on_cpu_workers_run_the_twin_and_say_why(how: dict) -> None:
    """CPU worker programs cannot be captured: the executors run the static-
    buffer protocol on the stream path, equal eager over steps with new
    inputs, and the plan summary says why nothing was captured."""
    torch.manual_seed(0)
    model = MLP()
    ref = copy.deepcopy(model)
    fast = torch.compile(model, backend="modelpar", **how)
    for step in range(3):
        x = torch.randn(4, 16, generator=torch.Generator().manual_seed(step))
        out, want = fast(x), ref(x)
        CASES["mlp"].tol.assert_close(out, want)
        out.sum().backward()
        want.sum().backward()
    for p, q in zip(model.parameters(), ref.parameters()):
        CASES["mlp"].tol.after(steps=3).assert_close(p.grad, q.grad)
    plan = modelpar.plans()[-1]
    assert plan.graphs["forward"].executor is not None
    text = str(plan)
    assert "replay:" in text and "CPU worker devices" in text, text


@pytest.mark.parametrize("options", [{"devices": 2, "cuda_graphs": True},
                                     {"devices": 2, "strategy": "auto", "cuda_graphs": True}])
def test_graph_replay_captures_again_for_each_new_batch_size(options: dict) -> None:
    """Note [One capture per signature]: a dynamic graph under graph replay
    keeps one executor per input signature; the third batch size (the
    second the dynamic graph met) was refused ("bakes non-tensor inputs
    in"). Sizes 4, 6, 8, then 6 again (its capture reused), equal eager."""
    torch.manual_seed(0)
    model = MLP()
    ref = copy.deepcopy(model)
    fast = torch.compile(lambda x: model(x).sum(), backend="modelpar", options=options)
    for step, n in enumerate([4, 6, 8, 6]):
        x = torch.randn(n, 16, generator=torch.Generator().manual_seed(step))
        out, want = fast(x), ref(x).sum()
        CASES["mlp"].tol.assert_close(out, want)
        out.backward()
        want.backward()
    for p, q in zip(model.parameters(), ref.parameters()):
        CASES["mlp"].tol.after(steps=4).assert_close(p.grad, q.grad)
    planned = [m for m in modelpar.plans() if m.search is None]
    for rec in (r for m in planned for r in m.graphs.values()):
        assert rec.runs_on == "modelpar", rec


@pytest.mark.parametrize("devices", [2, 4])
def test_trace_writes_measured_and_simulated_chrome_traces(tmp_path, devices: int) -> None:
    path = tmp_path / "traces" / "step.json"
    case = CASES["inception"]
    fast = _compiled(case.make_model(), devices=devices, trace=str(path))
    for step in range(2):
        x, y = case.batch(step, case.batch_size)
        case.loss(fast(x), y).backward()
    plan = modelpar.plans()[-1]
    assert plan.trace_path == str(path)
    assert plan.simulated_trace_path == str(tmp_path / "traces" / "step.simulated.json")
    measured = json.loads(path.read_text())["traceEvents"]
    simulated = json.loads((tmp_path / "traces" / "step.simulated.json").read_text())["traceEvents"]
    used = set(plan.joint.placement.values())  # the devices the placer gave work
    assert len(used) >= 2
    for events in (measured, simulated):
        spans = [e for e in events if e.get("ph") == "X"]
        assert {e["pid"] for e in spans} == used
        assert all(e["dur"] >= 0 for e in spans)
    # The measured step holds both executors, the backward after the forward.
    by_graph: dict[str, list[float]] = {}
    for e in measured:
        if e.get("ph") == "X":
            by_graph.setdefault(e["args"]["graph"], []).append(e["ts"])
    assert set(by_graph) == {"forward", "backward"}
    assert min(by_graph["backward"]) >= max(by_graph["forward"]) - 1e-3
    assert f"traces: measured {path}" in str(plan)


def test_plan_reports_placement_simulated_and_measured_step() -> None:
    case = CASES["mlp"]
    fast = _compiled(case.make_model(), devices=2)
    x, y = case.batch(0, case.batch_size)
    out = fast(x)
    plan = modelpar.plans()[-1]
    assert plan.measured_step_us is None and "measured step: not run yet" in str(plan)
    assert plan.simulated_step_us > 0
    case.loss(out, y).backward()
    for _ in range(2):
        case.loss(fast(x), y).backward()
    assert len(plan.step_times_us) == 3
    assert plan.measured_step_us == plan.step_times_us[-1] > 0
    assert plan.measured_median_us == sorted(plan.step_times_us)[1]
    assert set(plan.placement.values()) <= {0, 1}
    assert set(plan.placement) >= set(plan.graphs["forward"].placement.placement)
    text = str(plan)
    assert "simulated step (forward and backward placed as one)" in text
    assert "measured step:" in text and "median" in text and "over the last 3 steps" in text
    assert "[joint]" in text


def test_a_graph_that_cannot_be_imported_still_runs_eagerly(monkeypatch) -> None:
    # The fallback warns once per reason and process; earlier tests may have
    # used this reason up.
    from modelpar.compile.graph_breaks import forget_warnings
    forget_warnings()
    class Opaque(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.fc = torch.nn.Linear(4, 4)

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            h = self.fc(x)
            return torch.cond(h.sum() > 0, lambda t: t * 2, lambda t: t - 1, (h,))

    model = Opaque()
    eager = copy.deepcopy(model)
    fast = torch.compile(model, backend="modelpar", options={"devices": 2})
    x = torch.randn(3, 4)
    with pytest.warns(UserWarning, match="runs eagerly"):
        out = fast(x)
    TOL.assert_close(out, eager(x))
    out.sum().backward()
    eager(x).sum().backward()
    TOL.assert_close(model.fc.weight.grad, eager.fc.weight.grad)
    plan = modelpar.plans()[-1]
    assert plan.joint is None
    assert {r.runs_on for r in plan.graphs.values()} == {"eager"}


# ---- failures on a worker -----------------------------------------------------------

_lib = torch.library.Library("mp_joint_test", "DEF")
_lib.define("fail_if(Tensor x, Tensor flag) -> Tensor")
_FAIL = {"on": False}


def _fail_if(x: torch.Tensor, flag: torch.Tensor) -> torch.Tensor:
    if _FAIL["on"]:
        raise RuntimeError("injected failure on a worker")
    return x.clone()


_lib.impl("fail_if", _fail_if, "CPU")
_lib.impl("fail_if", lambda x, flag: torch.empty_like(x), "Meta")


def test_failing_op_on_device_1_names_device_and_instruction_and_wakes_device_0() -> None:
    program = modelpar.parse_program(
        """
        program devices=2
        graph @g(%x: f32[4] input {device=1}, %f: f32[1] input {device=1}) {
          %a: f32[4] = mp_joint_test::fail_if(%x, %f) {device=1}
          %b: f32[4] = aten::relu(%a) {device=0}
          return %b
        }
        device 0 {
          recv %a <- 1
          run %b
        }
        device 1 {
          run %a
          send %a -> 0
        }""")
    ex = modelpar.Executor(program, threads_per_device=1)
    x = torch.randn(4)
    torch.testing.assert_close(ex.run([x, torch.zeros(1)])[0], x.relu())
    _FAIL["on"] = True
    errors: list[BaseException] = []

    def step() -> None:
        try:
            ex.run([x, torch.zeros(1)])
        except BaseException as e:  # noqa: BLE001 - recorded for the assertion
            errors.append(e)

    try:
        t = threading.Thread(target=step)
        t.start()
        t.join(timeout=30)
        assert not t.is_alive(), "the step hung after a failure on device 1"
    finally:
        _FAIL["on"] = False
    assert len(errors) == 1 and isinstance(errors[0], modelpar.ExecutionError), errors
    msg = str(errors[0])
    assert "device 1, instruction 0 (run %a, mp_joint_test::fail_if)" in msg, msg
    assert "injected failure on a worker" in msg
    torch.testing.assert_close(ex.run([x, torch.zeros(1)])[0], x.relu())  # usable again


def test_failing_op_in_a_compiled_multi_device_graph_raises_with_its_device() -> None:
    class WithCustomOp(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.fc = torch.nn.Linear(4, 4)
            self.register_buffer("flag", torch.zeros(1))

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return torch.ops.mp_joint_test.fail_if(self.fc(x).relu(), self.flag) * 2

    model = WithCustomOp()
    fast = _compiled(model, devices=2)
    x = torch.randn(3, 4)
    with torch.no_grad():
        TOL.assert_close(fast(x), model(x))
        _FAIL["on"] = True
        try:
            with pytest.raises(modelpar.ExecutionError,
                               match=r"device \d, instruction \d+ \(run %\w+, mp_joint_test::fail_if\)"):
                fast(x)
        finally:
            _FAIL["on"] = False
        TOL.assert_close(fast(x), model(x))


def test_bad_placer_lists_valid_ones() -> None:
    with pytest.raises(modelpar.ConfigError, match="placer takes one of 'm-topo', 'm-etf', 'm-sct'"):
        modelpar.planning.options.resolve_options({"devices": 2, "placer": "best"})
    fast = torch.compile(MLP(), backend="modelpar", options={"devices": 2, "placer": "best"})
    with pytest.raises(torch._dynamo.exc.BackendCompilerFailed) as err:
        fast(torch.randn(2, 16))
    assert isinstance(err.value.inner_exception, modelpar.ConfigError)
    assert "'m-topo', 'm-etf', 'm-sct'" in str(err.value)


def _joint_single_device_us(batch: int, dynamic: bool) -> float:
    torch._dynamo.reset()
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(256, 256), torch.nn.ReLU(), torch.nn.Linear(256, 256))
    fast = _compiled(model, devices=2)
    x = torch.randn(batch, 256)
    if dynamic:
        torch._dynamo.mark_dynamic(x, 0)
    fast(x).sum().backward()
    return modelpar.plans()[-1].joint.single_device_us


def test_a_symbolic_batch_is_costed_at_the_size_of_the_call() -> None:
    """Placement costs nodes at the sizes of the call being planned: a graph
    with a symbolic batch of 4096 costs what the static one does, not what a
    batch of 1 (CostOptions::default_symbol_size) would."""
    static = _joint_single_device_us(4096, dynamic=False)
    dynamic = _joint_single_device_us(4096, dynamic=True)
    one = _joint_single_device_us(1, dynamic=False)
    assert dynamic == pytest.approx(static, rel=1e-6)
    assert dynamic > 1.5 * one, (dynamic, one)


def test_outputs_go_home_except_saved_activations() -> None:
    """Note [Outputs go home] (compile/bound_graphs.py): on GPUs each output goes to
    the device of its fake value (the caller's, a parameter's), except a
    forward's saved activations, which only the backward reads."""
    from modelpar.compile.bound_graphs import output_homes
    from modelpar.compile.fx_import import GraphKind
    g = torch.fx.Graph()
    a, b = g.placeholder("a"), g.placeholder("b")
    a.meta["val"] = torch.empty(2, device="meta")
    b.meta["val"] = torch.empty(2)
    g.output((a, b, None))
    gm = torch.fx.GraphModule(torch.nn.Module(), g)
    meta, cpu = torch.device("meta"), torch.device("cpu")
    assert output_homes(gm, GraphKind.FORWARD, 1) == [meta, None, None]  # b is saved
    assert output_homes(gm, GraphKind.FORWARD, None) == [meta, cpu, None]
    assert output_homes(gm, GraphKind.BACKWARD, 1) == [meta, cpu, None]


@pytest.mark.parametrize("options", [{"devices": 2}, {"devices": 2, "pipeline": {}}])
def test_trace_of_a_model_with_graph_breaks_holds_every_piece(tmp_path, options: dict) -> None:
    """Note [One trace for the pieces of a step]: every piece of a model cut
    by graph breaks wrote its own step to the one ``trace`` path, so the
    file held the first graph's (it finishes last) and the rest was lost.
    Now the measured file holds the whole last step: each piece's forward
    and backward once, forwards in the model's order, backwards in reverse,
    none overlapping; the simulated file each piece's step, one after
    another."""
    from models import GRAPH_BREAKS
    modelpar.clear_plans()
    path = tmp_path / "t" / "step.json"
    model = GRAPH_BREAKS.make_model()
    fast = torch.compile(lambda x, y: GRAPH_BREAKS.loss(model(x), y), backend="modelpar",
                         options={**options, "trace": str(path)})
    for step in range(2):
        x, y = GRAPH_BREAKS.batch(step, 2 * GRAPH_BREAKS.batch_size)
        fast(x, y).backward()
    pieces = [p.name for p in modelpar.plans()]
    assert len(pieces) == 5  # four graph breaks
    assert all(p.trace_path == str(path) for p in modelpar.plans())
    spans = [e for e in json.loads(path.read_text())["traceEvents"] if e.get("ph") == "X"]
    runs: dict[tuple[str, str], tuple[float, float]] = {}
    for e in spans:
        key = (e["args"]["piece"], e["args"]["graph"])
        a, b = runs.get(key, (float("inf"), float("-inf")))
        runs[key] = (min(a, e["ts"]), max(b, e["ts"] + e["dur"]))
    assert set(runs) == {(p, g) for p in pieces for g in ("forward", "backward")}
    order = sorted(runs, key=lambda k: runs[k][0])
    assert order == [(p, "forward") for p in pieces] + [(p, "backward") for p in reversed(pieces)]
    for k, k2 in zip(order, order[1:]):
        assert runs[k][1] <= runs[k2][0] + 1e-3, (k, k2)
    # One step only: the first step's runs were dropped when the second began
    # (each (piece, graph) above spans one run: none overlaps the next).
    simulated = json.loads((tmp_path / "t" / "step.simulated.json").read_text())["traceEvents"]
    sim_runs: dict[str, tuple[float, float]] = {}
    for e in simulated:
        if e.get("ph") == "X":
            a, b = sim_runs.get(e["args"]["piece"], (float("inf"), float("-inf")))
            sim_runs[e["args"]["piece"]] = (min(a, e["ts"]), max(b, e["ts"] + e["dur"]))
    assert list(sorted(sim_runs, key=lambda p: sim_runs[p][0])) == [
        p for p in pieces if p in sim_runs]
    assert len(sim_runs) >= 3  # the tanh piece has no layers; every piece with work
    spans_sorted = sorted(sim_runs.values())
    for (a, b), (c, d) in zip(spans_sorted, spans_sorted[1:]):
        assert b <= c + 1e-6
