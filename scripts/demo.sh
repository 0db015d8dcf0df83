#!/usr/bin/env bash
# The main demo on a fresh machine: sets up, builds, and runs `python -m modelpar demo`
# (a hand-written 2-device pipelined training step, verified and run on CPU logical devices).
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$root"
bash scripts/build.sh >/dev/null
PYTHONPATH="$root/${BUILD_DIR:-build}/python" "$root/.venv/bin/python" -m modelpar demo "$@"
