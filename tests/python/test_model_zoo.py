"""Transparency on real models: twelve architectures from Hugging Face
transformers (tests/python/zoo.py: decoder-only LMs with rotary embeddings and
grouped-query attention, a mixture of experts, an encoder, two
encoder-decoders, two vision transformers, two CNNs), unmodified and without mark_dynamic, trained for three
momentum-SGD steps through every mode: one device, two placed devices (m-ETF,
m-SCT), pipelines on two CPU workers (GPipe with the loss outside; 1F1B and
1F1B* with the loss compiled in) x checkpoint {never, except_last}, and the
plan strategy="auto" chooses. The loss
of every step, every gradient of the first step and every parameter after the
last equal eager within the model's fp32 reduction-order tolerance
(tests/python/tolerances.py; micro-batching splits the batch sums, placement
moves sums between threads).

Under the pipeline option batch norm is torchgpipe's DeferredBatchNorm: each
micro-batch is normalised with its own statistics, so the reference for the
CNN's pipelines is eager run micro-batch by micro-batch (losses weighted by
micro-batch size, gradients summed), as torchgpipe documents.

CI runs a sample (every model in two modes, three in strategy="auto":
Note [The CI sample] in ci_sample.py); MODELPAR_TEST_FULL=1 (or
MODELPAR_ZOO=full) runs the whole matrix (about 25 minutes on 2 cores)."""

from __future__ import annotations

import copy

import pytest
import torch

pytest.importorskip("transformers")

import modelpar  # noqa: E402
from ci_sample import FULL, full_only  # noqa: E402
from tolerances import Compiled, Reordered  # noqa: E402
from zoo import ZOO, ZooCase, checkpointed, dropping, frozen_first_half, lora_adapters  # noqa: E402

MICROBATCHES = 2
STEPS = 3

MODES: dict[str, dict] = {
    "one-device": {},
    "m-etf": {"devices": 2, "placer": "m-etf"},
    "m-sct": {"devices": 2, "placer": "m-sct"},
    "gpipe-never": {"devices": 2, "pipeline": {"schedule": "gpipe", "checkpoint": "never"}},
    "gpipe-except_last": {"devices": 2, "pipeline": {"schedule": "gpipe"}},
    "1f1b-never": {"devices": 2, "pipeline": {"schedule": "1f1b", "checkpoint": "never"}},
    "1f1b-except_last": {"devices": 2, "pipeline": {"schedule": "1f1b"}},
    "1f1b*-never": {"devices": 2, "pipeline": {"schedule": "1f1b*", "checkpoint": "never"}},
    "1f1b*-except_last": {"devices": 2, "pipeline": {"schedule": "1f1b*"}},
    # the plan strategy="auto" picks on this machine (loss outside: pipelines are GPipe)
    "auto": {"devices": 2, "strategy": "auto"},
}
# strategy="auto" times every node and micro-batch size first (~12 s a model):
# CI searches a decoder, an encoder and the CNN (batch norm: one-micro-batch pipelines)
SAMPLE_AUTO = {"llama", "bert", "resnet"}


