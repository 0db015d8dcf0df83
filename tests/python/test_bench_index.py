"""Every benchmark script is listed in bench/README.md, has a section in
bench/RESULTS.md, and opens with what it measures (a docstring or a comment)."""

from __future__ import annotations

import ast
from pathlib import Path

BENCH = Path(__file__).resolve().parents[2] / "bench"


def _scripts() -> list[Path]:
    return sorted([*BENCH.glob("*.py"), *BENCH.glob("*.cpp")])


def test_every_benchmark_is_listed_and_has_results() -> None:
    index = (BENCH / "README.md").read_text()
    results = (BENCH / "RESULTS.md").read_text()
    unlisted = [p.name for p in _scripts() if f"| `{p.name}` |" not in index]
    without = [p.name for p in _scripts() if f"`bench/{p.name}`:" not in results]
    assert not unlisted, f"bench/README.md does not list {unlisted}"
    assert not without, f"bench/RESULTS.md has no section for {without}"


def test_every_benchmark_says_what_it_measures() -> None:
    silent = []
    for p in _scripts():
        text = p.read_text()
        if p.suffix == ".py":
            doc = ast.get_docstring(ast.parse(text)) or ""
        else:
            doc = "\n".join(line for line in text.splitlines()[:10] if line.startswith("//"))
        if len(doc) < 120:
            silent.append(p.name)
    assert not silent, f"benchmarks without a purpose paragraph at the top: {silent}"
