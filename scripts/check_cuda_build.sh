#!/usr/bin/env bash
# Compile check of the CUDA code without a GPU: builds the runtime (with its
# CUDA devices) and its tests against the CUDA torch wheel, then runs the
# CUDA tests, which skip cleanly when no GPU is visible. Idempotent: the first
# run creates .venv-cuda (torch==2.14.1, CUDA 13, ~5.5 GB from the local wheel
# cache) and configures build-cuda; later runs only rebuild what changed.
#   CUDA_HOME=...                 CUDA toolkit with nvcc (default /usr/local/cuda)
#   MODELPAR_REQUIRE_CUDA_CHECK=1 fail instead of skipping when nvcc or the wheel is missing
#   MODELPAR_JOBS=N               parallel compile jobs (default: all cores)
#   MODELPAR_CUDA_CHECK=full      build the whole project (passes, backend, the
#                                 Python module, every test) against the wheel in
#                                 build-cuda-full and import the module (~7 min
#                                 cold on 2 cores: by hand, not in CI)
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$root"
# Paths relative to the checkout in ccache's hash, as scripts/build.sh does:
# a clean clone elsewhere reuses the objects (233 s of compiling to seconds).
export CCACHE_BASEDIR="${CCACHE_BASEDIR:-$root}" CCACHE_NOHASHDIR=1
venv="$root/.venv-cuda"
full=0
[ "${MODELPAR_CUDA_CHECK:-}" = full ] && full=1
if [ "$full" = 1 ]; then build="${CUDA_BUILD_DIR:-build-cuda-full}"; passes=ON
else build="${CUDA_BUILD_DIR:-build-cuda}"; passes=OFF; fi
cuda="${CUDA_HOME:-/usr/local/cuda}"
torch_spec="torch==2.14.1"
start=$(date +%s)

skip() {
  if [ "${MODELPAR_REQUIRE_CUDA_CHECK:-0}" = 1 ]; then
    echo "modelpar cuda check: FAILED: $*" >&2
    exit 1
  fi
  echo "modelpar cuda check: skipped: $*"
  exit 0
}

[ -x "$cuda/bin/nvcc" ] || skip "no nvcc at $cuda/bin/nvcc (set CUDA_HOME)"

# Note [One environment per machine] (scripts/setup.sh): .venv-cuda links to
# one per machine under the user's cache, unless MODELPAR_VENV=local.
if [ ! -e "$venv" ] && [ "${MODELPAR_VENV:-shared}" != local ]; then
  shared="${XDG_CACHE_HOME:-$HOME/.cache}/modelpar/venv-cuda-${PYTHON:-python3.11}"
  mkdir -p "$(dirname "$shared")"
  ln -s "$shared" "$venv"
fi
lock="${XDG_CACHE_HOME:-$HOME/.cache}/modelpar/cuda-setup.lock"
mkdir -p "$(dirname "$lock")"
exec 8>"$lock"
flock 8
stamp="$venv/.modelpar-cuda-deps-v2"
if [ ! -f "$stamp" ]; then
  echo "modelpar cuda check: creating $venv with $torch_spec (CUDA wheel, several GB)"
  py="${PYTHON:-python3.11}"
  command -v "$py" >/dev/null || py=python3
  [ -x "$venv/bin/python" ] || "$py" -m venv "$(readlink -f "$venv" 2>/dev/null || echo "$venv")"
  "$venv/bin/pip" install -q "$torch_spec" numpy cmake ninja 2>&1 | grep -v "^WARNING: Location" ||
    true
  "$venv/bin/python" -c "import torch; assert torch.version.cuda, torch.__version__" ||
    skip "could not install a CUDA $torch_spec into $venv"
  touch "$stamp"
fi
setup_s=$(($(date +%s) - start))

site="$("$venv/bin/python" -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')"
nvlib="$site/nvidia/cu13/lib"
if [ ! -f "$build/build.ninja" ]; then
  mkdir -p "$build"
  # - CMake >= 3.30 (the venv's) knows nvcc's C++20 dialect flag, which
  #   torch's CUDA detection asks for;
  # - TORCH_CUDA_ARCH_LIST skips detecting a GPU (there is none here);
  # - nvrtc and the CUDA math libraries come from the nvidia-* wheels.
  "$venv/bin/cmake" -S . -B "$build" -G Ninja -DCMAKE_BUILD_TYPE=Release \
    -DCMAKE_MAKE_PROGRAM="$venv/bin/ninja" \
    -DPython_EXECUTABLE="$venv/bin/python" \
    -DMODELPAR_WITH_CUDA=ON -DMODELPAR_WITH_PASSES=$passes \
    -DCUDA_TOOLKIT_ROOT_DIR="$cuda" -DCMAKE_CUDA_COMPILER="$cuda/bin/nvcc" \
    -DTORCH_CUDA_ARCH_LIST=9.0 \
    -DCUDA_nvrtc_LIBRARY="$nvlib/libnvrtc.so.13" -DCUDA_NVRTC_LIB="$nvlib/libnvrtc.so.13" \
    -DCMAKE_EXE_LINKER_FLAGS="-Wl,-rpath-link,$nvlib:$site/torch/lib" \
    >"$build/modelpar-configure.log" 2>&1 || { tail -30 "$build/modelpar-configure.log"; exit 1; }
fi
configure_s=$(($(date +%s) - start - setup_s))

targets=(--target modelpar_runtime modelpar_runtime_tests)
[ "$full" = 1 ] && targets=()
"$venv/bin/cmake" --build "$build" -j "${MODELPAR_JOBS:-$(nproc)}" "${targets[@]}"
build_s=$(($(date +%s) - start - setup_s - configure_s))

# No GPU here: the CUDA tests must load and skip, not crash.
"$build/tests/modelpar_runtime_tests" --gtest_filter='Cuda*' --gtest_brief=1
if [ "$full" = 1 ]; then
  # The Python module of the CUDA build loads against the CUDA wheel and
  # reports its CUDA devices as built.
  case "$build" in /*) modpath="$build/python" ;; *) modpath="$root/$build/python" ;; esac
  PYTHONPATH="$modpath" "$venv/bin/python" -c \
    "import modelpar; assert modelpar._C.cuda_devices_built(); print('modelpar cuda check: module loads, cuda devices built')"
fi
echo "modelpar cuda check: ok in $(($(date +%s) - start)) s" \
     "(venv ${setup_s} s, configure ${configure_s} s, build ${build_s} s)"
