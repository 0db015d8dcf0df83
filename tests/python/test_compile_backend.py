"""torch.compile(model, backend="modelpar"): transparency against eager
PyTorch for the test models (outputs, every gradient, five SGD-with-momentum
steps), inference modes, dropout, new shapes, graph breaks, the eager
fallback, options, plans and dumps, and the entry point."""

from __future__ import annotations

import copy
import math
import os
import subprocess
import sys
import warnings
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F
from torch import nn

import modelpar
from modelpar import _C
from models import CASES, GPT, MLP, GPTConfig, SmallCNN
from tolerances import Reordered

# One device, the same kernels as eager; AOTAutograd's decompositions may still add up a
# few sums in another order than eager's fused kernels (tests/python/tolerances.py). The
# models compared here are the test models: their longest sum is 1024 (the CNN's batch
# norm), their deepest path 34 reductions (GPT). Per-case tests use `case.tol`.
TOL = Reordered(1024, depth=34)


@pytest.fixture(autouse=True)
def _fresh_dynamo() -> None:
    torch._dynamo.reset()
    torch.manual_seed(0)


def compiled(model: nn.Module, **options) -> nn.Module:
    return torch.compile(model, backend="modelpar", options={"strict": True, **options})


def params_and_buffers(m: nn.Module) -> dict[str, torch.Tensor]:
    return {**dict(m.named_parameters()), **dict(m.named_buffers())}


def assert_same_state(a: nn.Module, b: nn.Module, tol: Reordered = TOL) -> None:
    sa, sb = params_and_buffers(a), params_and_buffers(b)
    assert sa.keys() == sb.keys()
    for name in sa:
        tol.assert_close(sa[name], sb[name], msg=lambda m: f"{name}: {m}")


def assert_same_grads(a: nn.Module, b: nn.Module, tol: Reordered = TOL) -> None:
    for (name, p), q in zip(a.named_parameters(), b.parameters()):
        assert (p.grad is None) == (q.grad is None), name
        if p.grad is not None:
            tol.assert_close(p.grad, q.grad, msg=lambda m: f"grad of {name}: {m}")


# ---- training: outputs, gradients, SGD with momentum ------------------------------


@pytest.mark.parametrize("name", list(CASES))
def test_training_matches_eager_for_five_sgd_momentum_steps(name: str) -> None:
    case = CASES[name]
    tol = case.tol.after(steps=5)
    model = case.make_model()
    eager = copy.deepcopy(model)
    fast = compiled(model)
    opt = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)
    opt_eager = torch.optim.SGD(eager.parameters(), lr=0.05, momentum=0.9)
    for step in range(5):
        x, y = case.batch(step, case.batch_size)
        out, out_eager = fast(x), eager(x)
        tol.assert_close(out, out_eager)
        loss, loss_eager = case.loss(out, y), case.loss(out_eager, y)
        loss.backward()
        loss_eager.backward()
        if step == 0:
            assert_same_grads(model, eager, tol)
        opt.step()
        opt_eager.step()
        opt.zero_grad()
        opt_eager.zero_grad()
    assert_same_state(model, eager, tol)  # parameters and buffers (BatchNorm's running stats)

    plan = modelpar.plans()[-1]
    assert set(plan.graphs) == {"forward", "backward"}
    assert all(g.runs_on == "modelpar" for g in plan.graphs.values()), plan
    roles = _C.graph_input_roles(plan.graphs["forward"].graph)
    assert roles.count("param") == len({id(p) for p in model.parameters()})
    assert roles.count("buffer") == len(list(model.buffers()))


def test_cnn_batchnorm_eval_mode_matches_eager_after_training() -> None:
    model = SmallCNN()
    eager = copy.deepcopy(model)
    fast = compiled(model)
    x, y = CASES["cnn"].batch(0, 4)
    F.cross_entropy(fast(x), y).backward()
    F.cross_entropy(eager(x), y).backward()
    model.eval()
    eager.eval()
    x2, y2 = CASES["cnn"].batch(1, 4)
    out, out_eager = fast(x2), eager(x2)  # running statistics, no update
    TOL.assert_close(out, out_eager)
    F.cross_entropy(out, y2).backward()
    F.cross_entropy(out_eager, y2).backward()
    assert_same_grads(model, eager)
    assert_same_state(model, eager)
    assert int(model.bn1.num_batches_tracked) == 1


