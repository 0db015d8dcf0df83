#!/usr/bin/env bash
# Configures and builds modelpar (C++ libraries, unit tests, Python extension)
# into build/, after making sure the machine is set up. Incremental and ccache'd.
#   BUILD_DIR=...   build folder (default: build)
#   BUILD_TYPE=...  CMake build type (default: Release)
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
cmake --build "$build" -j "$(nproc)"
echo "modelpar build: done in $(( $(date +%s) - start )) s"
