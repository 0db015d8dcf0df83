"""The demo's model and its yardstick: a small Llama from Hugging Face
transformers (random init, nothing downloaded), its batches, the training
step, eager PyTorch's run of the same steps, and how far a modelpar run may
differ from eager (the reasoning of tests/python/tolerances.py).
"""

from __future__ import annotations

import copy
import math
import os
import statistics
import time
from collections.abc import Callable
from dataclasses import dataclass, field

import torch
from torch import nn

__all__ = ["DemoModel", "Tolerance", "TrainingRun", "Check", "build_model", "train", "lm_step",
           "compare"]

U = 2.0 ** -24
"""fp32 unit roundoff."""
LAMBDA = 4.0
"""Confidence factor of the probabilistic rounding-error bound (tests/python/tolerances.py)."""


@dataclass(frozen=True)
class DemoModel:
    """The model to train, described for the printout."""
    model: nn.Module
    batches: list[torch.Tensor]  # token ids; the labels are the ids (the model shifts them)
    description: str
    layers: int
    lr: float
    tol: "Tolerance"


@dataclass(frozen=True)
class Tolerance:
    """How far an fp32 result whose sums were added up in another order may
    be from eager's: the bound of tests/python/tolerances.py (``Reordered``),
    which the package cannot import. Two summation orders of n terms differ
    by about 2 lambda sqrt(n) u relative to a result that does not cancel
    and 2 lambda n u times the size of the terms in absolute terms, per
    reduction the value went through (``depth``) and per optimizer step."""
    reduction: int
    depth: int

    def rtol(self, steps: int) -> float:
        return 2 * LAMBDA * math.sqrt(self.reduction) * U * self.depth * steps

    def atol(self, steps: int, scale: float) -> float:
        return 2 * LAMBDA * self.reduction * U * self.depth * steps * scale

    def excess(self, actual: torch.Tensor, expected: torch.Tensor, steps: int,
               scale: float) -> tuple[float, float]:
        """(max |actual - expected|, the largest ratio of an element's
        difference to its tolerance): within tolerance when the ratio is <= 1."""
        diff = (actual.detach().double() - expected.detach().double()).abs()
        bound = self.atol(steps, scale) + self.rtol(steps) * expected.detach().double().abs()
        return float(diff.max()), float((diff / bound).max())


def build_model(layers: int = 4, seed: int = 0, steps: int = 12, batch: int = 8,
                seq: int = 32, hidden: int = 64, vocab: int = 256) -> DemoModel:
    """A ``LlamaForCausalLM`` of ``layers`` decoder layers (hidden 128, MLP
    256, 4 heads of which 2 key/value, vocabulary 512), initialised from
    ``seed``, and ``steps`` batches of ``batch`` x ``seq`` random tokens.
    ``HF_HUB_OFFLINE=1``: a config is all it needs, nothing is downloaded."""
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    import transformers  # an optional dependency of modelpar; the demo's model zoo

    transformers.logging.set_verbosity_error()
    cfg = transformers.LlamaConfig(
        vocab_size=vocab, hidden_size=hidden, intermediate_size=2 * hidden,
        num_hidden_layers=layers, num_attention_heads=4, num_key_value_heads=2,
        max_position_embeddings=seq, attention_dropout=0.0)
    cfg._attn_implementation = "sdpa"
    torch.manual_seed(seed)
    model = transformers.LlamaForCausalLM(cfg).train()
    gen = torch.Generator().manual_seed(seed + 1)
    batches = [torch.randint(0, vocab, (batch, seq), generator=gen) for _ in range(steps)]
    params = sum(p.numel() for p in model.parameters())
    description = (f"LlamaForCausalLM (transformers {transformers.__version__}): {layers} decoder "
                   f"layers, hidden {hidden}, MLP {2 * hidden}, 4 heads (2 key/value), vocabulary "
                   f"{vocab}, {params / 1e6:.2f} M parameters, random init; batches of {batch} x "
                   f"{seq} tokens")
    # The longest sums: a weight gradient over batch x positions, the
    # vocabulary's softmax; about 10 reductions per decoder layer forward and
    # backward (the zoo's Llama of tests/python/zoo.py: 40 for 2 layers).
    tol = Tolerance(reduction=max(batch * seq, vocab), depth=20 * layers)
    return DemoModel(model, batches, description, layers, lr=0.05, tol=tol)


