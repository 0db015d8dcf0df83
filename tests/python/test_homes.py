"""The home table of parameters and buffers over ranks (issue 36,
distributed/homes.py, Note [One home table]), driven directly as the rank
executor drives it (note_inputs: which device binds each input), so no
process group is needed: the over-ranks behaviour is
test_distributed.py::test_state_dicts_over_ranks_never_return_released_or_stale_entries."""

from __future__ import annotations

import gc

import pytest
import torch

import modelpar
from modelpar.distributed import homes


def _mlp(device: str = "cpu") -> torch.nn.Sequential:
    return torch.nn.Sequential(torch.nn.Linear(64, 64), torch.nn.BatchNorm1d(64),
                               torch.nn.Linear(64, 4)).to(device)


def _run_on(model: torch.nn.Module, devices: list[int], trains: bool, **kw) -> None:
    homes.note_inputs(list(model.parameters()) + list(model.buffers()), devices, 0, trains, **kw)


def test_release_before_any_training_step_is_refused() -> None:
    # Inference graphs only (rank 1 reads everything): which copy is current
    # is not known, and releasing would leave rank 0's state dicts with zeros.
    model = _mlp()
    n = len(list(model.parameters()) + list(model.buffers()))
    _run_on(model, [1] * n, trains=False)
    with pytest.raises(modelpar.ConfigError,
                       match="homes of the parameters and buffers are not known yet.*"
                             "run a training step through the compiled function first"):
        modelpar.release_unowned(model)
    assert float(model[0].weight.detach().abs().sum()) > 0  # nothing released


def test_release_after_a_training_step_frees_what_other_ranks_own() -> None:
    model = _mlp()
    n = len(list(model.parameters()) + list(model.buffers()))
    _run_on(model, [1] * n, trains=True)
    freed = modelpar.release_unowned(model)
    assert freed == sum(t.untyped_storage().nbytes() for t in model.parameters()) + \
        sum(t.untyped_storage().nbytes() for t in model.buffers())
    assert all(homes.released(p) for p in model.parameters())
    assert modelpar.release_unowned(model) == 0  # released once


def test_a_buffer_written_on_its_home_rank_is_refused_elsewhere() -> None:
    # Batch norm's running mean, written on rank 1 (its home); a graph of
    # another compile reading it on rank 0 would read a stale copy.
    bn = torch.nn.BatchNorm1d(4)
    homes.note_inputs([bn.running_mean], [1], 0, trains=True, written=[0])
    assert homes.home_rank(bn.running_mean) == 1
    with pytest.raises(modelpar.ExecutionError,
                       match=r"binds a buffer of shape \(4,\) on rank 0, but an earlier graph "
                             "bound it on rank 1"):
        homes.note_inputs([bn.running_mean], [0], 0, trains=False)


def test_an_inference_graph_that_writes_a_buffer_fixes_its_home() -> None:
    bn = torch.nn.BatchNorm1d(4)
    homes.note_inputs([bn.running_var, bn.weight], [1, 1], 0, trains=False, written=[0])
    assert homes.home_rank(bn.running_var) == 1  # written there: rank 1's copy is current
    assert homes.home_rank(bn.weight) is None     # only read: every copy is current


def test_releasing_off_the_cpu_frees_nothing_and_is_refused() -> None:
    # The CUDA branch's decision on a device every machine has: a tensor
    # that is not on the CPU is not released (on a GPU the same-shaped
    # replacement needs the same device memory: nothing would be freed).
    model = _mlp("meta")
    n = len(list(model.parameters()) + list(model.buffers()))
    _run_on(model, [1] * n, trains=True)
    with pytest.raises(modelpar.ConfigError,
                       match=r"'0.weight' \(and \d+ more\) is on meta, where releasing frees "
                             "nothing.*modelpar.materialize"):
        modelpar.release_unowned(model)
    assert homes._frees_memory(torch.device("cpu"))
    assert not homes._frees_memory(torch.device("cuda", 0))


def test_the_table_forgets_dead_tensors() -> None:
    before = homes.tracked()
    for _ in range(50):
        model = _mlp()
        n = len(list(model.parameters()) + list(model.buffers()))
        _run_on(model, [0] * n, trains=True)
        del model
    gc.collect()
    assert homes.tracked() == before
