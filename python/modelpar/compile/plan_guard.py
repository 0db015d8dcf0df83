"""``strategy="auto"``'s promise checked at run time: the plan the search
chose is timed against the one-device plan on the first real steps, and the
faster one is kept (Note [Never slower than one device])."""

from __future__ import annotations

import statistics
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

__all__ = ["PlanGuard", "GUARD_STEPS", "slower_beyond_noise"]

#: Timed steps of each plan before the guard decides (after one untimed
#: warm-up step of each).
GUARD_STEPS = 3


# Note [Never slower than one device]
# The search ranks plans by simulation, and the simulation of a CPU machine
# is off by 10-40 % where steps are short (bench/RESULTS.md, strategy
# search), so a plan that should win can lose to the one-device plan it was
# compared with. The user asked for the fastest plan, and the one-device plan
# is always a valid one (same program, one worker with every core: Note
# [Every core used] in runtime/executor.py). So on a batch size's first
# steps the guard runs the chosen plan and the one-device plan in turns
# (one warm-up step each, then GUARD_STEPS each, alternating, so that drift
# in the machine's speed falls on both), and keeps the one-device plan only
# when it was faster beyond the measurement's own noise: every one of its
# timed steps faster than every timed step of the chosen plan (the two
# samples do not overlap). Otherwise the chosen plan stays. Both plans
# compute the same step, so the training is the same either way (within
# the tolerance of a reordered sum). plans() says what was measured and
# what was kept. Not over ranks (each rank would have to agree, and the
# one-device plan would idle every rank but one) and not with the loss
# outside the compiled function (only pipelines split the step there).
def slower_beyond_noise(chosen_us: Sequence[float], one_device_us: Sequence[float]) -> bool:
    """Whether the chosen plan was slower than the one-device plan beyond the
    noise of the measurement: every one-device step faster than every
    chosen step. False when either has no timed step."""
    return bool(chosen_us) and bool(one_device_us) and max(one_device_us) < min(chosen_us)


@dataclass
class PlanGuard:
    """Alternates the ``chosen`` and ``one_device`` builds of one batch size
    (any objects: what the caller runs) and decides between them."""
    chosen: Any
    one_device: Any
    steps: int = GUARD_STEPS
    times_us: tuple[list[float], list[float]] = field(default_factory=lambda: ([], []))
    _calls: int = 0
    winner: Any = None
    summary: str = ""

    def next_build(self) -> Any:
        """What the next step runs: warm-ups first (the chosen plan's is the
        step that built it), then the two in turns."""
        k = self._calls
        if k == 0:
            return self.chosen
        return self.one_device if k % 2 == 1 else self.chosen

    def record(self, build: Any, elapsed_us: float) -> bool:
        """Notes a step's time; True once the guard has decided (``winner``
        and ``summary`` set)."""
        k = self._calls
        self._calls += 1
        if k >= 2:  # the first call of each is its warm-up
            self.times_us[0 if build is self.chosen else 1].append(elapsed_us)
        if min(len(t) for t in self.times_us) < self.steps:
            return False
        chosen, one = self.times_us
        switch = slower_beyond_noise(chosen, one)
        self.winner = self.one_device if switch else self.chosen
        self.summary = (f"measured {len(chosen)} steps each: chosen plan median "
                        f"{statistics.median(chosen):.0f} us ({min(chosen):.0f}-{max(chosen):.0f}), "
                        f"one-device plan median {statistics.median(one):.0f} us "
                        f"({min(one):.0f}-{max(one):.0f}); "
                        + ("switched to the one-device plan (faster in every step)" if switch
                           else "kept the chosen plan"))
        return True
