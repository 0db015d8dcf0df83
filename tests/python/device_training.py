"""The training loop the modelpar-device tests run on "cpu" (the reference)
and on "modelpar": a seeded model, seeded images and labels per step,
cross-entropy, one optimizer (and optionally scheduler) step per batch."""

from __future__ import annotations

from typing import Any, Callable

import torch

import modelpar


def train_on(device: str, make_model: Callable[[], torch.nn.Module],
             make_optimizer: Callable[[Any], torch.optim.Optimizer], steps: int, batch: int = 4,
             make_scheduler: Callable[[torch.optim.Optimizer], Any] | None = None,
             ) -> tuple[list[float], torch.nn.Module]:
    """Trains `make_model()` on `device` for `steps` batches of `batch` 3x6x6
    images with 5 classes (the same data on every device); returns the losses
    (each read with .item(), which runs a modelpar step) and the model."""
    torch.manual_seed(0)
    model = make_model().to(device)
    modelpar.attach(model)
    opt = make_optimizer(model.parameters())
    sched = make_scheduler(opt) if make_scheduler is not None else None
    losses = []
    for step in range(steps):
        g = torch.Generator().manual_seed(100 + step)
        x = torch.randn(batch, 3, 6, 6, generator=g).to(device)
        y = torch.randint(0, 5, (batch,), generator=g).to(device)
        opt.zero_grad()
        loss = torch.nn.functional.cross_entropy(model(x), y)
        loss.backward()
        opt.step()
        if sched is not None:
            sched.step()
        losses.append(loss.item())
    return losses, model
