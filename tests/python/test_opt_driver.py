"""`python -m modelpar opt`: the golden pass files of tests/passes/golden/ give
the same IR through the command line as through the C++ golden test, and bad
input is one line on stderr with exit status 1.

The command line runs in this process (``modelpar.__main__.main`` with its
output captured: a new interpreter costs 3-10 s of importing torch, most of
this file's time when each case started one); one test runs it as
``python -m modelpar`` in a process of its own."""

from __future__ import annotations

import contextlib
import io
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
GOLDEN = sorted((ROOT / "tests" / "passes" / "golden").glob("*.txt"))


def _opt(*args: str) -> subprocess.CompletedProcess:
    """`python -m modelpar opt ARGS`, run in this process."""
    from modelpar.__main__ import main
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        try:
            code = main(["opt", *args])
        except SystemExit as e:  # argparse's usage errors
            code = e.code if isinstance(e.code, int) else 1
    return subprocess.CompletedProcess(["opt", *args], code, out.getvalue(), err.getvalue())


def _opt_process(*args: str, stdin: str | None = None) -> subprocess.CompletedProcess:
    """`python -m modelpar opt ARGS` in a new interpreter."""
    return subprocess.run([sys.executable, "-m", "modelpar", "opt", *args], input=stdin,
                          capture_output=True, text=True, env=os.environ.copy(), timeout=120)


def _case(path: Path) -> tuple[list[str], str, str]:
    text = path.read_text()
    first, rest = text.split("\n", 1)
    assert first.startswith("// RUN:"), path
    source, expected = rest.split("\n// -----\n", 1)
    return first[len("// RUN:"):].split(), source + "\n", expected


@pytest.mark.parametrize("path", GOLDEN, ids=[p.stem for p in GOLDEN])
def test_golden_file_through_the_command_line(path: Path, tmp_path: Path) -> None:
    passes, source, expected = _case(path)
    ir = tmp_path / "in.txt"
    ir.write_text(source)
    r = _opt(str(ir), *[a for p in passes for a in ("--pass", p)])
    if expected.startswith("// ERROR: "):
        assert r.returncode == 1, r.stdout
        assert expected[len("// ERROR: "):].strip() in r.stderr
        assert r.stderr.startswith("python -m modelpar opt: error: ")
        assert len(r.stderr.strip().splitlines()) == 1
    else:
        assert r.returncode == 0, r.stderr
        assert r.stdout == expected


def test_list_names_every_pass_with_what_it_reads() -> None:
    r = _opt("--list")
    assert r.returncode == 0, r.stderr
    names = [line.split()[0] for line in r.stdout.splitlines()]
    assert names == ["cost", "layer-order", "microbatch", "fuse-accumulation", "place-mtopo",
                     "place-metf", "place-msct", "lower", "rehome-inputs", "simulate"]


def test_reads_standard_input_and_dumps_every_pass(tmp_path: Path) -> None:
    _, source, expected = _case(ROOT / "tests/passes/golden/lower_diamond.txt")
    r = _opt_process("-", "--pass", "lower", "--dump-dir", str(tmp_path), stdin=source)
    assert r.returncode == 0, r.stderr
    assert r.stdout == expected
    assert (tmp_path / "diamond.opt-01-lower.txt").read_text() == expected


@pytest.mark.parametrize("args, message", [
    (["--pass", "cost:devices=0"], "option devices='0' is not valid; it takes an int from 1 to 64"),
    (["--pass", "cost:speed=fast"], "pass 'cost' has no option 'speed'"),
    (["--pass", "microbatch:microbatches=2"], "needs batch_size=B"),
    (["--pass", "cost:devices"], "is not key=value"),
])
def test_bad_pass_options_are_one_line_errors(args: list[str], message: str, tmp_path: Path) -> None:
    ir = tmp_path / "g.txt"
    ir.write_text("graph @g(%x: f32[B, 4] input) {\n  %a: f32[B, 4] = aten::relu(%x)\n"
                  "  return %a\n}\n")
    r = _opt(str(ir), *args)
    assert r.returncode == 1
    assert message in r.stderr, r.stderr


def test_malformed_ir_and_missing_file_are_one_line_errors(tmp_path: Path) -> None:
    bad = tmp_path / "bad.txt"
    bad.write_text("graph @g(%x: f32[4] input) {\n  %a: f32[4] = aten::relu(%y)\n  return %a\n}\n")
    r = _opt(str(bad), "--pass", "cost")
    assert r.returncode == 1 and "%y" in r.stderr, r.stderr
    r = _opt(str(tmp_path / "missing.txt"), "--pass", "cost")
    assert r.returncode == 1 and "cannot read" in r.stderr, r.stderr
    r = _opt(str(bad))
    assert r.returncode == 2 and "at least one --pass" in r.stderr