def _sampled(name: str, mode: str) -> bool:
    """Note [The CI sample] (ci_sample.py): each model once unpipelined (one
    device or m-ETF) and once pipelined (GPipe or 1F1B with checkpointing),
    in turns down the zoo, so that each of the four modes runs on six models
    and each model on two modes; strategy="auto" on SAMPLE_AUTO."""
    if mode == "auto":
        return name in SAMPLE_AUTO
    i = list(ZOO).index(name)
    return mode in ("gpipe-never" if i % 2 == 0 else "1f1b-except_last",
                    "one-device" if i // 2 % 2 == 0 else "m-etf")


@pytest.fixture(autouse=True)
def _fresh_dynamo() -> None:
    torch._dynamo.reset()
    modelpar.clear_plans()


def _options(mode: str) -> dict:
    opts = copy.deepcopy(MODES[mode])
    if "pipeline" in opts:
        opts["pipeline"]["microbatches"] = MICROBATCHES
    return {"strict": True, **opts}


def _reference_loss(case: ZooCase, model: torch.nn.Module, x: torch.Tensor, y: torch.Tensor,
                    per_microbatch: bool) -> torch.Tensor:
    if not per_microbatch:
        return case.step(model, x, y)
    n = x.shape[0]
    return sum(case.step(model, a, b) * (a.shape[0] / n)
               for a, b in zip(x.chunk(MICROBATCHES), y.chunk(MICROBATCHES)))


def _run(name: str, mode: str, prepare=None, allow_random: bool = False,
         device: str = "cpu", kernels: str = "aten") -> None:
    """``prepare``: applied to the model before it is copied for eager;
    ``allow_random``: the pipeline option's; ``device``: where the model,
    its batches and eager's copy live ("cuda": the plan's devices are
    logical devices of cuda:0, tests/python/test_cuda.py); ``kernels``: the
    option's (``"inductor"``: Inductor's kernels, within tolerances.Compiled)."""
    case = ZOO[name]
    tol = case.tol.after(steps=STEPS)
    if kernels != "aten":
        tol = Compiled(tol.reduction, tol.depth, tol.steps)
    model = case.make_model()
    if prepare is not None:
        prepare(model)
    model.to(device)
    eager = copy.deepcopy(model)
    pipelined = "pipeline" in MODES[mode]
    loss_inside = pipelined and MODES[mode]["pipeline"]["schedule"] != "gpipe"
    # Deferred batch norm normalises per micro-batch (see the module docstring).
    per_mb = pipelined and any(isinstance(m, torch.nn.BatchNorm2d) for m in model.modules())
    options = _options(mode)
    options["kernels"] = kernels
    if device != "cpu":
        options["device_map"] = f"{torch.device(device).type}:0"
    if pipelined and allow_random:
        options["pipeline"]["allow_random"] = True
    if loss_inside:
        fast = torch.compile(lambda x, y: case.step(model, x, y), backend="modelpar",
                             options=options)
    else:
        compiled = torch.compile(model, backend="modelpar", options=options)
    opt = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)
    ref_opt = torch.optim.SGD(eager.parameters(), lr=0.05, momentum=0.9)
    for step in range(STEPS):
        x, y = (t.to(device) for t in case.batch(step, case.batch_size))
        loss = fast(x, y) if loss_inside else case.loss(case.predict(compiled, x), y)
        ref = _reference_loss(case, eager, x, y, per_mb)
        tol.assert_close(loss.detach(), ref.detach(), msg=lambda m: f"{name} {mode} loss, step {step}: {m}")
        loss.backward()
        ref.backward()
        if step == 0:
            # A gradient's terms have the size of the model's gradients; some
            # are zero in exact arithmetic (attention key biases), so the
            # scale is the largest gradient, not each tensor's own.
            grad_scale = max(float(q.grad.abs().max()) for q in eager.parameters()
                             if q.grad is not None)
            for (n, p), q in zip(model.named_parameters(), eager.parameters()):
                assert (p.grad is None) == (q.grad is None), n
                if p.grad is not None:
                    tol.assert_close(p.grad, q.grad, scale=grad_scale,
                                     msg=lambda m, n=n: f"{name} {mode} grad of {n}: {m}")
        opt.step()
        ref_opt.step()
        opt.zero_grad()
        ref_opt.zero_grad()
    # Parameters moved by lr x (momentum-summed) gradients: the terms of their
    # change have the size of the largest gradient times the steps' lr.
    update_scale = 0.05 * STEPS / (1 - 0.9) * grad_scale
    for (n, p), q in zip(model.named_parameters(), eager.parameters()):
        scale = max(float(q.detach().abs().max()), update_scale)
        tol.assert_close(p.detach(), q.detach(), scale=scale,
                         msg=lambda m, n=n: f"{name} {mode} {n}: {m}")
    if not per_mb:  # batch norm's running statistics too (DeferredBatchNorm's differ by design)
        for (n, b), c in zip(model.named_buffers(), eager.buffers()):
            if b.is_floating_point():
                tol.assert_close(b, c, msg=lambda m, n=n: f"{name} {mode} buffer {n}: {m}")
    plan = modelpar.plans()[-1]
    if pipelined:  # a graph break leaves pieces the pipeline cannot cut placed instead
        # (Note [A graph the pipeline cannot cut]); the rest is pipelined
        assert any(p.pipeline is not None and p.pipeline.num_stages == 2
                   for p in modelpar.plans()), [p.runs_on for p in modelpar.plans()]
    elif mode == "auto":  # one searched and chosen plan, whichever it is
        assert plan.search is not None, plan
        assert sum(c["chosen"] for c in plan.candidates) == 1, plan.candidates
    else:
        assert all(g.runs_on == "modelpar" for g in plan.graphs.values()), plan


