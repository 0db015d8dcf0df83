"""torch.compile(..., options={"devices": N, "pipeline": {...}}): the
training step micro-batched, cut into stages and run as a pipelined program
on CPU worker devices (python/modelpar/compile/pipeline_step.py).

Transparency: outputs, the loss and every gradient equal eager PyTorch on
the U-Net, the GPT decoder and the Inception model for {gpipe, 1f1b} x
{always, except_last, never} x {portals, relayed skips}: 1F1B with the loss
compiled in (step mode), GPipe with the loss outside (split mode, the
forward and backward calls run the two halves). Also: new batch sizes plan
again, the tangent scales the gradients, momentum-SGD steps, deferred batch
norm's running statistics, inference, and the errors a user can hit."""

from __future__ import annotations

import copy
import itertools
import os

import pytest
import torch

import modelpar
from models import CASES, GRAPH_BREAKS
from tolerances import Reordered

# Micro-batching splits every sum over the batch and pipelining places the layers on several
# devices (tests/python/tolerances.py). The models pipelined here are the U-Net, GPT,
# Inception and CNN: longest sum 1024 (the CNN's batch norm), 34 reductions deep (GPT).
TOL = Reordered(1024, depth=34)
MATRIX = list(itertools.product(["always", "except_last", "never"], [True, False]))


@pytest.fixture(autouse=True)
def _fresh_dynamo() -> None:
    torch._dynamo.reset()
    modelpar.clear_plans()
    torch.manual_seed(0)


def _batch(name: str, seed: int, n: int) -> tuple[torch.Tensor, torch.Tensor]:
    x, y = CASES[name].batch(seed, n)
    torch._dynamo.mark_dynamic(x, 0)
    torch._dynamo.mark_dynamic(y, 0)
    return x, y


def _assert_grads(model: torch.nn.Module, eager: torch.nn.Module) -> None:
    for (n, p), q in zip(model.named_parameters(), eager.parameters()):
        assert (p.grad is None) == (q.grad is None), n
        if p.grad is not None:
            TOL.assert_close(p.grad, q.grad, msg=lambda m, n=n: f"grad of {n}: {m}")


def _pipeline(**kw) -> dict:
    return {"microbatches": 4, **kw}


