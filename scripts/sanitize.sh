#!/usr/bin/env bash
# Builds the C++ unit tests under sanitizers and runs them; exits non-zero on
# any sanitizer report or failing test.
#
#   bash scripts/sanitize.sh [asan|tsan|all] [ir,passes,runtime]
#
#   asan  build-asan/: -fsanitize=address,undefined -fno-sanitize-recover=undefined
#         (ASan + LeakSanitizer + UBSan, every UB report fatal)
#   tsan  build-tsan/: -fsanitize=thread
#   all   both (the default)
# The second argument picks the test executables (default: all three):
#   ir, passes  modelpar_ir_tests, modelpar_passes_tests: no PyTorch, fully
#               instrumented
#   runtime     modelpar_runtime_tests (executor, CPU workers, interpreter): our
#               code is instrumented, libtorch is not; known reports from inside
#               libtorch are suppressed (scripts/sanitizers/*.supp, each line
#               says why; none are needed today), nothing in modelpar code is.
# Times per phase are printed. Results are in bench/history/2026-11.md ("Sanitizers
# and fuzzing"). scripts/test.sh runs `asan ir` in CI (MODELPAR_HARDENING).
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$root"
which="${1:-all}"
parts="${2:-ir,passes,runtime}"
case "$which" in asan|tsan|all) ;; *) echo "usage: $0 [asan|tsan|all] [ir,passes,runtime]" >&2; exit 2 ;; esac

targets=()
for p in ${parts//,/ }; do
  case "$p" in
    ir) targets+=(modelpar_ir_tests) ;;
    passes) targets+=(modelpar_passes_tests) ;;
    runtime) targets+=(modelpar_runtime_tests) ;;
    *) echo "sanitize: unknown part '$p' (ir, passes, runtime)" >&2; exit 2 ;;
  esac
done

bash scripts/setup.sh >/dev/null
# Cache hits across clones at other paths (CI clones afresh): paths relative to
# the checkout, and the build folder's path left out of the hash (only the
# debug info's compile directory then names the first clone).
export CCACHE_BASEDIR="${CCACHE_BASEDIR:-$root}" CCACHE_NOHASHDIR=1
py="$root/.venv/bin/python"
supp="$root/scripts/sanitizers"
failed=0

# configure_and_build KIND FLAGS: build folder build-KIND, Debug (-O1 for speed,
# assertions on), CUDA off (no GPU and an uninstrumented CUDA runtime here).
configure_and_build() {
  local kind="$1" flags="$2" dir="build-$1"
  local start=$(date +%s)
  cmake -S . -B "$dir" -G Ninja -DCMAKE_BUILD_TYPE=Debug \
        -DCMAKE_CXX_FLAGS="$flags -O1 -g" \
        -DCMAKE_EXE_LINKER_FLAGS="$flags" -DCMAKE_SHARED_LINKER_FLAGS="$flags" \
        -DMODELPAR_WITH_CUDA=OFF \
        -DPython_EXECUTABLE="$py" >/dev/null
  cmake --build "$dir" -j "$(nproc)" --target "${targets[@]}"
  echo "sanitize $kind: build ${targets[*]} in $(( $(date +%s) - start )) s"
}

# run_tests KIND: each executable once (gtest runs its tests in one process, so
# the sanitizer runtime starts once per executable); a report fails the run.
run_tests() {
  local kind="$1" dir="build-$1" t log rc reports total=0
  for t in "${targets[@]}"; do
    log="$dir/$t.log"
    local start=$(date +%s)
    set +e
    "$dir/tests/$t" --gtest_brief=1 >"$log" 2>&1
    rc=$?
    set -e
    reports=$(grep -cE '^(==[0-9]+==ERROR|WARNING: ThreadSanitizer|SUMMARY: (Address|Undefined|Leak|Thread)Sanitizer)|runtime error:' "$log" || true)
    echo "sanitize $kind: $t exit $rc, $reports report lines, $(( $(date +%s) - start )) s ($(grep -E '^\[  PASSED  \]' "$log" || echo 'no PASSED line'))"
    if [ "$rc" != 0 ] || [ "$reports" != 0 ]; then
      failed=1
      grep -nE 'ERROR|WARNING: ThreadSanitizer|runtime error:|SUMMARY|FAILED' "$log" | head -40 || true
      echo "sanitize $kind: full log in $log"
    fi
  done
}

if [ "$which" = asan ] || [ "$which" = all ]; then
  configure_and_build asan "-fsanitize=address,undefined -fno-sanitize-recover=undefined -fno-omit-frame-pointer"
  # Default ASan checks (ODR violations included) plus LeakSanitizer and
  # initialisation order; no report needed silencing so far.
  ASAN_OPTIONS="detect_leaks=1:halt_on_error=1:strict_init_order=1${ASAN_OPTIONS:+:$ASAN_OPTIONS}" \
  LSAN_OPTIONS="suppressions=$supp/lsan.supp:print_suppressions=0" \
  UBSAN_OPTIONS="print_stacktrace=1:halt_on_error=1:suppressions=$supp/ubsan.supp" \
    run_tests asan
fi
if [ "$which" = tsan ] || [ "$which" = all ]; then
  configure_and_build tsan "-fsanitize=thread"
  TSAN_OPTIONS="halt_on_error=0:second_deadlock_stack=1:suppressions=$supp/tsan.supp${TSAN_OPTIONS:+:$TSAN_OPTIONS}" \
  OMP_NUM_THREADS=1 run_tests tsan
fi
if [ "$failed" != 0 ]; then
  echo "sanitize: FAILED (reports or failing tests above)"
  exit 1
fi
echo "sanitize: clean"