CASES = [pytest.param(name, mode, marks=() if FULL or _sampled(name, mode) else
                      pytest.mark.skip(reason="MODELPAR_TEST_FULL=1 runs the whole matrix"),
                      id=f"{name}-{mode}")
         for name in ZOO for mode in MODES]


@pytest.mark.parametrize("name,mode", CASES)
def test_trains_like_eager(name: str, mode: str) -> None:
    _run(name, mode)


# Inductor compiles every region of a model (tens of seconds a model and
# mode on 2 cores): CI covers kernel regions in tests/python/test_kernel_regions.py
# and MODELPAR_TEST_FULL=1 runs the zoo (Note [The CI sample]).
INDUCTOR_MODES = ("one-device", "m-etf", "gpipe-except_last", "1f1b-except_last", "auto")


@pytest.mark.parametrize("name,mode", [full_only(name, mode, id=f"{name}-{mode}")
                                       for name in ZOO for mode in INDUCTOR_MODES])
def test_trains_like_eager_with_inductor_kernels(name: str, mode: str) -> None:
    _run(name, mode, kernels="inductor")


def test_a_static_batch_needs_no_mark_dynamic_and_new_batch_sizes_replan() -> None:
    """The user's tensors are not marked; a second batch size plans again
    without a recompile (the batch is symbolic after modelpar's retrace)."""
    case = ZOO["llama"]
    model = case.make_model()
    eager = copy.deepcopy(model)
    fast = torch.compile(lambda x, y: case.step(model, x, y), backend="modelpar",
                         options={"devices": 2, "pipeline": {"schedule": "1f1b"}})
    for n in (4, 6):
        x, y = case.batch(n, n)
        case.tol.assert_close(fast(x, y).detach(), case.step(eager, x, y).detach())
    plan = modelpar.plans()[-1]
    assert sorted(plan.pipeline_batches) == [4, 6]
    assert len(modelpar.plans()) == 1  # one Dynamo graph: no recompile for the new size


def test_sequence_lengths_that_vary_keep_one_batch_symbol() -> None:
    """Batches of other lengths and sizes, as a language model gets them: after
    the length changes, Dynamo's automatic dynamic shapes give x and y batch
    symbols of their own, which modelpar writes as one (Note [One batch
    symbol] in fx_import.py), so 1F1B splits both alike; loss and every
    gradient equal eager at each call. Inputs whose batch sizes differ are a
    ConfigError naming them, before anything runs."""
    case = ZOO["llama"]
    model = case.make_model()
    eager = copy.deepcopy(model)
    fast = torch.compile(lambda x, y: case.step(model, x, y), backend="modelpar",
                         options={"devices": 2, "pipeline": {"schedule": "1f1b"}, "strict": True})
    tol = case.tol
    for k, (batch, length) in enumerate([(4, 16), (4, 12), (6, 8)]):
        x = torch.randint(0, 64, (batch, length), generator=torch.Generator().manual_seed(k))
        y = torch.roll(x, -1, dims=1)
        loss, ref = fast(x, y), case.step(eager, x, y)
        tol.assert_close(loss.detach(), ref.detach(), msg=lambda m: f"{batch}x{length} loss: {m}")
        loss.backward()
        ref.backward()
        scale = max(float(q.grad.abs().max()) for q in eager.parameters())
        for (n, p), q in zip(model.named_parameters(), eager.parameters()):
            tol.assert_close(p.grad, q.grad, scale=scale,
                             msg=lambda m, n=n: f"{batch}x{length} grad of {n}: {m}")
        model.zero_grad()
        eager.zero_grad()
    # 4 x 12 tokens against 6 x 8 labels: the same count, so eager's
    # flattened cross entropy runs, but a pipeline cannot split both alike.
    x = torch.randint(0, 64, (4, 12))
    y = torch.randint(0, 64, (6, 8))
    with pytest.raises(modelpar.ConfigError, match=r"batched inputs .* differ in size along dim 0 "
                                                   r"\(input \d+: 4, input \d+: 6\)"):
        fast(x, y)