def _loss_inside(name: str, devices: int, batches: list[int], options: dict | None = None,
                 **pipeline) -> modelpar.compile.records.PlanRecord:
    """Compiles model + loss (step mode); loss and gradients equal eager for
    each batch size."""
    case = CASES[name]
    model = case.make_model()
    eager = copy.deepcopy(model)

    def step(x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        return case.loss(model(x), y)

    fast = torch.compile(step, backend="modelpar",
                         options={"strict": True, "devices": devices, "pipeline": _pipeline(**pipeline),
                                  **(options or {})})
    for seed, n in enumerate(batches):
        model.zero_grad()
        eager.zero_grad()
        x, y = _batch(name, seed, n)
        loss = fast(x, y)
        ref = case.loss(eager(x), y)
        TOL.assert_close(loss, ref)
        loss.backward()
        ref.backward()
        _assert_grads(model, eager)
    plan = modelpar.plans()[-1]
    assert plan.pipeline_mode == "step"
    return plan


def _loss_outside(name: str, devices: int, batches: list[int], **pipeline) -> modelpar.compile.records.PlanRecord:
    """Compiles the model only (split mode): outputs and gradients equal
    eager for each batch size."""
    case = CASES[name]
    model = case.make_model()
    eager = copy.deepcopy(model)
    fast = torch.compile(model, backend="modelpar",
                         options={"strict": True, "devices": devices, "pipeline": _pipeline(**pipeline)})
    for seed, n in enumerate(batches):
        model.zero_grad()
        eager.zero_grad()
        x, y = _batch(name, seed, n)
        out, ref = fast(x), eager(x)
        TOL.assert_close(out, ref)
        case.loss(out, y).backward()
        case.loss(ref, y).backward()
        _assert_grads(model, eager)
    plan = modelpar.plans()[-1]
    assert plan.pipeline_mode == "split"
    return plan


@pytest.mark.parametrize("name", ["unet", "gpt", "inception"])
@pytest.mark.parametrize("checkpoint,portals", MATRIX)
def test_1f1b_with_the_loss_compiled_in_equals_eager(name: str, checkpoint: str, portals: bool) -> None:
    plan = _loss_inside(name, 2, [8], schedule="1f1b", checkpoint=checkpoint, portals=portals)
    assert plan.pipeline.num_stages == 2
    assert plan.pipeline.schedule == "1f1b"


@pytest.mark.parametrize("name", ["unet", "gpt", "inception"])
@pytest.mark.parametrize("checkpoint,portals", MATRIX)
def test_gpipe_with_the_loss_outside_equals_eager(name: str, checkpoint: str, portals: bool) -> None:
    plan = _loss_outside(name, 2, [8], schedule="gpipe", checkpoint=checkpoint, portals=portals)
    assert plan.pipeline.num_stages == 2


def test_gpipe_with_the_loss_compiled_in_and_four_stages() -> None:
    plan = _loss_inside("gpt", 4, [8], schedule="gpipe", microbatches=4)
    assert plan.pipeline.num_stages == 4
    # The decoder's blocks are chain layers (nested module names merged).
    text = str(plan)
    assert "[pipeline]" in text and "4 stages on 4 devices" in text, text


@pytest.mark.parametrize("microbatches", [4, 1])
def test_interleaved_with_the_loss_compiled_in_equals_eager(microbatches: int) -> None:
    """Interleaved 1F1B (options reach planPipeline): GPT's layers on 2
    devices x 2 virtual stages placed looping; one micro-batch, fewer than
    devices, too."""
    plan = _loss_inside("gpt", 2, [8], schedule="interleaved", virtual_stages=2,
                        microbatches=microbatches)
    assert plan.pipeline.num_stages == 4
    assert plan.pipeline.stage_device == [0, 1, 0, 1] and plan.pipeline.virtual_stages == 2


@pytest.mark.parametrize("microbatches", [4, 1])
def test_zb_v_with_the_loss_compiled_in_equals_eager(microbatches: int) -> None:
    """ZB-V (options reach planPipeline): GPT's layers in 4 stages placed in
    a V on 2 devices (device 0 holds the first and the last), backwards split
    into B and W; one micro-batch, fewer than devices, too. Loss and every
    gradient equal eager."""
    plan = _loss_inside("gpt", 2, [8], schedule="zb-v", microbatches=microbatches)
    assert plan.pipeline.schedule == "zb-v"
    assert plan.pipeline.stage_device == [0, 1, 1, 0] and plan.pipeline.virtual_stages == 2


@pytest.mark.parametrize("devices", [2, 3])
def test_zb_h1_with_the_loss_compiled_in_equals_eager(devices: int) -> None:
    """ZB-H1 (options reach planPipeline): each backward split into B (the
    gradient sent back) and W (weight gradients, deferred); loss and every
    gradient equal eager."""
    plan = _loss_inside("gpt", devices, [8], schedule="zb-h1", microbatches=4)
    assert plan.pipeline.schedule == "zb-h1"
    assert plan.pipeline.num_stages == devices


def test_per_layer_recompute_fits_a_binding_limit_and_equals_eager() -> None:
    """checkpoint='per_layer' (Note [Recompute per layer]): with no limit it
    recomputes nothing; at a limit between always's peak and never's it
    recomputes some of GPT's layers, not all, every device's simulated peak
    fits, and the loss and every gradient equal eager."""
    free = _loss_inside("gpt", 2, [8], schedule="1f1b", checkpoint="per_layer")
    assert free.pipeline.recomputed_layers == []
    never_peak = max(free.pipeline.peak_bytes)
    always_peak = max(_loss_inside("gpt", 2, [8], schedule="1f1b", checkpoint="always").pipeline.peak_bytes)
    assert always_peak < never_peak
    limit = (always_peak + never_peak) // 2
    plan = _loss_inside("gpt", 2, [8], schedule="1f1b", checkpoint="per_layer",
                        options={"memory": limit}).pipeline
    assert 0 < len(plan.recomputed_layers) < len(plan.stage_of_layer), plan.recomputed_layers
    assert max(plan.peak_bytes) <= limit
    assert "recomputed: " in str(plan)


@pytest.mark.parametrize("name", ["gpt", "unet"])
def test_relayed_skips_over_three_stages_equal_eager(name: str) -> None:
    # portals=False forwards what skips a stage through the stages between
    # (pass relay-skips); GPT's view sizes, ints read three stages on, were
    # relayed as `alias` too and failed at run time as 0-dim tensors.
    plan = _loss_inside(name, 3, [8], schedule="1f1b", microbatches=2, portals=False)
    assert plan.pipeline.num_stages == 3


def test_the_min_cut_partitioners_recompute_runs_in_a_pipeline_and_is_not_checkpointed_again() -> None:
    # partitioner="min_cut" moves cheap forward ops into the backward (phase
    # recompute), like a model that checkpoints itself: without a checkpoint
    # key the pipeline adds no checkpointing of its own ...
    plan = _loss_inside("gpt", 2, [8], {"partitioner": "min_cut"}, schedule="1f1b")
    assert "phase=recompute" in str(plan.step_graph)
    torch._dynamo.reset()
    # ... and a checkpoint mode asked for by name says where the recompute comes from.
    with pytest.raises(modelpar.ConfigError,
                       match=r"already a recompute node: .*partitioner='min_cut' recomputes part "
                             r"of the forward.*checkpoint='never'"):
        _loss_inside("gpt", 2, [8], {"partitioner": "min_cut"}, checkpoint="except_last")


def test_new_batch_sizes_plan_again_and_uneven_microbatches_are_exact() -> None:
    plan = _loss_inside("inception", 2, [8, 10, 8], schedule="1f1b", microbatches=4)
    assert sorted(plan.pipeline_batches) == [8, 10]
    assert plan.pipeline_batches[10].microbatch_sizes == [3, 3, 3, 1]
    plan = _loss_outside("unet", 2, [6, 5], schedule="gpipe", microbatches=3)
    assert sorted(plan.pipeline_batches) == [5, 6]


def test_the_tangent_scales_the_kept_gradients() -> None:
    case = CASES["gpt"]
    model = case.make_model()
    eager = copy.deepcopy(model)
    fast = torch.compile(lambda x, y: case.loss(model(x), y), backend="modelpar",
                         options={"devices": 2, "pipeline": {"schedule": "1f1b"}})
    x, y = _batch("gpt", 0, 4)
    (fast(x, y) * 2.5).backward()
    (case.loss(eager(x), y) * 2.5).backward()
    _assert_grads(model, eager)


@pytest.mark.parametrize("schedule,microbatches", [("1f1b", 2), ("gpipe", 3), ("1f1b*", 4)])
@pytest.mark.parametrize("class_weights", [False, True])
def test_padded_labels_and_class_weights_weigh_micro_batches_by_their_targets(
        schedule: str, microbatches: int, class_weights: bool) -> None:
    """Cross entropy's mean divides by the targets it counts: labels of
    ignore_index (-100: padding) do not count, class weights weigh them. With
    the padding in the first rows only, micro-batches count different
    numbers of targets; before Note [Counted means] the pipelined loss was
    2.796 for eager's 2.915. Loss and every gradient equal eager."""
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Embedding(16, 8), torch.nn.Linear(8, 8), torch.nn.ReLU(),
                                torch.nn.Linear(8, 16))
    eager = copy.deepcopy(model)
    weight = torch.rand(16) + 0.5 if class_weights else None

    def step(m: torch.nn.Module, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        return torch.nn.functional.cross_entropy(m(x).flatten(0, 1), y.flatten(), weight=weight)

    fast = torch.compile(lambda x, y: step(model, x, y), backend="modelpar",
                         options={"devices": 2, "strict": True,
                                  "pipeline": {"schedule": schedule, "microbatches": microbatches}})
    g = torch.Generator().manual_seed(1)
    x, y = torch.randint(0, 16, (6, 6), generator=g), torch.randint(0, 16, (6, 6), generator=g)
    y[:2, 1:] = -100  # the first two rows are mostly padding
    loss, ref = fast(x, y), step(eager, x, y)
    # Sums of 8-16 terms, 3 layers forward and back, split over micro-batches.
    tol = Reordered(36, depth=6)
    tol.assert_close(loss.detach(), ref.detach())
    loss.backward()
    ref.backward()
    for (n, p), q in zip(model.named_parameters(), eager.parameters()):
        tol.assert_close(p.grad, q.grad, msg=lambda m, n=n: f"grad of {n}: {m}")
    plan = modelpar.plans()[-1]
    assert plan.pipeline.num_stages == 2
    assert "2 CPU worker devices (pipeline)" in plan.runs_on, plan.runs_on


def test_momentum_sgd_steps_equal_eager() -> None:
    case = CASES["unet"]
    model = case.make_model()
    eager = copy.deepcopy(model)
    fast = torch.compile(model, backend="modelpar", options={"devices": 2, "pipeline": {}})
    opt = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)
    ref_opt = torch.optim.SGD(eager.parameters(), lr=0.05, momentum=0.9)
    for step in range(3):
        x, y = _batch("unet", step, 4)
        out, ref = fast(x), eager(x)
        TOL.assert_close(out, ref)
        case.loss(out, y).backward()
        case.loss(ref, y).backward()
        opt.step()
        ref_opt.step()
        opt.zero_grad()
        ref_opt.zero_grad()
    for (n, p), q in zip(model.named_parameters(), eager.parameters()):
        TOL.after(steps=3).assert_close(p, q, msg=lambda m, n=n: f"{n}: {m}")


