#!/usr/bin/env bash
# Builds the manual (docs/, mkdocs.yml) into site/ with `mkdocs build --strict`:
# a broken link or anchor, a file or Note the pages cite that the code no longer
# has, a modelpar.* name that is gone or deprecated, an API docstring naming a
# parameter its function lacks, or an option without a description
# (scripts/gen_options_doc.py) fails the build. Needs the build (the API
# reference and the options tables import the built package): run
# scripts/build.sh first, as scripts/test.sh does. Installs nothing itself
# beyond scripts/setup.sh (which pins mkdocs and its plugins).
#   BUILD_DIR=...   build folder (default: build)
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$root"
bash scripts/setup.sh >/dev/null
pkg="$root/${BUILD_DIR:-build}/python"
if [ ! -d "$pkg/modelpar" ]; then
  echo "modelpar docs: $pkg/modelpar is missing; run scripts/build.sh first" >&2
  exit 1
fi
start=$(date +%s)
PYTHONPATH="$pkg" MODELPAR_PYTHON_DIR="$pkg" NO_MKDOCS_2_WARNING=1 \
  "$root/.venv/bin/python" -m mkdocs build --strict --site-dir "$root/site"
echo "modelpar docs: site/ built in $(( $(date +%s) - start )) s"
