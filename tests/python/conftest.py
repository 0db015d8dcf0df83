"""pytest set-up shared by the Python tests.

MODELPAR_TEST_THREADS=N runs the whole suite with N intra-op threads
(``torch.set_num_threads``): the suite must pass with any count, since
tolerances come from tests/python/tolerances.py, not from one machine."""

from __future__ import annotations

import os

import torch


def pytest_configure(config) -> None:
    threads = os.environ.get("MODELPAR_TEST_THREADS")
    if threads:
        torch.set_num_threads(int(threads))


def pytest_report_header(config) -> str:
    return f"modelpar: torch {torch.__version__}, {torch.get_num_threads()} intra-op threads"