@pytest.mark.parametrize("mode", ["inside", "outside"])
def test_one_microbatch_is_the_whole_batch_even_for_batch_norm(mode: str) -> None:
    # One micro-batch (microbatches=1, or a batch of 1): the layers cut into
    # stages, run in turn. Its copies keep the graph's names (the outputs
    # are found by name: a `.mb0` suffix had made both modes fail with a
    # KeyError) and batch norm needs no deferring: its statistics are the
    # whole batch's, so even batch_norm="refuse" trains like eager.
    run = _loss_inside if mode == "inside" else _loss_outside
    schedule = "1f1b" if mode == "inside" else "gpipe"
    plan = run("cnn", 2, [8], schedule=schedule, microbatches=1, batch_norm="refuse")
    assert plan.pipeline.num_stages == 2 and plan.pipeline.microbatch_sizes == [8]


def test_deferred_batch_norm_updates_running_stats_from_the_whole_batch() -> None:
    case = CASES["cnn"]
    model = case.make_model()
    eager = copy.deepcopy(model)
    fast = torch.compile(lambda x, y: case.loss(model(x), y), backend="modelpar",
                         options={"devices": 2, "pipeline": {"batch_norm": "deferred",
                                                             "schedule": "1f1b"}})
    x, y = _batch("cnn", 0, 8)
    fast(x, y).backward()
    case.loss(eager(x), y).backward()
    # bn1 sees the same input as eager: its running statistics, computed once
    # from the whole batch, are eager's. bn2's input was normalised by bn1 per
    # micro-batch (deferred batch norm's semantics, as in torchgpipe), so its
    # statistics only move; every counter counts one step.
    TOL.assert_close(model.bn1.running_mean, eager.bn1.running_mean)
    TOL.assert_close(model.bn1.running_var, eager.bn1.running_var)
    assert not torch.equal(model.bn2.running_mean, torch.zeros(16))
    torch.testing.assert_close(model.bn2.running_mean, eager.bn2.running_mean, rtol=0.05, atol=1e-3)  # semantics, not rounding: see above
    assert int(model.bn1.num_batches_tracked) == int(model.bn2.num_batches_tracked) == 1


