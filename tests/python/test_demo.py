"""``python -m modelpar demo`` (python/modelpar/demo/): its quick form
trains a 2-layer transformers Llama eagerly and through a 1F1B pipeline on 4
CPU worker devices, checks the pipeline against eager and writes the trace
and the picture; and the picture's blocks follow the schedule."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

pytest.importorskip("transformers")
pytest.importorskip("matplotlib")

from modelpar.demo.run import run_demo  # noqa: E402
from modelpar.demo.timeline import Block, timeline_blocks  # noqa: E402


def test_quick_demo_matches_eager_and_writes_the_trace_and_the_picture(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert run_demo(out_dir=str(tmp_path), steps=2, quick=True) == 0
    out = capsys.readouterr()
    assert "all checks passed" in out.out
    assert "pipelined (1F1B)   losses max |diff|" in out.out and "MISMATCH" not in out.out
    assert "modelpar demo [4/4]" in out.err  # a progress line per stage
    for name in ("pipeline.json", "pipeline.simulated.json"):
        events = json.loads((tmp_path / name).read_text())["traceEvents"]
        assert {e["pid"] for e in events if e.get("cat") == "run"} == {0, 1, 2, 3}, name
    assert (tmp_path / "pipeline_timeline.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def _op(device: int, ts: float, dur: float, node: str, phase: str | None = None) -> dict:
    args = {"node": node} | ({"phase": phase} if phase else {})
    return {"ph": "X", "cat": "run", "pid": device, "tid": 0, "ts": ts, "dur": dur, "args": args}


def test_blocks_join_a_micro_batchs_operators_and_split_at_phase_gap_and_micro_batch() -> None:
    # device 0:  |mb0 fwd: a, (shared t), b|mb1 fwd: c|  gap  |mb1 bwd: d (phase from the
    # simulated trace)|, and a send of 2 us at 4 us.
    events = [_op(0, 0, 1, "%a.mb0", "fwd"), _op(0, 1, 1, "%t"), _op(0, 2, 1, "%b.mb0", "fwd"),
              _op(0, 3, 1, "%c.mb1", "fwd"), _op(0, 10, 2, "%d.mb1"),
              {"ph": "X", "cat": "send", "pid": 0, "tid": 1, "ts": 4, "dur": 2, "args": {}}]
    blocks = timeline_blocks(events, {"%t": "fwd", "%d.mb1": "bwd"}, gap_us=0.5)
    assert blocks == [Block(0, "fwd", 0, 0, 3), Block(0, "fwd", 1, 3, 4),
                      Block(0, "transfer", None, 4, 6), Block(0, "bwd", 1, 10, 12)]