def test_whole_training_step_with_loss_inside_compiles() -> None:
    model, eager = MLP(), MLP()
    eager.load_state_dict(model.state_dict())

    def step(x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        return F.mse_loss(model(x), y)

    x, y = CASES["mlp"].batch(0, 8)
    loss = torch.compile(step, backend="modelpar", options={"strict": True})(x, y)
    loss.backward()
    F.mse_loss(eager(x), y).backward()
    TOL.assert_close(loss, F.mse_loss(eager(x), y))
    assert_same_grads(model, eager)


# ---- inference ----------------------------------------------------------------------


@pytest.mark.parametrize("name", list(CASES))
def test_no_grad_and_inference_mode_match_eager(name: str) -> None:
    case = CASES[name]
    model = case.make_model()
    eager = copy.deepcopy(model)
    fast = compiled(model)
    x, _ = case.batch(0, case.batch_size)
    with torch.no_grad():
        TOL.assert_close(fast(x), eager(x))
    with torch.inference_mode():
        out = fast(x)
        TOL.assert_close(out, eager(x))
        assert out.is_inference()
    assert_same_state(model, eager)  # BatchNorm in train mode updated both alike
    kinds = [set(p.graphs) for p in modelpar.plans()[-2:]]
    assert kinds == [{"inference"}, {"inference"}]


# ---- dropout ------------------------------------------------------------------------


def test_dropout_eval_equals_eager_and_train_mask_statistics_are_right() -> None:
    gpt = GPT(GPTConfig(dropout=0.1))
    eager = copy.deepcopy(gpt).eval()
    fast = compiled(gpt.eval())
    idx, _ = CASES["gpt"].batch(0, 4)
    TOL.assert_close(fast(idx), eager(idx))

    p = 0.3
    drop = compiled(nn.Dropout(p).train())
    x = torch.rand(200_000) + 1.0  # no zeros of its own
    x.requires_grad_()
    y = drop(x)
    kept = y != 0
    frac = kept.float().mean().item()
    assert abs(frac - (1 - p)) < 0.005, frac  # ~10 sigma of a binomial at n=2e5
    TOL.assert_close(y[kept], x[kept] / (1 - p))  # survivors scaled
    y.sum().backward()
    TOL.assert_close(x.grad, kept.float() / (1 - p))
    assert not torch.equal(drop(x), y)  # a fresh mask per call
    assert {g.runs_on for g in modelpar.plans()[-1].graphs.values()} == {"modelpar"}


# ---- shapes, graph breaks -----------------------------------------------------------


@pytest.mark.parametrize("name", ["mlp", "gpt"])
def test_new_input_shapes_recompile_with_symbolic_sizes(name: str) -> None:
    case = CASES[name]
    model = case.make_model()
    eager = copy.deepcopy(model)
    fast = compiled(model)
    first = len(modelpar.plans())
    for n in (4, 6, 9):
        x, y = case.batch(n, n)
        case.loss(fast(x), y).backward()
        case.loss(eager(x), y).backward()
        assert_same_grads(model, eager)
        model.zero_grad()
        eager.zero_grad()
    new = modelpar.plans()[first:]
    assert len(new) == 2  # static batch 4, then one dynamic graph for 6 and 9
    text = new[-1].ir("forward")
    assert ": int input" in text  # the batch size is a graph input
    if name == "gpt":
        assert "modelpar::sym_mul" in text or "modelpar::sym_mul" in new[-1].ir("backward")


class _Breaky(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.a = nn.Linear(8, 8)
        self.b = nn.Linear(8, 8)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = torch.relu(self.a(x))
        print("modelpar test: a graph break")  # noqa: T201
        if h.sum() > 0:  # data-dependent branch: another break
            h = h * 2
        return self.b(h)


def test_graph_breaks_compile_every_piece_with_modelpar(capsys: pytest.CaptureFixture[str]) -> None:
    model = _Breaky()
    eager = copy.deepcopy(model)
    fast = compiled(model)
    first = len(modelpar.plans())
    for seed in range(2):
        x = torch.randn(4, 8, generator=torch.Generator().manual_seed(seed))
        out = fast(x)
        TOL.assert_close(out, eager(x))
        out.sum().backward()
        eager(x).sum().backward()
    assert_same_grads(model, eager)
    pieces = modelpar.plans()[first:]
    assert len(pieces) >= 3
    assert all(g.runs_on == "modelpar" for p in pieces for g in p.graphs.values())
    assert {p.function for p in pieces} == {"forward"}
    assert pieces[-1].graph_breaks >= 2
    assert "graph breaks in forward so far: " in str(pieces[-1])
    assert "the piece after the graph break at line" in str(pieces[-1])
    assert "a graph break" in capsys.readouterr().out


# ---- what the runtime cannot run ----------------------------------------------------


class _WithCond(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.fc = nn.Linear(4, 4)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self.fc(x)
        return torch.cond(h.sum() > 0, lambda t: t.sin(), lambda t: t.cos(), (h,))


def test_unsupported_graph_runs_eagerly_with_one_warning_naming_it(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from modelpar.compile.graph_breaks import forget_warnings
    forget_warnings()
    monkeypatch.setenv("MODELPAR_DUMP_DIR", str(tmp_path))
    model = _WithCond()
    eager = copy.deepcopy(model)
    fast = torch.compile(model, backend="modelpar")
    x = torch.randn(3, 4)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        out = fast(x)
        out.sum().backward()
        torch._dynamo.reset()
        torch.compile(copy.deepcopy(model), backend="modelpar")(x).sum().backward()
    messages = [str(w.message) for w in caught if "modelpar" in str(w.message)]
    assert len(messages) == 1, messages
    assert "higher-order op cond" in messages[0] and "runs eagerly" in messages[0]
    TOL.assert_close(out, eager(x))
    eager(x).sum().backward()
    assert_same_grads(model, eager)
    plan = modelpar.plans()[-1]
    assert plan.graphs["forward"].runs_on == "eager"
    assert "eager" in str(plan) and "cond" in str(plan)
    fx_dump = (tmp_path / f"{plan.name}.forward.eager-fx.txt").read_text()
    assert fx_dump.startswith("# runs eagerly: higher-order op cond")


def test_strict_makes_an_unsupported_graph_an_error() -> None:
    fast = torch.compile(_WithCond(), backend="modelpar", options={"strict": True})
    with pytest.raises(torch._dynamo.exc.BackendCompilerFailed) as err:
        fast(torch.randn(3, 4))
    inner = err.value.inner_exception
    assert isinstance(inner, modelpar.UnsupportedOpError)
    assert "higher-order op cond" in str(inner) and "strict" in str(inner)


def test_python_custom_op_runs_through_the_dispatcher() -> None:
    @torch.library.custom_op("modelpar_test::scaled", mutates_args=())
    def scaled(x: torch.Tensor, k: float) -> torch.Tensor:
        return x * k

    @scaled.register_fake
    def _(x: torch.Tensor, k: float) -> torch.Tensor:
        return torch.empty_like(x)

    lin = nn.Linear(4, 4)
    x = torch.randn(2, 4)
    f = torch.compile(lambda t: scaled(lin(t), 0.5), backend="modelpar", options={"strict": True})
    with torch.no_grad():
        TOL.assert_close(f(x), lin(x) * 0.5)
    assert "modelpar_test::scaled" in modelpar.plans()[-1].ir("inference")


# ---- no Python per op ---------------------------------------------------------------


def test_compiled_calls_run_in_cpp_without_fx(monkeypatch: pytest.MonkeyPatch) -> None:
    model = MLP()
    fast = compiled(model)
    x, y = CASES["mlp"].batch(0, 8)
    F.mse_loss(fast(x), y).backward()  # compiles forward and backward

    def no_fx(*args, **kwargs):
        raise AssertionError("an FX graph ran in Python")
    monkeypatch.setattr(torch.fx.GraphModule, "_wrapped_call", no_fx, raising=False)
    monkeypatch.setattr(torch.fx.GraphModule, "__call__", no_fx)
    monkeypatch.setattr(torch.fx.Interpreter, "run", no_fx)
    F.mse_loss(fast(x), y).backward()


# ---- layers, plans, dumps -----------------------------------------------------------


def test_ir_marks_params_layers_and_backward_layers_follow_forward() -> None:
    model = GPT()
    fast = compiled(model)
    idx, y = CASES["gpt"].batch(0, 2)
    CASES["gpt"].loss(fast(idx), y).backward()
    plan = modelpar.plans()[-1]
    fw, bw = plan.graphs["forward"].graph, plan.graphs["backward"].graph
    assert "blocks.0.attn.qkv.weight" in fw.input_names
    assert "tok.weight" in fw.input_names and "head.weight" not in fw.input_names  # tied: one input
    fw_layers = {layer for _, layer, _ in _C.graph_nodes(fw)}
    bw_nodes = _C.graph_nodes(bw)
    assert {"blocks.0.attn.qkv", "blocks.1.fc", "ln_f", "tok"} <= fw_layers
    assert {phase for _, _, phase in bw_nodes} == {"bwd"}
    bw_layers = {layer for _, layer, _ in bw_nodes if layer}
    assert bw_layers <= fw_layers and len(bw_layers) >= 10
    grads = [layer for op, layer, _ in bw_nodes if op == "aten::native_layer_norm_backward"]
    assert sorted(grads) == ["blocks.0.ln1", "blocks.0.ln2", "blocks.1.ln1", "blocks.1.ln2", "ln_f"]
    assert "aten::_scaled_dot_product_flash_attention_for_cpu_backward" in [op for op, _, _ in bw_nodes]


def test_plan_summary_write_ir_and_dump_dir(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    dump = tmp_path / "dump"
    monkeypatch.setenv("MODELPAR_DUMP_DIR", str(dump))
    model = SmallCNN()
    fast = compiled(model)
    x, y = CASES["cnn"].batch(0, 2)
    F.cross_entropy(fast(x), y).backward()
    plan = modelpar.plans()[-1]
    text = str(plan)
    for expected in ("modelpar plan", "runs on: modelpar C++ interpreter", "forward", "backward",
                     "conv1", "bn2", "aten::convolution", "graph breaks"):
        assert expected in text, (expected, text)
    dumped = sorted(p.name for p in dump.iterdir())
    assert dumped == [f"{plan.name}.backward.txt", f"{plan.name}.forward.txt"]
    written = plan.write_ir(tmp_path / "ir")
    for path in written:
        g = modelpar.parse_graph(path.read_text())
        assert g == plan.graphs[path.name.split(".")[-2]].graph  # the text round-trips
    assert "bn1.running_mean" in plan.ir("forward")


# ---- options ------------------------------------------------------------------------


@pytest.mark.parametrize("options, match", [
    ({"stirct": True}, r"unknown key 'stirct'; valid keys: strict, dump_dir, partitioner, devices"),
    ({"strict": 1}, r"strict=1 is not valid; strict takes True or False"),
    ({"devices": 0}, r"devices=0 is not valid; devices takes an int from 1 to 64"),
    ({"placer": "best"}, r"placer takes one of 'm-topo', 'm-etf', 'm-sct'"),
    ({"partitioner": "magic"}, r"partitioner takes one of 'default', 'min_cut'"),
    ({"memory": "lots"}, r'memory takes None, a positive number of bytes, or a size such as "16GiB"'),
    ({"pipeline": {"stages": 2}}, r"unknown pipeline key\(s\) 'stages'; valid keys: microbatches"),
])
def test_bad_options_raise_value_error_listing_valid_choices(options: dict, match: str) -> None:
    with pytest.raises(ValueError, match=match):
        modelpar.planning.options.resolve_options(options)


def test_options_from_the_environment_are_defaults_torch_compile_overrides(monkeypatch) -> None:
    # Note [Options from the environment]: for frameworks that compile for you.
    monkeypatch.setenv("MODELPAR_OPTIONS", '{"devices": 2, "pipeline": {"schedule": "1f1b"}}')
    o = modelpar.planning.options.resolve_options()
    assert o.devices == 2 and o.pipeline["schedule"] == "1f1b"
    o = modelpar.planning.options.resolve_options({"pipeline": {"schedule": "gpipe"}})  # a key replaces a key
    assert o.devices == 2 and o.pipeline["schedule"] == "gpipe"
    # And torch.compile uses them: a model compiled with no options runs on two devices.
    torch._dynamo.reset()
    modelpar.clear_plans()
    monkeypatch.setenv("MODELPAR_OPTIONS", '{"devices": 2, "strict": true}')
    model = MLP()
    x = torch.randn(8, 16)
    torch.testing.assert_close(torch.compile(model, backend="modelpar")(x), model(x),
                               rtol=1e-5, atol=1e-6)  # one 32-wide layer sum reordered
    assert "2 CPU worker devices" in modelpar.plans()[-1].runs_on
    for text, match in [("devices=2", r"\$MODELPAR_OPTIONS is not valid JSON"),
                        ("[2]", r"\$MODELPAR_OPTIONS must be a JSON object of options"),
                        ('{"devices": 0}', r"devices=0 is not valid.*\(in \$MODELPAR_OPTIONS="),
                        ('{"device": 2}', r"unknown key 'device'.*\(in \$MODELPAR_OPTIONS=")]:
        monkeypatch.setenv("MODELPAR_OPTIONS", text)
        with pytest.raises(modelpar.ConfigError, match=match):
            modelpar.planning.options.resolve_options()
    # Valid alone, not with what torch.compile was given: the error says both.
    monkeypatch.setenv("MODELPAR_OPTIONS", '{"devices": 2, "strategy": "auto"}')
    with pytest.raises(modelpar.ConfigError, match=r"options given over \$MODELPAR_OPTIONS"):
        modelpar.planning.options.resolve_options({"placer": "m-sct", "devices": 2})


def test_pipeline_option_gets_its_defaults() -> None:
    o = modelpar.planning.options.resolve_options({"devices": 2, "pipeline": {"microbatches": 8}})
    assert o.planned
    assert o.pipeline == {"microbatches": 8, "schedule": "gpipe", "virtual_stages": 0,
                          "partition": "balance-time", "checkpoint": "except_last",
                          "portals": True, "batch_norm": "deferred", "allow_random": True,
                          "loss_reduction": "auto"}
    # MadPipe's partition comes with its schedule when none is given.
    o = modelpar.planning.options.resolve_options({"devices": 2, "pipeline": {"partition": "madpipe"}})
    assert (o.pipeline["schedule"], o.pipeline["partition"]) == ("1f1b*", "madpipe")


def test_memory_device_map_and_trace_options_are_resolved() -> None:
    o = modelpar.planning.options.resolve_options({"devices": 2, "memory": "16GiB", "device_map": "cpu",
                                  "trace": "t.json"})
    assert (o.memory, o.device_map, o.trace) == (16 << 30, "cpu", "t.json")
    assert o.planned and o.executor_device_map == "cpu-workers"
    assert modelpar.planning.options.resolve_options({"memory": 1 << 20}).planned  # plans on one device too
    assert not modelpar.planning.options.resolve_options({"device_map": "cpu"}).planned


def test_devices_and_placer_options() -> None:
    assert modelpar.planning.options.resolve_options({"devices": 2}).devices == 2
    assert modelpar.planning.options.resolve_options({"devices": 4, "placer": "m-topo"}).placer == "m-topo"
    with pytest.raises(modelpar.ConfigError, match="placer='m-etf' needs devices > 1"):
        modelpar.planning.options.resolve_options({"placer": "m-etf"})


def test_modes(monkeypatch) -> None:
    assert modelpar.planning.options.resolve_options(None, "default").mode == "default"
    # One core: max-autotune's default of one device per core leaves nothing to
    # search (more cores: test_strategy_search.py).
    monkeypatch.setattr(modelpar.planning.options.os, "cpu_count", lambda: 1)
    with pytest.warns(UserWarning, match="nothing to autotune"):
        assert modelpar.planning.options.resolve_options(None, "max-autotune").mode == "max-autotune"
    o = modelpar.planning.options.resolve_options(None, "reduce-overhead")  # CUDA graph replay
    assert o.cuda_graphs and o.planned
    with pytest.raises(ValueError, match="mode='fast' is not valid; mode takes one of 'default'"):
        modelpar.planning.options.resolve_options(None, "fast")


def test_options_are_checked_before_tracing_through_torch_compile(monkeypatch) -> None:
    monkeypatch.setattr(modelpar.planning.options.os, "cpu_count", lambda: 1)  # see test_modes
    fast = torch.compile(MLP(), backend="modelpar", options={"devices": 2, "placer": "x"})
    with pytest.raises(torch._dynamo.exc.BackendCompilerFailed) as err:
        fast(torch.randn(2, 16))
    assert isinstance(err.value.inner_exception, modelpar.ConfigError)
    assert "placer='x' is not valid" in str(err.value)
    ok = torch.compile(MLP(), backend="modelpar", mode="max-autotune-no-cudagraphs")
    with pytest.warns(UserWarning, match="nothing to autotune"):
        ok(torch.randn(2, 16))
    assert modelpar.plans()[-1].options.mode == "max-autotune-no-cudagraphs"


def test_min_cut_partitioner_recomputes_in_backward() -> None:
    model = GPT()
    eager = copy.deepcopy(model)
    fast = compiled(model, partitioner="min_cut")
    idx, y = CASES["gpt"].batch(0, 2)
    CASES["gpt"].loss(fast(idx), y).backward()
    CASES["gpt"].loss(eager(idx), y).backward()
    assert_same_grads(model, eager)
    nodes = _C.graph_nodes(modelpar.plans()[-1].graphs["backward"].graph)
    assert {phase for _, _, phase in nodes} == {"bwd", "recompute"}
    assert all(layer for _, layer, phase in nodes if phase == "recompute")


# ---- registration -------------------------------------------------------------------


def test_backend_is_registered_by_entry_point_without_importing_modelpar() -> None:
    code = (
        "import sys, torch, torch._dynamo\n"
        "assert 'modelpar' in torch._dynamo.list_backends(), torch._dynamo.list_backends()\n"
        "assert 'modelpar' not in sys.modules\n"
        "f = torch.compile(torch.nn.Linear(3, 2), backend='modelpar')\n"
        "f(torch.randn(4, 3)).sum().backward()\n"
        "import modelpar\n"
        "print(modelpar.plans()[-1].runs_on)\n"
    )
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                            env=os.environ.copy(), timeout=240)
    assert result.returncode == 0, result.stderr
    assert "modelpar C++ interpreter" in result.stdout


# ---- the runtime pieces the backend relies on ---------------------------------------


def test_numbers_passed_as_tensors_are_wrapped_numbers() -> None:
    g = modelpar.parse_graph("""
        graph @wrapped(%h: f16[3] input, %i: i64[3] input, %n: int input, %m: bool[3] input) {
          %a: f16[3] = aten::add.Tensor(%h, 0.5)
          %b: f32[3] = aten::mul.Tensor(%i, 2.5)
          %c: i64[3] = aten::add.Tensor(%i, %n)
          %d: f16[3] = aten::where.self(%m, %h, 0.0)
          return %a, %b, %c, %d
        }""")
    h, i, m = torch.randn(3).half(), torch.arange(3), torch.tensor([True, False, True])
    a, b, c, d = modelpar.run_graph(g, [h, i, 4, m])
    torch.testing.assert_close(a, h + 0.5)
    torch.testing.assert_close(b, i * 2.5)
    torch.testing.assert_close(c, i + 4)
    torch.testing.assert_close(d, torch.where(m, h, 0.0))


def test_sym_ops_follow_python_semantics() -> None:
    g = modelpar.parse_graph("""
        graph @sizes(%a: int input, %b: int input) {
          %fd: int = modelpar::sym_floordiv(%a, %b)
          %md: int = modelpar::sym_mod(%a, %b)
          %td: float = modelpar::sym_truediv(%a, %b)
          %mx: int = modelpar::sym_max(%a, %b)
          %pw: int = modelpar::sym_pow(%b, 3)
          %lt: bool = modelpar::sym_lt(%a, %b)
          %ce: int = modelpar::sym_ceil(%td)
          return %fd, %md, %td, %mx, %pw, %lt, %ce
        }""")
    for a, b in [(7, 2), (-7, 2), (7, -2), (-7, -3)]:
        assert modelpar.run_graph(g, [a, b]) == [a // b, a % b, a / b, max(a, b), b ** 3, a < b,
                                                   math.ceil(a / b)]
    with pytest.raises(modelpar.ExecutionError, match="division by zero"):
        modelpar.run_graph(g, [1, 0])


def test_sym_sum_of_sizes_runs_on_the_runtime() -> None:
    # torch.sym_sum (Mistral's sliding-window mask sums sizes with it) becomes
    # a chain of modelpar::sym_add; strict makes an eager fallback an error.
    def f(x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        n = torch.sym_sum([x.shape[0], y.shape[0], x.shape[1]])
        return torch.arange(n, dtype=x.dtype) + x.sum()

    torch._dynamo.reset()
    fast = torch.compile(f, backend="modelpar", dynamic=True, options={"strict": True})
    for a, b in [(3, 4), (5, 2)]:
        x, y = torch.ones(a, 2), torch.ones(b, 3)
        torch.testing.assert_close(fast(x, y), f(x, y))
    record = modelpar.plans()[-1].graphs["inference"]
    assert record.runs_on == "modelpar", record.reason
    assert str(record.graph).count("modelpar::sym_add") == 2, str(record.graph)
