#!/usr/bin/env bash
# Runs the whole test suite: builds (scripts/build.sh), then the C++ unit tests
# (ctest) and the Python tests (pytest). Exits non-zero if anything fails.
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$root"
bash scripts/build.sh
build="${BUILD_DIR:-build}"
ctest --test-dir "$build" --output-on-failure -j "$(nproc)"
PYTHONPATH="$root/$build/python" "$root/.venv/bin/python" -m pytest tests/python -q
