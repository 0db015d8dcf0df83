"""Which cases of a product of models and modes CI runs.

MODELPAR_TEST_FULL=1 runs the whole matrix. By default (and in CI, whose
suite must stay under 20 minutes on 2 cores) a case marked ``full`` is
skipped when given with full_only(): one whose mode and model are each covered
by another case, kept to
explore by hand (Note [The CI sample]).

Note [The CI sample]
~~~~~~~~~~~~~~~~~~~~
Most of the suite's time is torch.compile tracing a model (Dynamo and
AOTAutograd, 5-12 s a model and rank on 2 cores) and starting ranks. A
product of every model with every mode and schedule is more than CI can run
in its 20 minutes, so CI runs a covering sample: every mode (one device,
placed, each schedule, auto, over ranks, over a mesh) on several models and
every model in several modes; the rest of the product is marked ``full``
(``FULL_ONLY``) and runs with MODELPAR_TEST_FULL=1 (MODELPAR_ZOO=full too),
which is how a new mode or model is first tried.
"""

from __future__ import annotations

import os

import pytest

#: Run every case, not only the CI sample (Note [The CI sample]).
FULL = os.environ.get("MODELPAR_TEST_FULL") == "1" or os.environ.get("MODELPAR_ZOO") == "full"
#: Marks for a case that only MODELPAR_TEST_FULL=1 runs: its mode and its
#: model are each covered by another case of the CI sample.
FULL_ONLY = () if FULL else (pytest.mark.skip(
    reason="covered by the CI sample; MODELPAR_TEST_FULL=1 runs it (Note [The CI sample])"),)


def full_only(*values, id: str | None = None):  # noqa: A002 (pytest's name)
    """A parametrize case that only MODELPAR_TEST_FULL=1 runs."""
    return pytest.param(*values, marks=FULL_ONLY, id=id)
