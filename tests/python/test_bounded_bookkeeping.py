"""Bookkeeping that must not grow with the steps or outlive the compiled
code (issue 36): a plan's step times are bounded (Note [Bounded step
times]) and a plan record lets go of its executor when Dynamo drops the
compiled code (Note [Records do not keep executors], compile/records.py).
The home table's purge is tests/python/test_homes.py; long runs are
bench/bounded_resources.py."""

from __future__ import annotations

import gc
import weakref

import torch

import modelpar
from modelpar.compile.records import STEP_TIMES_KEPT
from models import MLP


def test_step_times_keep_the_last_steps_and_count_them_all() -> None:
    torch._dynamo.reset()
    fast = torch.compile(MLP(), backend="modelpar", options={"strict": True, "devices": 2})
    with torch.no_grad():
        fast(torch.randn(8, 16))
    plan = modelpar.plans()[-1]
    for k in range(3 * STEP_TIMES_KEPT):
        plan.record_run("inference", None, 0, 1000 * (k + 1))
    assert len(plan.step_times_us) == STEP_TIMES_KEPT
    assert plan.steps_measured == 3 * STEP_TIMES_KEPT + 1
    assert plan.measured_step_us == 3 * STEP_TIMES_KEPT
    assert plan.mean_step_us > 0


def test_a_record_lets_go_of_its_executor_when_dynamo_drops_the_code() -> None:
    torch._dynamo.reset()
    fast = torch.compile(MLP(), backend="modelpar", options={"strict": True, "devices": 2})
    with torch.no_grad():
        fast(torch.randn(8, 16))
    record = modelpar.plans()[-1].graphs["inference"]
    assert record.executor is not None
    gone = weakref.ref(record.executor)
    del fast
    torch._dynamo.reset()
    gc.collect()
    assert gone() is None, "the plan record kept the executor (and its worker threads) alive"
    assert record.executor is None