@dataclass
class TrainingRun:
    """What ``train`` leaves: each step's loss and wall time, the first
    step's largest gradient, and the parameters after the last step."""
    losses: list[float] = field(default_factory=list)
    step_s: list[float] = field(default_factory=list)
    grad_scale: float = 0.0
    params: dict[str, torch.Tensor] = field(default_factory=dict)

    def median_step_s(self, last: int) -> float:
        """The median of the last ``last`` steps' times (the first steps
        compile, and under ``strategy="auto"`` time the plans against each other)."""
        return statistics.median(self.step_s[-last:])


def train(demo: DemoModel, make_step: Callable[[nn.Module], Callable[[torch.Tensor], torch.Tensor]],
          dynamic_batch: bool = False) -> TrainingRun:
    """Trains a copy of the demo's model for one step per batch (loss,
    backward, SGD) with the step function ``make_step(model)`` returns.
    ``dynamic_batch``: the batch dimension is marked dynamic, so a pipeline,
    which plans a symbolic batch, traces the step once, not a static then a
    symbolic graph."""
    model = copy.deepcopy(demo.model)
    step = make_step(model)
    opt = torch.optim.SGD(model.parameters(), lr=demo.lr)
    run = TrainingRun()
    for i, ids in enumerate(demo.batches):
        ids = ids.clone()
        if dynamic_batch:
            torch._dynamo.mark_dynamic(ids, 0)
        start = time.perf_counter()
        loss = step(ids)
        loss.backward()
        opt.step()
        run.step_s.append(time.perf_counter() - start)
        run.losses.append(float(loss.detach()))
        if i == 0:
            run.grad_scale = max(float(p.grad.abs().max()) for p in model.parameters()
                                 if p.grad is not None)
        opt.zero_grad(set_to_none=True)
    run.params = {n: p.detach().clone() for n, p in model.named_parameters()}
    return run


def lm_step(model: nn.Module) -> Callable[[torch.Tensor], torch.Tensor]:
    """The step the demo compiles: next-token loss computed inside the model
    (the labels are the inputs; the model shifts them), so that a 1F1B
    pipeline can run each micro-batch's backward as soon as its forward."""
    return lambda ids: model(input_ids=ids, labels=ids).loss


@dataclass(frozen=True)
class Check:
    """One run compared with eager: the worst loss and parameter, each as
    max |difference| and as a fraction of its tolerance."""
    loss_diff: float
    loss_ratio: float
    param_diff: float
    param_ratio: float
    worst_param: str

    @property
    def ok(self) -> bool:
        return self.loss_ratio <= 1.0 and self.param_ratio <= 1.0

    def line(self) -> str:
        return (f"losses max |diff| {self.loss_diff:.1e} ({_pct(self.loss_ratio)} of the "
                f"tolerance), parameters {self.param_diff:.1e} ({_pct(self.param_ratio)}, "
                f"{self.worst_param})  {'OK' if self.ok else 'MISMATCH'}")


def _pct(ratio: float) -> str:
    return f"{100 * ratio:.2g} %"


def compare(demo: DemoModel, run: TrainingRun, eager: TrainingRun) -> Check:
    """The losses of every step and the parameters after the last against
    eager's, within the demo's tolerance: a loss after k steps has the
    tolerance of k steps at its own scale; a parameter moved by lr x the
    gradients, so its terms have the size of the largest gradient times the
    steps' lr, or of the parameter, whichever is larger (as
    tests/python/test_model_zoo.py)."""
    loss_diff = loss_ratio = 0.0
    for k, (a, b) in enumerate(zip(run.losses, eager.losses), start=1):
        d, r = demo.tol.excess(torch.tensor(a), torch.tensor(b), k, abs(b))
        loss_diff, loss_ratio = max(loss_diff, d), max(loss_ratio, r)
    steps = len(eager.losses)
    update_scale = demo.lr * steps * eager.grad_scale
    param_diff = param_ratio = 0.0
    worst = ""
    for name, want in eager.params.items():
        scale = max(float(want.abs().max()), update_scale)
        d, r = demo.tol.excess(run.params[name], want, steps, scale)
        param_diff = max(param_diff, d)
        if r >= param_ratio:
            param_ratio, worst = r, name
    return Check(loss_diff, loss_ratio, param_diff, param_ratio, worst)
