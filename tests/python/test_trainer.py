"""transformers' Trainer, unmodified, training a model compiled with modelpar:
the training loop most people use. Trainer calls the model with its labels, so
the model computes its loss and returns it with the logits (Note [Only the
loss has a gradient] lets 1F1B run that), then clips the gradients
(max_grad_norm) and steps AdamW. Four steps of a small random-init Llama,
placed and pipelined over two CPU worker devices, log the losses of eager's
Trainer run.

Trainer cannot compile with modelpar itself (its torch_compile_backend takes
accelerate's list of backends), so the model is compiled before it is handed
over; the compiled module's forward takes **kwargs, which Trainer cannot read
the model's arguments from, so remove_unused_columns=False keeps the batch's
columns and label_names names the labels (without it, evaluate() computes no
loss). Then evaluate() runs the no_grad graph: its loss equals eager's."""

from __future__ import annotations

import pytest
import torch

pytest.importorskip("transformers")
pytest.importorskip("accelerate")
import transformers  # noqa: E402

import modelpar  # noqa: E402
from zoo import SEQ, VOCAB, ZOO  # noqa: E402


@pytest.fixture(autouse=True)
def _fresh_dynamo() -> None:
    torch._dynamo.reset()
    modelpar.clear_plans()


class _Tokens(torch.utils.data.Dataset):
    def __init__(self, n: int) -> None:
        g = torch.Generator().manual_seed(0)
        self.rows = [torch.randint(0, VOCAB, (SEQ,), generator=g) for _ in range(n)]

    def __len__(self) -> int:
        return len(self.rows)

    def __getitem__(self, i: int) -> dict[str, torch.Tensor]:
        return {"input_ids": self.rows[i], "labels": self.rows[i].clone()}


def _train(tmp_path, options: dict | None, accumulate: int) -> tuple[list[float], float]:
    torch.manual_seed(0)
    model = ZOO["llama"].make_model()
    if options is not None:
        model = torch.compile(model, backend="modelpar", options={**options, "strict": True})
    args = transformers.TrainingArguments(
        output_dir=str(tmp_path), per_device_train_batch_size=4, max_steps=4, learning_rate=1e-3,
        gradient_accumulation_steps=accumulate, label_names=["labels"],
        max_grad_norm=1.0, logging_steps=1, report_to=[], use_cpu=True, save_strategy="no",
        seed=0, dataloader_num_workers=0, disable_tqdm=True, remove_unused_columns=False)
    trainer = transformers.Trainer(model=model, args=args, train_dataset=_Tokens(16))
    trainer.train()
    losses = [h["loss"] for h in trainer.state.log_history if "loss" in h]
    return losses, trainer.evaluate(_Tokens(8))["eval_loss"]


@pytest.mark.parametrize("options,accumulate", [
    ({"devices": 2}, 1),
    ({"devices": 2, "pipeline": {"schedule": "1f1b", "microbatches": 2}}, 2),
], ids=["placed", "1f1b-accumulating"])
def test_trainer_trains_a_modelpar_model_like_eager(tmp_path, options: dict,
                                                    accumulate: int) -> None:
    """With gradient accumulation Trainer scales each backward by the
    tokens of the whole accumulation window (num_items_in_batch)."""
    want, want_eval = _train(tmp_path / "eager", None, accumulate)
    got, got_eval = _train(tmp_path / "modelpar", options, accumulate)
    assert len(got) == len(want) == 4
    # Reordered sums of the zoo's Llama, over 4 AdamW steps (tolerances.py).
    tol = ZOO["llama"].tol.after(steps=4)
    tol.assert_close(torch.tensor(got + [got_eval]), torch.tensor(want + [want_eval]))
    plan = modelpar.plans()[-1]
    assert ("pipeline" in options) == (plan.pipeline is not None), plan
    assert all(g.runs_on == "modelpar" for g in plan.graphs.values()), plan