def test_batch_norm_refused_on_request_names_the_deferred_option() -> None:
    case = CASES["cnn"]
    model = case.make_model()
    fast = torch.compile(lambda x, y: case.loss(model(x), y), backend="modelpar",
                         options={"devices": 2, "pipeline": {"batch_norm": "refuse"}})
    with pytest.raises(modelpar.UnsupportedOpError, match="deferred"):
        fast(*_batch("cnn", 0, 8))


def test_eval_mode_batch_norm_splits_like_any_per_sample_op() -> None:
    """Running statistics make eval-mode batch norm per-sample: micro-batched
    it equals the full batch, forward and backward."""
    case = CASES["cnn"]
    model = case.make_model().eval()
    eager = copy.deepcopy(model)
    fast = torch.compile(lambda x, y: case.loss(model(x), y), backend="modelpar",
                         options={"devices": 2, "pipeline": {"schedule": "1f1b"}})
    x, y = case.batch(0, 8)
    TOL.assert_close(fast(x, y).detach(), case.loss(eager(x), y).detach())


def test_inference_is_pipelined_forward_only() -> None:
    case = CASES["inception"]
    model = case.make_model()
    fast = torch.compile(model, backend="modelpar", options={"devices": 2, "pipeline": {}})
    x, _ = _batch("inception", 0, 8)
    with torch.no_grad():
        TOL.assert_close(fast(x), model(x))
    assert modelpar.plans()[-1].pipeline_mode == "inference"


