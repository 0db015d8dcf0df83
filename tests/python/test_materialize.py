"""modelpar.distributed.materialize.materialize_all / materialize / untouched_like in one process
(python/modelpar/distributed/materialize.py); the ranks' side is in
test_distributed.py (a model built on the meta device trains like eager;
each rank's pages of other ranks' parameters are never resident).

Values are compared exactly: initialisation draws the same numbers from the
same generator in the same order, no arithmetic is reordered.
"""

from __future__ import annotations

import pytest
import torch
import torch.nn as nn

import modelpar
from modelpar.distributed.untouched import untouched_like
from models import MLP


class Tied(nn.Module):
    """An embedding shared with the output layer, as GPT-2 does, tied after
    both are built (the output layer's own weight is thrown away)."""

    def __init__(self) -> None:
        super().__init__()
        self.emb = nn.Embedding(50, 16)
        self.norm = nn.LayerNorm(16)
        self.bn = nn.BatchNorm1d(16)
        self.head = nn.Linear(16, 50)
        self.head.weight = self.emb.weight

    def forward(self, idx: torch.Tensor) -> torch.Tensor:
        return self.head(self.norm(self.emb(idx)))


def _on_meta(make):
    with torch.device("meta"):
        return make()


@pytest.mark.parametrize("make", [MLP, Tied], ids=["mlp", "tied"])
def test_materialize_all_gives_what_eager_construction_gives(make) -> None:
    torch.manual_seed(0)
    eager = make()
    after_eager = torch.rand(1)
    model = _on_meta(make)
    torch.manual_seed(0)
    modelpar.distributed.materialize.materialize_all(model)
    assert torch.equal(torch.rand(1), after_eager)  # the same numbers were drawn
    want = dict(eager.state_dict())
    got = dict(model.state_dict())
    assert sorted(got) == sorted(want)
    for name, value in got.items():
        assert value.device.type == "cpu"
        assert torch.equal(value, want[name]), name
    if make is Tied:  # still one tensor
        assert model.head.weight is model.emb.weight


def test_a_custom_init_is_called_per_module_in_order() -> None:
    seen = []

    def init(name: str, module: nn.Module) -> None:
        seen.append(name)
        for p in module.parameters(recurse=False):
            p.fill_(len(seen))

    model = _on_meta(MLP)
    modelpar.distributed.materialize.materialize_all(model, init=init)
    holders = [n for n, m in model.named_modules() if list(m.parameters(recurse=False))]
    assert seen == holders
    for i, name in enumerate(holders, start=1):
        module = dict(model.named_modules())[name]
        assert all(bool((p == i).all()) for p in module.parameters(recurse=False))


class Raw(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.lin = nn.Linear(4, 4)
        self.scale = nn.Parameter(torch.ones(4))


def test_a_module_the_default_init_cannot_fill_is_named_and_nothing_changes() -> None:
    model = _on_meta(Raw)
    with pytest.raises(modelpar.ConfigError, match=r"module \(the model\) \(Raw\) holds scale"):
        modelpar.distributed.materialize.materialize_all(model)
    assert all(t.device.type == "meta" for t in model.state_dict().values())
    with pytest.raises(modelpar.ConfigError, match="reset_parameters"):
        modelpar.materialize(model, lambda: None)
    assert all(t.device.type == "meta" for t in model.state_dict().values())


def test_nothing_on_meta_is_a_config_error() -> None:
    with pytest.raises(modelpar.ConfigError, match="meta device"):
        modelpar.materialize(MLP(), lambda: None)


def test_a_step_not_over_a_process_group_is_refused_and_the_model_stays_on_meta() -> None:
    model = _on_meta(MLP)
    step = torch.compile(lambda x: model(x).sum(), backend="modelpar")
    with pytest.raises(modelpar.ConfigError, match="devices': 'world'"):
        modelpar.materialize(model, step, torch.randn(8, 16))
    assert all(t.device.type == "meta" for t in model.state_dict().values())


def test_an_error_of_the_step_leaves_the_model_on_meta() -> None:
    model = _on_meta(MLP)

    def step(x: torch.Tensor) -> torch.Tensor:
        raise ValueError("the user's step failed")

    with pytest.raises(ValueError, match="the user's step failed"):
        modelpar.materialize(model, step, torch.randn(8, 16))
    assert all(t.device.type == "meta" for t in model.state_dict().values())


def test_untouched_like_keeps_shape_strides_and_dtype() -> None:
    big = torch.empty(256, 512).t()  # 512 KiB, transposed strides: an anonymous mapping
    small = torch.empty(3, 5, dtype=torch.float64)
    for t in (big, small, torch.empty(0, 4), torch.empty(2, 3, device="meta")):
        u = untouched_like(t)
        assert u.shape == t.shape and u.stride() == t.stride() and u.dtype == t.dtype
        assert u.device.type == "cpu"
    u = untouched_like(big)
    assert bool((u == 0).all())  # fresh anonymous memory reads as zeros
    u.fill_(1.0)  # and is writable
    assert float(u.sum()) == big.numel()
