#!/usr/bin/env bash
# Installs everything modelpar needs on a fresh Debian machine of this kind, idempotently:
# Debian build dependencies, a virtual environment (.venv) with torch==2.13.0 (CPU) and
# the Python test tools (pytest, hypothesis). A second run only checks and takes a few seconds.
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
if [ ! -x "$venv/bin/python" ]; then
  echo "modelpar setup: creating $venv"
  "$py" -m venv "$venv"
fi
# Bump the stamp when the list changes, so that existing venvs get the new packages.
stamp="$venv/.modelpar-deps-v5"
if [ ! -f "$stamp" ]; then
  echo "modelpar setup: installing Python packages into $venv"
  "$venv/bin/pip" install -q --upgrade pip
  # hypothesis: the options property test; transformers: the model zoo of
  # tests/python/test_model_zoo.py (small random-init configs, nothing downloaded);
  # accelerate: transformers' Trainer (tests/python/test_trainer.py); peft: LoRA
  # fine-tuning of the zoo's models (test_model_zoo.py, test_distributed.py)
  "$venv/bin/pip" install -q "torch==2.13.0" numpy pytest hypothesis pybind11 scikit-build-core \
    ninja cmake transformers accelerate peft
  touch "$stamp"
fi
echo "modelpar setup: ready ($("$venv/bin/python" -c 'import torch; print("torch", torch.__version__)'))"
