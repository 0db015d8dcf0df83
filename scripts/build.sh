#!/usr/bin/env bash
# Configures and builds modelpar (C++ libraries, unit tests, Python extension)
# into build/, after making sure the machine is set up. Incremental and ccache'd.
#   BUILD_DIR=...   build folder (default: build)
#   BUILD_TYPE=...  CMake build type (default: Release)
#   MODELPAR_BUILD_TARGETS="_C ..."  build only these targets and what they link
#                   (default: everything). `_C`, the Python extension, is what
#                   `python -m modelpar` needs (scripts/demo.sh): 95 of the
#                   155 objects, no test.
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$root"
bash scripts/setup.sh
# Paths relative to the checkout in ccache's hash: worktrees and clean clones
# reuse each other's objects.
export CCACHE_BASEDIR="${CCACHE_BASEDIR:-$root}" CCACHE_NOHASHDIR=1
build="${BUILD_DIR:-build}"
py="$root/.venv/bin/python"
if [ ! -f "$build/build.ninja" ]; then
  cmake -S . -B "$build" -G Ninja -DCMAKE_BUILD_TYPE="${BUILD_TYPE:-Release}" \
        -DPython_EXECUTABLE="$py" >/dev/null
fi
start=$(date +%s)
targets=()
for t in ${MODELPAR_BUILD_TARGETS:-}; do targets+=(--target "$t"); done
cmake --build "$build" -j "$(nproc)" "${targets[@]}"
echo "modelpar build${MODELPAR_BUILD_TARGETS:+ (${MODELPAR_BUILD_TARGETS})}: done in $(( $(date +%s) - start )) s"