def test_a_model_returning_its_loss_and_logits_runs_1f1b() -> None:
    """A transformers model given labels computes its loss and returns it with
    the logits, as training loops (transformers' Trainer) call it. AOTAutograd
    gives the logits a gradient input too; the step seeds the loss alone
    (Note [Only the loss has a gradient]), so 1F1B runs: loss and gradients
    equal eager. A second loss computed outside from the logits is an
    ExecutionError, and no gradient is written."""
    case = ZOO["llama"]
    model = case.make_model()
    eager = copy.deepcopy(model)
    fast = torch.compile(model, backend="modelpar",
                         options={"devices": 2, "pipeline": {"schedule": "1f1b"}, "strict": True})
    x, _ = case.batch(0, case.batch_size)
    out, ref = fast(input_ids=x, labels=x), eager(input_ids=x, labels=x)
    case.tol.assert_close(out.loss.detach(), ref.loss.detach())
    case.tol.assert_close(out.logits.detach(), ref.logits.detach())
    out.loss.backward()
    ref.loss.backward()
    scale = max(float(q.grad.abs().max()) for q in eager.parameters())
    for (n, p), q in zip(model.named_parameters(), eager.parameters()):
        case.tol.assert_close(p.grad, q.grad, scale=scale, msg=lambda m, n=n: f"grad of {n}: {m}")
    plan = modelpar.plans()[-1]
    assert plan.pipeline is not None and plan.pipeline_mode == "step", plan
    model.zero_grad(set_to_none=True)
    out = fast(input_ids=x, labels=x)
    with pytest.raises(modelpar.ExecutionError, match="nonzero gradient for another output"):
        (out.loss + out.logits.float().pow(2).mean()).backward()
    assert all(p.grad is None for p in model.parameters())


def test_masked_language_model_with_uneven_masks_pipelines_exactly() -> None:
    """BERT's masked-LM loss counts only the masked positions (labels -100
    elsewhere) and an attention mask pads one row. With the second half of
    the batch masking four times as many tokens, micro-batches count
    different numbers of targets, which Note [Counted means] weighs: loss and
    every gradient equal eager through 1F1B."""
    import transformers
    torch.manual_seed(0)
    cfg = transformers.BertConfig(vocab_size=64, hidden_size=32, num_hidden_layers=2,
                                  num_attention_heads=4, intermediate_size=64,
                                  max_position_embeddings=32, hidden_dropout_prob=0.0,
                                  attention_probs_dropout_prob=0.0)
    model = transformers.BertForMaskedLM(cfg)
    eager = copy.deepcopy(model)
    fast = torch.compile(model, backend="modelpar", options={
        "devices": 2, "pipeline": {"schedule": "1f1b", "microbatches": 2}, "strict": True})
    g = torch.Generator().manual_seed(0)
    x = torch.randint(0, 64, (4, 16), generator=g)
    masked = torch.rand(x.shape, generator=g) < 0.15
    masked[2:] |= torch.rand(x[2:].shape, generator=g) < 0.5
    labels = torch.where(masked, x, torch.full_like(x, -100))
    attention = torch.ones_like(x)
    attention[0, 10:] = 0
    out = fast(input_ids=x, attention_mask=attention, labels=labels)
    ref = eager(input_ids=x, attention_mask=attention, labels=labels)
    tol = ZOO["bert"].tol
    tol.assert_close(out.loss.detach(), ref.loss.detach())
    out.loss.backward()
    ref.loss.backward()
    scale = max(float(q.grad.abs().max()) for q in eager.parameters() if q.grad is not None)
    for (n, p), q in zip(model.named_parameters(), eager.parameters()):
        assert (p.grad is None) == (q.grad is None), n
        if q.grad is not None:
            tol.assert_close(p.grad, q.grad, scale=scale, msg=lambda m, n=n: f"grad of {n}: {m}")


