"""README.md's Python examples run as they are written.

Every ```python block of the README is marked by the HTML comment right above
it: ``<!-- readme-test -->`` blocks run in order as one script (later blocks
use what earlier ones made, as a reader would run them), and
``<!-- readme-test: torchrun -->`` blocks run as their own script in 2
processes under torch.distributed.run over Gloo. A block without a marker
fails the test, so an example cannot be added untested."""

from __future__ import annotations

import math
import os
import re
import socket
import subprocess
import sys
from pathlib import Path

import pytest

README = Path(__file__).resolve().parents[2] / "README.md"
LIMIT_S = 240
_BLOCK = re.compile(r"(?:<!-- readme-test(?:: (?P<kind>[\w-]+))? -->\n)?```python\n(?P<code>.*?)```",
                    re.S)


def _blocks() -> list[tuple[str | None, str]]:
    """(kind, code) of every python block: kind None for an unmarked block,
    "run" for a plain marker, else the marker's word."""
    out = []
    for m in _BLOCK.finditer(README.read_text()):
        marked = m.group(0).startswith("<!--")
        out.append(((m.group("kind") or "run") if marked else None, m.group("code")))
    return out


def _env() -> dict[str, str]:
    return {**os.environ, "OMP_NUM_THREADS": "1",
            "PYTHONPATH": os.pathsep.join(p for p in sys.path if p)}


def _free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_every_python_example_is_marked_for_a_test() -> None:
    blocks = _blocks()
    assert [k for k, _ in blocks].count("run") >= 2, "the torch.compile examples lost their marker"
    assert "torchrun" in [k for k, _ in blocks], "the torchrun example lost its marker"
    unmarked = [code.splitlines()[0] for kind, code in blocks if kind is None]
    assert not unmarked, f"README python blocks without a readme-test marker: {unmarked}"
    unknown = {kind for kind, _ in blocks} - {"run", "torchrun"}
    assert not unknown, f"unknown readme-test markers: {unknown}"


def test_the_torch_compile_examples_run(tmp_path: Path) -> None:
    script = tmp_path / "readme_examples.py"
    script.write_text("\n".join(code for kind, code in _blocks() if kind == "run"))
    run = subprocess.run([sys.executable, str(script)], cwd=tmp_path, env=_env(),
                         capture_output=True, text=True, timeout=LIMIT_S)
    assert run.returncode == 0, run.stdout[-3000:] + run.stderr[-3000:]
    # The examples print the placed plan's and the pipeline's summaries.
    assert "m-etf" in run.stdout and "1f1b" in run.stdout, run.stdout[-3000:]


@pytest.mark.parametrize("index", [i for i, (k, _) in enumerate(_blocks()) if k == "torchrun"])
def test_the_torchrun_example_runs_on_two_ranks(tmp_path: Path, index: int) -> None:
    script = tmp_path / "train.py"
    script.write_text(_blocks()[index][1])
    run = subprocess.run([sys.executable, "-m", "torch.distributed.run", "--nproc-per-node", "2",
                          "--master-port", str(_free_port()), str(script)],
                         cwd=tmp_path, env=_env(), capture_output=True, text=True, timeout=LIMIT_S)
    assert run.returncode == 0, run.stdout[-3000:] + run.stderr[-3000:]
    losses = [float(line.split()[-1]) for line in run.stdout.splitlines()
              if line.startswith("step ")]
    assert len(losses) == 3 and all(math.isfinite(v) for v in losses), run.stdout[-3000:]


def test_the_readmes_links_and_files_exist() -> None:
    """Every relative link of the README (into docs/) and every file it names
    in backquotes is there, anchors included."""
    root = README.parent
    text = README.read_text()
    missing = []
    for target in re.findall(r"\]\(([^)\s]+)\)", text):
        if "://" in target:
            continue
        path, _, anchor = target.partition("#")
        if not (root / path).exists():
            missing.append(target)
        elif anchor:
            headings = re.findall(r"^#+ (.+)$", (root / path).read_text(), re.M)
            slugs = {re.sub(r"[^\w\- ]", "", h).strip().lower().replace(" ", "-") for h in headings}
            if anchor not in slugs:
                missing.append(target)
    for span in re.findall(r"`([\w./-]+/[\w./-]*)`", text):
        if span.split("/")[0] in {"ir", "passes", "runtime", "capture", "backend", "include",
                                  "python", "tests", "examples", "bench", "scripts", "docs"}:
            if not (root / span).exists():
                missing.append(span)
    assert not missing, f"README names what is not there: {missing}"