def _inner(err: pytest.ExceptionInfo) -> BaseException:
    e = err.value
    return getattr(e, "inner_exception", None) or e


@pytest.mark.parametrize("name", ["mlp", "gpt", "unet"])
@pytest.mark.parametrize("loss", ["inside", "outside"])
def test_a_static_batch_is_traced_again_as_a_symbolic_one(name: str, loss: str) -> None:
    """No mark_dynamic: the backend asks Dynamo to trace again with the batch
    dynamic (Note [A static batch under the pipeline option]). GPT with its
    model alone compiled reads a size before its first op (``idx.shape[1]``),
    which once made Dynamo's retrace raise SpeculationLogDivergence."""
    case = CASES[name]
    model = case.make_model()
    eager = copy.deepcopy(model)
    options = {"strict": True, "devices": 2, "pipeline": {}}
    if loss == "inside":
        fast = torch.compile(lambda x, y: case.loss(model(x), y), backend="modelpar",
                             options=options)
    else:
        compiled = torch.compile(model, backend="modelpar", options=options)
        fast = lambda x, y: case.loss(compiled(x), y)  # noqa: E731
    for seed in range(2):
        model.zero_grad()
        eager.zero_grad()
        x, y = case.batch(seed, 8)
        got, want = fast(x, y), case.loss(eager(x), y)
        TOL.assert_close(got, want)
        got.backward()
        want.backward()
        _assert_grads(model, eager)
        assert not hasattr(x, "_dynamo_dynamic_indices")  # only the weak, non-enforced mark
    assert modelpar.plans()[-1].pipeline_mode == ("step" if loss == "inside" else "split")


class _FixedBatch(torch.nn.Module):
    """A model that writes the batch size into its code: Dynamo must
    specialise the batch, so it cannot be split."""

    def __init__(self) -> None:
        super().__init__()
        self.fc1, self.fc2 = torch.nn.Linear(16, 8), torch.nn.Linear(8, 4)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.fc2(self.fc1(x).reshape(8, 8))


def test_a_batch_dynamo_keeps_static_says_why_and_what_to_do() -> None:
    fast = torch.compile(_FixedBatch(), backend="modelpar", options={"devices": 2, "pipeline": {}})
    with pytest.raises(Exception) as err:
        fast(torch.randn(8, 16))
    inner = _inner(err)
    assert isinstance(inner, modelpar.ConfigError), inner
    assert "Dynamo specialised it" in str(inner) and "uses the batch size as a number" in str(inner), inner


def test_1f1b_with_the_loss_outside_runs_fill_drain_and_says_to_compile_the_loss() -> None:
    case = CASES["mlp"]
    model = case.make_model()
    eager = copy.deepcopy(model)
    fast = torch.compile(model, backend="modelpar",
                         options={"devices": 2, "pipeline": {"schedule": "1f1b"}})
    x, _ = _batch("mlp", 0, 8)
    with pytest.warns(UserWarning, match=r"runs fill-drain \('gpipe'\) instead of '1f1b'.*"
                                         r"compile a function that returns the loss"):
        out = fast(x)
    TOL.assert_close(out, eager(x))
    out.sum().backward()
    eager(x).sum().backward()
    for p, q in zip(model.parameters(), eager.parameters()):
        TOL.assert_close(p.grad, q.grad)
    assert modelpar.plans()[-1].pipeline.schedule == "gpipe"