def test_more_devices_than_layers_places_the_model_naming_the_layers() -> None:
    # Note [A graph the pipeline cannot cut]: m-ETF on the 8 devices, with a
    # warning naming the layers; forward and gradients equal eager (4-wide
    # dot products, 2 deep).
    model = torch.nn.Sequential(torch.nn.Linear(4, 4), torch.nn.ReLU(), torch.nn.Linear(4, 2))
    eager = copy.deepcopy(model)
    fast = torch.compile(model, backend="modelpar", options={"devices": 8, "pipeline": {}})
    x = torch.randn(8, 4)
    with pytest.warns(UserWarning, match=r"it has 3 layers \(0, 1, 2\), fewer than the 8 stages "
                                         r"devices=8 asks for"):
        out = fast(x)
    tol = Reordered(4, depth=2)
    tol.assert_close(out, eager(x))
    out.sum().backward()
    eager(x).sum().backward()
    for p, q in zip(model.parameters(), eager.parameters()):
        tol.assert_close(p.grad, q.grad)
    assert "m-etf, not pipelined" in modelpar.plans()[-1].runs_on


BF16_MODES = ["m-etf", "gpipe-never", "1f1b-except_last"]


@pytest.mark.parametrize("mode", BF16_MODES)
def test_bf16_autocast_trains_like_eager_autocast(mode: str) -> None:
    """Mixed precision as people train: the step under torch.autocast(bfloat16)
    (outside the compiled model for GPipe, inside the compiled step for 1F1B),
    fp32 parameters and optimizer. Autocast's casts are captured as explicit
    ops, so the plan runs the same bfloat16 matmuls as eager; losses and
    gradients agree within bfloat16 rounding (tolerances.assert_close_bf16:
    micro-batches round their partial weight gradients separately)."""
    from tolerances import assert_close_bf16
    case = ZOO["llama"]
    model = case.make_model()
    eager = copy.deepcopy(model)
    loss_inside = mode.startswith("1f1b")

    def step(m: torch.nn.Module, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        with torch.autocast("cpu", dtype=torch.bfloat16):
            return case.step(m, x, y)

    fast = torch.compile((lambda x, y: step(model, x, y)) if loss_inside else model,
                         backend="modelpar", options=_options(mode))
    opt = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)
    ref_opt = torch.optim.SGD(eager.parameters(), lr=0.05, momentum=0.9)
    for k in range(2):
        x, y = case.batch(k, case.batch_size)
        if loss_inside:
            loss = fast(x, y)
        else:
            with torch.autocast("cpu", dtype=torch.bfloat16):
                loss = case.loss(case.predict(fast, x), y)
        ref = step(eager, x, y)
        assert loss.dtype == ref.dtype == torch.float32  # cross entropy runs in fp32
        assert_close_bf16(loss.detach(), ref.detach(), msg=lambda m: f"{mode} loss, step {k}: {m}")
        loss.backward()
        ref.backward()
        grad_scale = max(float(q.grad.abs().max()) for q in eager.parameters())
        for (n, p), q in zip(model.named_parameters(), eager.parameters()):
            assert p.grad.dtype == torch.float32, n
            assert_close_bf16(p.grad, q.grad, scale=grad_scale,
                              msg=lambda m, n=n: f"{mode} grad of {n}, step {k}: {m}")
        opt.step()
        ref_opt.step()
        opt.zero_grad()
        ref_opt.zero_grad()
    plan = modelpar.plans()[-1]
    if mode == "m-etf":
        assert all(g.runs_on == "modelpar" for g in plan.graphs.values()), plan
        texts = [g.text for g in plan.graphs.values()]
    else:
        assert plan.pipeline is not None and plan.pipeline.num_stages == 2, plan
        texts = [str(plan.pipeline.program)]
    # The bfloat16 matmuls are in the plan, not lost in capture.
    assert any("bf16[" in t for t in texts)


@pytest.mark.parametrize("mode", ["one-device", full_only("m-etf"), "gpipe-never",
                                  full_only("1f1b-never"), "auto"])
def test_the_models_own_activation_checkpointing_trains_like_eager(mode: str) -> None:
    # transformers' gradient_checkpointing_enable: AOTAutograd recomputes the
    # checkpointed layers in the backward and wraps their attention (tagged
    # random for its dropout, 0 here) in RNG-state ops, imported as the op
    # itself (Note [Checkpointed ops that draw nothing] in fx_import.py).
    # Pipelines checkpoint nothing more (checkpoint="never"; the others say so).
    _run("llama", mode, prepare=checkpointed)
    plan = modelpar.plans()[-1]
    graph = plan.step_graph if plan.step_graph is not None else plan.graphs["backward"].graph
    assert "phase=recompute" in str(graph), "no recomputation: checkpointing did not apply"


