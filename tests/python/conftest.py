"""pytest set-up shared by the Python tests.

MODELPAR_CPU_PROFILE and MODELPAR_CUDA_PROFILE are "off" unless set (see
pytest_configure).
MODELPAR_TEST_THREADS=N runs the whole suite with N intra-op threads
(``torch.set_num_threads``): the suite must pass with any count, since
tolerances come from tests/python/tolerances.py, not from one machine.

MODELPAR_TEST_FULL=1 runs the whole matrix, not only the CI sample
(tests/python/ci_sample.py).
"""

from __future__ import annotations

import os
import tempfile

import torch


def pytest_configure(config) -> None:
    # Plans for CPU workers are costed with a calibrated profile of the CPU
    # (modelpar/profiles/cpu.py); the suite plans with passes' default device
    # instead, so that what the tests plan does not depend on the CPU running
    # them. test_cpu_profile.py turns it on in a temporary cache; the same
    # for GPUs (modelpar/profiles/cuda.py, test_cuda_profile.py).
    # Profiles the tests write (a memory-divided variant of a test's machine
    # file: Note [Memory shared by logical devices]) go to a cache of the
    # run's own, not the user's.
    if "MODELPAR_TEST_XDG_CACHE" not in os.environ:  # one per run (xdist workers share it)
        os.environ["MODELPAR_TEST_XDG_CACHE"] = tempfile.mkdtemp(prefix="modelpar-test-cache-")
    os.environ["XDG_CACHE_HOME"] = os.environ["MODELPAR_TEST_XDG_CACHE"]
    os.environ.setdefault("MODELPAR_CPU_PROFILE", "off")
    os.environ.setdefault("MODELPAR_CUDA_PROFILE", "off")
    threads = os.environ.get("MODELPAR_TEST_THREADS")
    if threads:
        torch.set_num_threads(int(threads))


def pytest_report_header(config) -> str:
    return f"modelpar: torch {torch.__version__}, {torch.get_num_threads()} intra-op threads"