@pytest.mark.parametrize("pipeline,match", [
    ({"microbatch": 4}, "unknown pipeline key"),
    ({"schedule": "zb-x"}, "'gpipe', '1f1b', '1f1b\\*', 'interleaved', 'zb-h1', 'zb-v'"),
    ({"schedule": "zb-v", "virtual_stages": 3}, "exactly 2 with schedule 'zb-v'"),
    ({"virtual_stages": 2}, "more than 1 only with schedule 'interleaved' \\(got 'gpipe'\\)"),
    ({"schedule": "interleaved", "virtual_stages": -1}, "virtual_stages takes an int >= 0"),
    ({"microbatches": 0}, "an int >= 1"),
    ({"partition": "madpipe", "schedule": "gpipe"}, "only with schedule '1f1b\\*'"),
    ({"portals": "yes"}, "True or False"),
    ([4], "None or a dict"),
])
def test_bad_pipeline_options_are_refused_before_tracing(pipeline, match: str) -> None:
    with pytest.raises(modelpar.ConfigError, match=match):
        modelpar.planning.options.resolve_options({"devices": 2, "pipeline": pipeline})


def test_a_step_that_does_not_fit_raises_before_running() -> None:
    case = CASES["mlp"]
    model = case.make_model()
    before = {k: v.clone() for k, v in model.state_dict().items()}
    fast = torch.compile(lambda x, y: case.loss(model(x), y), backend="modelpar",
                         options={"devices": 2, "memory": "4KiB", "pipeline": {}})
    with pytest.raises(modelpar.PlanDoesNotFitError):
        fast(*_batch("mlp", 0, 8))
    for k, v in model.state_dict().items():
        torch.testing.assert_close(v, before[k])


def _threads() -> int:
    return len(os.listdir("/proc/self/task"))


def test_many_batch_sizes_keep_threads_and_cached_steps_bounded() -> None:
    """Each batch size's pipelined step holds executors (worker threads);
    only MAX_BATCH_SIZES are kept, least recently used dropped, so a loop
    over many batch sizes keeps its thread count flat; a dropped size plans
    again and still equals eager."""
    from modelpar.compile import pipeline_step as compile_pipeline
    case = CASES["mlp"]
    model = case.make_model()
    eager = copy.deepcopy(model)
    fast = torch.compile(lambda x, y: case.loss(model(x), y), backend="modelpar",
                         options={"devices": 2, "pipeline": {"microbatches": 2,
                                                             "schedule": "1f1b"}})
    sizes = list(range(2, 2 + compile_pipeline.MAX_BATCH_SIZES + 6))
    counts = []
    for step, n in enumerate(sizes + sizes[:3]):
        x, y = case.batch(step, n)
        TOL.assert_close(fast(x, y).detach(), case.loss(eager(x), y).detach())
        counts.append(_threads())
    plan = modelpar.plans()[-1]
    assert len(plan.pipeline_batches) == compile_pipeline.MAX_BATCH_SIZES
    assert plan.pipeline_evictions == len(sizes) + 3 - compile_pipeline.MAX_BATCH_SIZES
    assert "dropped from the cache" in str(plan)
    # Once the cache is full, every new size frees the threads of the one it drops.
    full = counts[compile_pipeline.MAX_BATCH_SIZES - 1]
    assert max(counts[compile_pipeline.MAX_BATCH_SIZES:]) <= full, counts


class _DataDependent(torch.nn.Module):
    """A data-dependent size (nonzero's count) makes Dynamo break the graph
    before the loss."""

    def __init__(self) -> None:
        super().__init__()
        self.a, self.b = torch.nn.Linear(8, 8), torch.nn.Linear(8, 8)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self.a(x)
        return self.b(h) * h.nonzero().shape[0]