def _replays_dropout(plan) -> bool:
    graph = plan.step_graph if plan.step_graph is not None else plan.graphs["backward"].graph
    return "aten::native_dropout_backward" in str(graph) and "phase=recompute" in str(graph)


@pytest.mark.parametrize("name,mode", [("gpt2", "one-device"), ("gpt2", "m-etf"),
                                       ("bert", "one-device")])
def test_a_checkpointed_dropout_recomputes_the_forwards_mask(name: str, mode: str) -> None:
    # GPT-2 and BERT with dropout 0.1 (embeddings, attention, residuals) under
    # their own checkpointing. Each dropout reads the one before it through the
    # residual stream, so the forward draws its masks in eager's order from
    # the same seed, on one device or placed on two; the recompute replays
    # them from the saved mask (Note [Replaying a checkpointed dropout] in
    # fx_import.py), so loss and gradients equal eager's, whose recompute
    # restores the generator. A recompute that drew again, or a mask paired
    # with another layer's recompute, would differ in every masked gradient.
    case = ZOO[name]
    model = case.make_model()
    dropping(0.1)(model)
    eager = copy.deepcopy(model)
    fast = torch.compile(model, backend="modelpar", options=_options(mode))
    for step in range(2):
        x, y = case.batch(step, case.batch_size)
        torch.manual_seed(100 + step)
        loss = case.loss(case.predict(fast, x), y)
        torch.manual_seed(100 + step)
        ref = case.loss(case.predict(eager, x), y)
        case.tol.assert_close(loss.detach(), ref.detach())
        loss.backward()
        ref.backward()
        scale = max(float(q.grad.abs().max()) for q in eager.parameters())
        for (n, p), q in zip(model.named_parameters(), eager.parameters()):
            if mode == "one-device":  # the same ops in the same order: equal to the bit
                assert torch.equal(p.grad, q.grad), n
            else:  # placement reorders sums (case.tol)
                case.tol.assert_close(p.grad, q.grad, scale=scale, msg=lambda m, n=n: f"{n}: {m}")
        model.zero_grad()
        eager.zero_grad()
    assert _replays_dropout(modelpar.plans()[-1])


@pytest.mark.parametrize("mode", ["m-etf", "gpipe-never", full_only("1f1b-never")])
def test_a_checkpointed_dropout_replays_over_devices_and_pipelines(mode: str) -> None:
    # Over devices the masks are drawn in whatever order the workers reach
    # them (and per micro-batch in pipelines), so eager's cannot be matched;
    # at p = 1 every mask is all-dropped whatever the order, and the replay's
    # plumbing (the mask saved in the forward, paired with its recompute in
    # the joint step, scale 0) must give eager's step exactly.
    _run("gpt2", mode, prepare=dropping(1.0), allow_random=True)
    assert _replays_dropout(modelpar.plans()[-1])


@pytest.mark.parametrize("name,mode", [("llama", "m-etf"), full_only("llama", "1f1b-except_last"),
                                       ("gpt2", "gpipe-never"), full_only("t5", "1f1b-never"),
                                       ("bert", "m-sct")])
def test_lora_fine_tuning_trains_like_eager(name: str, mode: str) -> None:
    """Fine-tuning as peft does it: LoRA adapters on the attention
    projections, every base weight frozen (no gradient, never updated; the
    backward returns None for it and the plan must not move or sum one)."""
    pytest.importorskip("peft")
    _run(name, mode, prepare=lora_adapters(name))


@pytest.mark.parametrize("name,mode", [("llama", "gpipe-never"), ("bert", "1f1b-except_last"),
                                       ("vit", "m-etf")])
def test_a_frozen_backbone_trains_like_eager(name: str, mode: str) -> None:
    _run(name, mode, prepare=frozen_first_half)


