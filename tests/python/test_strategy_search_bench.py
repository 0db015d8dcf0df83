"""bench/strategy_search.py on a CUDA device map (issue 37 item 4) where no
GPU is visible: it must stop at once with status 2 and say what it needs,
not fail later inside torch.compile or the executor."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

SCRIPT = Path(__file__).resolve().parents[2] / "bench" / "strategy_search.py"


@pytest.mark.skipif(torch.cuda.is_available(), reason="a GPU is visible: the script would measure")
def test_cuda_device_map_without_a_gpu_exits_2_and_says_why() -> None:
    run = subprocess.run([sys.executable, str(SCRIPT), "--device-map", "cuda:0", "--devices", "2",
                          "--models", "mlp"], capture_output=True, text=True, timeout=300,
                         env={**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)})
    assert run.returncode == 2, run.stdout + run.stderr
    assert "--device-map cuda:0 needs a GPU" in run.stderr
    assert "leave --device-map out" in run.stderr
    assert "| model |" not in run.stdout  # nothing measured