def test_a_graph_break_before_the_loss_runs_fill_drain_and_says_why() -> None:
    # Note [A graph the pipeline cannot cut]: the piece before the break
    # (layers a and b) does not return the loss, so it runs fill-drain where
    # 1F1B was asked for; the pieces after it hold no layer and are placed
    # by m-ETF. The warnings carry Dynamo's reason for the break and its
    # hint; the step equals eager (two 8-wide linear layers: Reordered(8, 2)).
    model = _DataDependent()
    eager = copy.deepcopy(model)
    step = torch.compile(lambda x: model(x).sum(), backend="modelpar",
                         options={"devices": 2, "pipeline": {"schedule": "1f1b"}})
    x = torch.randn(8, 8)
    with pytest.warns(UserWarning) as caught:
        loss = step(x)
    text = "\n".join(str(w.message) for w in caught)
    assert "runs fill-drain ('gpipe') instead of '1f1b'" in text, text
    assert "no graph break before the loss" in text, text
    assert "placed by m-ETF on the 2 devices instead of pipelined: it has 0 layers" in text, text
    assert ("The last graph break Dynamo recorded in this process: Dynamic shape operator"
            in text), text
    assert "capture_dynamic_output_shape_ops" in text, text  # Dynamo's hint
    tol = Reordered(8, depth=2)
    ref = eager(x).sum()
    tol.assert_close(loss, ref)
    loss.backward()
    ref.backward()
    for p, q in zip(model.parameters(), eager.parameters()):
        tol.assert_close(p.grad, q.grad)
    plans = modelpar.plans()
    assert plans[0].pipeline.schedule == "gpipe" and plans[0].pipeline.num_stages == 2
    assert all("not pipelined" in p.runs_on for p in plans[1:]), [p.runs_on for p in plans]


def test_a_model_without_modules_is_placed_saying_it_has_no_layers() -> None:
    w = torch.nn.Parameter(torch.randn(8, 8))
    step = torch.compile(lambda x: (torch.relu(x @ w) @ w).sum(), backend="modelpar",
                         options={"devices": 2, "pipeline": {"schedule": "1f1b"}})
    x = torch.randn(8, 8)
    with pytest.warns(UserWarning, match="instead of pipelined: it has 0 layers, fewer than the 2 "
                                         "stages devices=2 asks for"):
        loss = step(x)
    ref = (torch.relu(x @ w) @ w).sum()
    Reordered(8, depth=2).assert_close(loss, ref)
    assert "not pipelined: it has 0 layers" in str(modelpar.plans()[-1])


@pytest.mark.parametrize("schedule", ["gpipe", "1f1b"])
def test_a_model_with_graph_breaks_pipelines_what_it_can_and_places_the_rest(schedule: str) -> None:
    # Pieces with fewer layers than devices are placed by m-ETF, with a
    # warning naming why; the blocks are pipelined (GPipe under 1f1b: their
    # piece does not return the loss); three momentum-SGD steps equal eager.
    case = GRAPH_BREAKS
    tol = case.tol.after(steps=3)
    torch.manual_seed(0)
    model = case.make_model()
    eager = copy.deepcopy(model)
    options = {"strict": True, "devices": 2, "pipeline": {"schedule": schedule, "microbatches": 4}}
    loss_fn = torch.nn.functional.cross_entropy
    if schedule == "gpipe":
        compiled = torch.compile(model, backend="modelpar", options=options)
        step = lambda x, y: loss_fn(compiled(x), y)  # noqa: E731
    else:
        step = torch.compile(lambda x, y: loss_fn(model(x), y), backend="modelpar", options=options)
    opt = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    ref_opt = torch.optim.SGD(eager.parameters(), lr=0.1, momentum=0.9)
    with pytest.warns(UserWarning, match=r"placed by m-ETF on the 2 devices instead of pipelined: "
                                         r"it has 1 layer \(embed\), fewer than the 2 stages"):
        for seed in range(3):
            x, y = case.batch(seed, case.batch_size)
            loss, ref = step(x, y), loss_fn(eager(x), y)
            tol.assert_close(loss.detach(), ref.detach())
            loss.backward()
            ref.backward()
            for (n, p), q in zip(model.named_parameters(), eager.parameters()):
                tol.assert_close(p.grad, q.grad, msg=lambda m, n=n: f"grad of {n}: {m}")
            opt.step()
            ref_opt.step()
            opt.zero_grad()
            ref_opt.zero_grad()
    plans = modelpar.plans()
    pipelined = [p for p in plans if p.pipeline is not None]
    placed = [p for p in plans if p.pipeline is None and p.joint is not None]
    assert len(pipelined) == 1 and pipelined[0].pipeline.num_stages == 2, [str(p) for p in plans]
    assert pipelined[0].pipeline.schedule == "gpipe"
    assert len(placed) >= 2 and all("m-etf" in p.runs_on for p in placed), [p.runs_on for p in placed]
    assert any("it has 0 layers" in (p.unpipelined or "") for p in placed), \
        [p.unpipelined for p in placed]