def test_a_model_that_checkpoints_itself_keeps_its_choice_by_default() -> None:
    # No checkpoint mode given: the pipeline adds no recomputation of its own
    # to a model that checkpoints itself (Note [A model that checkpoints
    # itself] in compile_pipeline.py), and the step equals eager's.
    case = ZOO["llama"]
    model = case.make_model()
    checkpointed(model)
    eager = copy.deepcopy(model)
    fast = torch.compile(lambda x, y: case.step(model, x, y), backend="modelpar",
                         options={"devices": 2, "strict": True,
                                  "pipeline": {"schedule": "1f1b", "microbatches": 2}})
    x, y = case.batch(0, case.batch_size)
    loss, ref = fast(x, y), case.step(eager, x, y)
    case.tol.assert_close(loss.detach(), ref.detach())
    loss.backward()
    ref.backward()
    scale = max(float(q.grad.abs().max()) for q in eager.parameters())
    for (n, p), q in zip(model.named_parameters(), eager.parameters()):
        case.tol.assert_close(p.grad, q.grad, scale=scale, msg=lambda m, n=n: f"{n}: {m}")
    plan = modelpar.plans()[-1].pipeline
    assert "checkpoint never" in str(plan), str(plan)


def test_checkpointing_a_checkpointed_model_again_says_what_to_do() -> None:
    case = ZOO["llama"]
    model = case.make_model()
    checkpointed(model)
    options = _options("1f1b-except_last")
    options["pipeline"]["checkpoint"] = "except_last"  # asked for: a default would give way
    fast = torch.compile(lambda x, y: case.step(model, x, y), backend="modelpar",
                         options=options)
    with pytest.raises(modelpar.ConfigError, match="checkpoints its own activations.*never"):
        fast(*case.batch(0, case.batch_size))


# Decoding with a KV cache: the prompt's graph, then the decode steps' graphs,
# which take the cache (whose batch Dynamo's automatic dynamism makes a
# symbol) and the new tokens (whose batch stays a number, so the symbol is
# specialised: the pipeline traces them again with a symbolic batch, Note [A
# static batch under the pipeline option]). Mistral's sliding-window mask
# sums sizes with torch.sym_sum. Encoder-decoders decode through their own
# cache classes.
# A static cache (cache_implementation="static") is made inside the prompt's
# graph and advanced in place (its position: an input written by copy_), which
# a pipeline runs after every reader (Note [In-place writes to graph inputs])
# and strategy="auto" times from the same state each run (Note [Timing a step
# that writes its inputs]).
GENERATE = [("llama", "gpipe-never", "dynamic"), ("mistral", "m-etf", "dynamic"),
            ("t5", "1f1b-never", "dynamic"), full_only("mixtral", "auto", "dynamic"),
            ("llama", "1f1b-never", "static"), ("llama", "auto", "static")]
GENERATE_FULL = [(n, m, "dynamic")
                 for n in ("llama", "qwen2", "mistral", "gpt2", "t5", "bart", "mixtral")
                 for m in ("m-etf", "gpipe-never", "1f1b-never", "auto")] + [
    ("llama", m, "static") for m in ("m-etf", "gpipe-never", "1f1b-never", "auto")]


@pytest.mark.parametrize("name,mode,cache", GENERATE_FULL if FULL else GENERATE,
                         ids=lambda v: str(v))
def test_generate_decodes_like_eager(name: str, mode: str, cache: str) -> None:
    case = ZOO[name]
    model = case.make_model().eval()
    prompt = case.batch(0, 2)[0][:, :6]
    kwargs = dict(attention_mask=torch.ones_like(prompt), max_new_tokens=6, do_sample=False,
                  output_logits=True, return_dict_in_generate=True,
                  cache_implementation=None if cache == "dynamic" else cache)
    eager = model.generate(prompt, **kwargs)
    # Greedy decoding compares tokens: a step whose two best logits were
    # within reordering error of each other could pick either.
    for step, logits in enumerate(eager.logits):
        top2 = logits.topk(2).values
        assert (top2[:, 0] - top2[:, 1]).min() > 1e-4, f"a near tie at step {step}: pick a seed"
    model.forward = torch.compile(model.forward, backend="modelpar",
                                  options={**_options(mode), "strict": True})
    out = model.generate(prompt, **kwargs)
    assert torch.equal(out.sequences, eager.sequences)
    for got, want in zip(out.logits, eager.logits):
        case.tol.assert_close(got, want)
    assert len(modelpar.plans()) >= 2  # the prompt's graph and the decode steps' graphs
