#!/usr/bin/env bash
# Installs everything modelpar needs on a fresh Debian machine of this kind, idempotently:
# Debian build dependencies, a virtual environment (.venv) with torch==2.13.0 (CPU), the
# Python test tools (pytest, hypothesis, pytest-xdist), the docs tools (mkdocs,
# mkdocs-material, mkdocstrings) and matplotlib (the demo's picture). A second run
# only checks and takes a few seconds.
#   MODELPAR_SETUP=demo  only what building and `python -m modelpar demo` need
#                        (torch, transformers, matplotlib; scripts/demo.sh): the
#                        test and docs tools come with the next plain run.
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$root"

debs=(libgtest-dev libgmock-dev libfmt-dev libbenchmark-dev nlohmann-json3-dev ninja-build ccache
      coinor-libclp-dev coinor-libcbc-dev pkg-config libgloo-dev)
missing=()
for p in "${debs[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
if ((${#missing[@]})); then
  echo "modelpar setup: installing Debian packages: ${missing[*]}"
  SUDO=""; [ "$(id -u)" = 0 ] || SUDO="sudo"
  $SUDO apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
fi

venv="$root/.venv"
py="${PYTHON:-python3.11}"
command -v "$py" >/dev/null || py=python3
# Note [One environment per machine]: a fresh clone's .venv is a link to one
# environment per machine and Python version under the user's cache (torch,
# transformers and the rest take minutes to install; a second clone, CI's
# clean clone on the same machine, reuses them). MODELPAR_VENV=local makes a
# real .venv in the checkout instead. A lock keeps two clones setting up at
# once from installing into it together.
if [ ! -e "$venv" ] && [ "${MODELPAR_VENV:-shared}" != local ]; then
  shared="${XDG_CACHE_HOME:-$HOME/.cache}/modelpar/venv-$("$py" -c 'import sys; print("py%d.%d" % sys.version_info[:2])')"
  mkdir -p "$(dirname "$shared")"
  ln -s "$shared" "$venv"
fi
lock="${XDG_CACHE_HOME:-$HOME/.cache}/modelpar/setup.lock"
mkdir -p "$(dirname "$lock")"
exec 9>"$lock"
flock 9
if [ ! -x "$venv/bin/python" ]; then
  echo "modelpar setup: creating $venv$([ -L "$venv" ] && echo " -> $(readlink "$venv")")"
  "$py" -m venv "$(readlink -f "$venv" 2>/dev/null || echo "$venv")"
fi
# Bump a stamp when its list changes, so that existing venvs get the new packages.
# Two lists: what building and the demo need, then the rest (the tests, the
# docs, the model zoo's extras), so that a first demo does not wait for them.
core_stamp="$venv/.modelpar-core-deps-v1"
stamp="$venv/.modelpar-deps-v7"  # the whole list, which holds the first
if [ ! -f "$core_stamp" ] && [ ! -f "$stamp" ]; then
  echo "modelpar setup: installing torch and the demo's packages into $venv"
  "$venv/bin/pip" install -q --upgrade pip
  # transformers: the demo's model and the model zoo of tests/python/test_model_zoo.py
  # (small random-init configs, nothing downloaded); matplotlib: the demo's
  # picture of the pipeline (python -m modelpar demo)
  "$venv/bin/pip" install -q "torch==2.13.0" numpy transformers matplotlib ninja cmake
  touch "$core_stamp"
fi
if [ ! -f "$stamp" ] && [ "${MODELPAR_SETUP:-all}" != demo ]; then
  echo "modelpar setup: installing the test and docs tools into $venv"
  # hypothesis: the options property test; accelerate: transformers' Trainer
  # (tests/python/test_trainer.py); peft: LoRA fine-tuning of the zoo's models
  # (test_model_zoo.py, test_distributed.py); pytest-xdist: parallel pytest
  # (scripts/gpu_check.sh's zoo step); mkdocs, mkdocs-material, mkdocstrings:
  # the manual (scripts/docs.sh), pinned so that its strict build does not
  # change under us; pybind11, scikit-build-core: `pip install .` (a wheel)
  "$venv/bin/pip" install -q "torch==2.13.0" numpy pytest hypothesis pybind11 scikit-build-core \
    ninja cmake transformers accelerate peft "pytest-xdist==3.8.0" "mkdocs==1.6.1" \
    "mkdocs-material==9.8.2" "mkdocstrings[python]==1.0.8" "mkdocstrings-python==2.0.11" matplotlib
  touch "$stamp"
fi
flock -u 9
echo "modelpar setup: ready ($("$venv/bin/python" -c 'import torch; print("torch", torch.__version__)'))"
