#!/usr/bin/env bash
# Fuzzes the IR text parser with libFuzzer (tests/fuzz/ir_parser_fuzz.cpp:
# parseGraph / parseProgram, print and re-parse what parses, verify) under
# ASan + UBSan, from a seed corpus of examples/ir/*.txt, the golden pass tests
# and the round-trip test data (each file whole and split at `// -----`).
#
#   bash scripts/fuzz_parser.sh [seconds]     default 60; by hand: 600
#
# Needs clang with libFuzzer (Debian: clang-14 libclang-rt-14-dev, installed
# here if missing). Builds into build-fuzz/, keeps the grown corpus in
# build-fuzz/corpus/ (reused by the next run), writes a crashing input to
# build-fuzz/crash-* and exits non-zero. Replay one:
#   build-fuzz/tests/fuzz/ir_parser_fuzz build-fuzz/crash-<sha1>
# Results are in bench/history/2026-11.md ("IR parser under libFuzzer").
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$root"
secs="${1:-60}"
dir=build-fuzz
# Cache hits across clones at other paths (CI clones afresh): paths relative to
# the checkout, and the build folder's path left out of the hash (only the
# debug info's compile directory then names the first clone).
export CCACHE_BASEDIR="${CCACHE_BASEDIR:-$root}" CCACHE_NOHASHDIR=1

cxx="${FUZZ_CXX:-}"
if [ -z "$cxx" ]; then
  for c in clang++ clang++-14 clang++-15 clang++-16; do
    if command -v "$c" >/dev/null; then cxx="$c"; break; fi
  done
fi
if [ -z "$cxx" ] || ! echo 'extern "C" int LLVMFuzzerTestOneInput(const char*, unsigned long) { return 0; }' \
     | "$cxx" -x c++ -fsanitize=fuzzer - -o /tmp/modelpar-fuzz-probe.$$ 2>/dev/null; then
  echo "fuzz_parser: installing clang-14 with libFuzzer (libclang-rt-14-dev)"
  SUDO=""; [ "$(id -u)" = 0 ] || SUDO="sudo"
  $SUDO apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq --no-install-recommends \
    clang-14 libclang-rt-14-dev >/dev/null
  cxx=clang++-14
fi
rm -f /tmp/modelpar-fuzz-probe.$$

start=$(date +%s)
flags="-fsanitize=fuzzer-no-link,address,undefined -fno-sanitize-recover=undefined -fno-omit-frame-pointer"
if [ ! -f "$dir/build.ninja" ]; then
  cmake -S . -B "$dir" -G Ninja -DCMAKE_BUILD_TYPE=Debug -DCMAKE_CXX_COMPILER="$cxx" \
        -DCMAKE_CXX_FLAGS="$flags -O1 -g" \
        -DCMAKE_EXE_LINKER_FLAGS="-fsanitize=address,undefined" \
        -DMODELPAR_WITH_TORCH=OFF -DMODELPAR_WITH_PASSES=OFF -DMODELPAR_BUILD_TESTS=OFF \
        -DMODELPAR_FUZZ=ON >/dev/null
fi
cmake --build "$dir" --target ir_parser_fuzz
echo "fuzz_parser: built in $(( $(date +%s) - start )) s with $cxx"

# Seeds: every file whole and each `// -----` section alone.
seeds="$dir/seeds"
rm -rf "$seeds"; mkdir -p "$seeds" "$dir/corpus"
for f in examples/ir/*.txt tests/passes/golden/*.txt tests/ir/testdata/*/*.txt; do
  base="$(echo "$f" | tr '/' '_')"
  cp "$f" "$seeds/$base"
  awk -v out="$seeds/$base.part" 'BEGIN { n = 0 } /^\/\/ -----/ { n++; next } { print > (out n) }' "$f"
done

echo "fuzz_parser: $(ls "$seeds" | wc -l) seed files, $(ls "$dir/corpus" | wc -l) in the kept corpus; running $secs s"
ASAN_OPTIONS="detect_leaks=1:halt_on_error=1${ASAN_OPTIONS:+:$ASAN_OPTIONS}" \
UBSAN_OPTIONS="print_stacktrace=1:halt_on_error=1" \
"$dir/tests/fuzz/ir_parser_fuzz" "$dir/corpus" "$seeds" \
  -dict=tests/fuzz/ir.dict -max_total_time="$secs" -timeout=10 -rss_limit_mb=2048 \
  -max_len=16384 -print_final_stats=1 -artifact_prefix="$dir/" 2>"$dir/fuzz.log" || {
  rc=$?
  tail -60 "$dir/fuzz.log"
  echo "fuzz_parser: FAILED (exit $rc); the input is in $dir/crash-* (or leak-*/timeout-*/oom-*)"
  exit 1
}
grep -E '^(Done|stat::number_of_executed_units|stat::peak_rss_mb|stat::new_units_added)|#[0-9]+.*DONE' "$dir/fuzz.log" || true
echo "fuzz_parser: no crash in $secs s (corpus now $(ls "$dir/corpus" | wc -l) inputs)"
