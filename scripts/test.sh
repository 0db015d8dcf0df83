#!/usr/bin/env bash
# Runs the whole test suite: builds (scripts/build.sh), builds the manual
# strictly (scripts/docs.sh: a broken link or stale reference fails), checks that the CUDA
# code compiles (scripts/check_cuda_build.sh; MODELPAR_SKIP_CUDA_CHECK=1 skips
# it), then the C++ unit tests (ctest) and the Python tests (pytest). Exits
# non-zero if anything fails.
# In CI (CI=true), or with MODELPAR_HARDENING=1, it then runs the ir/ tests
# (parser, verifier: where untrusted text enters) under ASan+UBSan
# (scripts/sanitize.sh asan ir) and fuzzes the IR parser for 30 s
# (scripts/fuzz_parser.sh 30): about 3.5 min with a cold ccache, 1.3 min warm.
# MODELPAR_HARDENING=full adds the passes/ tests under ASan+UBSan (about 6 more
# minutes to build cold on 2 cores, so not in CI); MODELPAR_HARDENING=0 skips
# all. Times are in bench/history/2026-11.md ("Sanitizers and fuzzing").
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$root"
# Each phase's seconds, printed at the end (and on failure): CI's 20-minute
# budget is spent across them (bench/RESULTS.md, "The test suite's time").
phase_start=$(date +%s) phases=""
phase() {
  local now; now=$(date +%s)
  phases+="${phases:+, }$1 $((now - phase_start)) s"
  phase_start=$now
}
trap 'echo "modelpar test phases: ${phases:-none finished}"' EXIT
bash scripts/build.sh
phase build
bash scripts/docs.sh
phase docs
build="${BUILD_DIR:-build}"
# The CUDA code has no GPU here: compile and link it against the CUDA wheel so
# it cannot rot (first run ~5 min incl. the venv, then seconds; see the script).
if [ "${MODELPAR_SKIP_CUDA_CHECK:-0}" != 1 ]; then
  bash scripts/check_cuda_build.sh
  phase cuda-compile
fi
ctest --test-dir "$build" --output-on-failure -j "$(nproc)"
phase ctest
# Two pytest workers (pytest-xdist) by default: most of a test's time is
# Dynamo and AOTAutograd tracing in one Python thread, so two workers use
# both cores; MODELPAR_TEST_WORKERS=0 runs in this process. The slowest
# tests are listed at the end (bench/RESULTS.md, "The test suite's time").
workers="${MODELPAR_TEST_WORKERS:-$(nproc)}"
xdist=()
if [ "$workers" != 0 ] && "$root/.venv/bin/python" -c "import xdist" 2>/dev/null; then
  xdist=(-n "$workers")
fi
PYTHONPATH="$root/$build/python" "$root/.venv/bin/python" -m pytest tests/python -q \
  -p no:cacheprovider --durations=30 "${xdist[@]}"
phase pytest
hardening="${MODELPAR_HARDENING:-}"
if [ -z "$hardening" ] && [ "${CI:-}" = true ]; then hardening=1; fi
if [ "$hardening" = 1 ] || [ "$hardening" = full ]; then
  if [ "$hardening" = full ]; then parts=ir,passes; else parts=ir; fi
  bash scripts/sanitize.sh asan "$parts"
  phase sanitize
  bash scripts/fuzz_parser.sh "${MODELPAR_FUZZ_SECONDS:-30}"
  phase fuzz
fi