def test_a_pipelined_dropout_is_reproducible_under_manual_seed() -> None:
    """Note [Reproducible random ops over workers] (runtime/random_seeding.cpp):
    a pipeline's stages run their micro-batches' dropouts at once, and which
    worker reached the shared generator first decided the masks: three runs
    of GPT-2 (dropout 0.1) after torch.manual_seed(0) ended at three
    different losses. Each dropout now draws from the step's seed and its
    node: the runs are equal to the bit. The pipeline option allows dropout
    by default (Note [Random ops per micro-batch]); allow_random=False
    refuses it, naming the op."""
    transformers = pytest.importorskip("transformers")
    import torch.nn.functional as F

    def compiled(allow_random: bool | None = None):
        torch._dynamo.reset()
        torch.manual_seed(0)
        cfg = transformers.GPT2Config(vocab_size=64, n_positions=32, n_embd=32, n_layer=2,
                                      n_head=4)  # every dropout at its default 0.1
        model = transformers.GPT2LMHeadModel(cfg).train()
        fast = torch.compile(
            lambda x, y: F.cross_entropy(model(x).logits.flatten(0, 1), y.flatten()),
            backend="modelpar",
            options={"devices": 2, "strict": True,
                     "pipeline": {"schedule": "1f1b", "microbatches": 4,
                                  **({} if allow_random is None
                                     else {"allow_random": allow_random})}})
        return model, fast

    def run(model, fast) -> tuple[list[float], list[torch.Tensor]]:
        torch.manual_seed(0)
        losses = []
        for step in range(2):
            x = torch.randint(0, 64, (8, 16), generator=torch.Generator().manual_seed(step))
            loss = fast(x, torch.roll(x, -1, 1))
            loss.backward()
            losses.append(float(loss))
        return losses, [p.grad.clone() for p in model.parameters()]

    # One compile run twice from the same parameters and seed (the race was
    # between the workers of one run, not between compiles).
    model, fast = compiled()
    start = copy.deepcopy(model.state_dict())
    first = run(model, fast)
    model.load_state_dict(start)
    model.zero_grad(set_to_none=True)
    again = run(model, fast)
    assert again[0] == first[0]
    assert all(torch.equal(a, b) for a, b in zip(again[1], first[1]))
    assert first[0][0] != first[0][1]  # the steps train (and draw) apart
    with pytest.raises(modelpar.UnsupportedOpError, match="native_dropout draws random numbers"):
        run(*compiled(allow_random=False))


def test_functional_samplers_are_random_ops_by_their_schema():
    # ir/random_ops.h (isRandom): F.gumbel_softmax samples with exponential_,
    # which AOTAutograd functionalises to aten::exponential, an op the
    # name list missed: allow_random=False let it through, and the default
    # checkpointing recomputed (redrew) it in the backward. The importer
    # now marks every op the schema tags nondeterministic_seeded.
    import torch.nn.functional as F

    class Gumbel(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.a, self.b = torch.nn.Linear(8, 8), torch.nn.Linear(8, 4)

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return self.b(F.gumbel_softmax(self.a(x), tau=0.5))

    def step(allow_random: bool) -> torch.Tensor:
        torch._dynamo.reset()
        modelpar.clear_plans()
        torch.manual_seed(0)
        model = Gumbel()
        fast = torch.compile(lambda x, y: F.mse_loss(model(x), y), backend="modelpar",
                             options={"devices": 2, "strict": True,
                                      "pipeline": {"microbatches": 2,
                                                   "allow_random": allow_random}})
        g = torch.Generator().manual_seed(1)
        loss = fast(torch.randn(8, 8, generator=g), torch.randn(8, 4, generator=g))
        loss.backward()
        return loss

    with pytest.raises(modelpar.UnsupportedOpError, match="exponential"):
        step(allow_random=False)
    assert torch.isfinite(step(allow_random=True))
    text = str(modelpar.plans()[-1].step_graph)
    assert "aten::exponential" in text and "random=true" in text
