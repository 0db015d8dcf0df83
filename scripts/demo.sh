#!/usr/bin/env bash
# The demo on a fresh machine: sets up what the demo needs (scripts/setup.sh
# with MODELPAR_SETUP=demo: not the test and docs tools), builds the Python
# extension alone (MODELPAR_BUILD_TARGETS=_C: not the C++ tests), and runs
# `python -m modelpar demo` (python/modelpar/demo/): a small Llama from
# transformers trained on one device, placed and pipelined on 4 CPU worker
# devices and by strategy="auto", each checked against eager; the traces and
# pipeline_timeline.png go to modelpar-demo/. Arguments go to the demo
# (--ir: the IR walk-through; --steps N; --out DIR). Times in bench/results/demo.md.
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$root"
MODELPAR_SETUP=demo MODELPAR_BUILD_TARGETS=_C bash scripts/build.sh >/dev/null
# OpenMP threads that spin while they wait (libgomp's default) slow a step of
# eager PyTorch 50x when other work holds the cores (5 s instead of 0.1 s on a
# 2-core machine at load 10); passive waits cost nothing measurable when idle.
export OMP_WAIT_POLICY="${OMP_WAIT_POLICY:-PASSIVE}"
export HF_HUB_OFFLINE=1
PYTHONPATH="$root/${BUILD_DIR:-build}/python" "$root/.venv/bin/python" -m modelpar demo "$@"
