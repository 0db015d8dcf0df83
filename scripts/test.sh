#!/usr/bin/env bash
# Runs the whole test suite: builds (scripts/build.sh), checks that the CUDA
# code compiles (scripts/check_cuda_build.sh; MODELPAR_SKIP_CUDA_CHECK=1 skips
# it), then the C++ unit tests (ctest) and the Python tests (pytest). Exits
# non-zero if anything fails.
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$root"
bash scripts/build.sh
build="${BUILD_DIR:-build}"
# The CUDA code has no GPU here: compile and link it against the CUDA wheel so
# it cannot rot (first run ~5 min incl. the venv, then seconds; see the script).
if [ "${MODELPAR_SKIP_CUDA_CHECK:-0}" != 1 ]; then
  bash scripts/check_cuda_build.sh
fi
ctest --test-dir "$build" --output-on-failure -j "$(nproc)"
PYTHONPATH="$root/$build/python" "$root/.venv/bin/python" -m pytest tests/python -q
