"""The ``trace`` option's files (compile/step_trace.py): the measured trace
is rewritten after every step; the simulated one, which only changes with
the plans, is read from its plan once and written once."""

from __future__ import annotations

import json
from pathlib import Path

from modelpar.compile.step_trace import StepTrace


class _Executor:
    def __init__(self) -> None:
        self.runs = 0

    def chrome_trace(self) -> str:
        self.runs += 1
        return json.dumps({"traceEvents": [
            {"name": "aten::mm", "cat": "run", "ph": "X", "pid": 0, "tid": 0, "ts": 0.0,
             "dur": float(self.runs), "args": {"node": "%mm"}}]})


class _Plan:
    step_time_us = 5.0

    def __init__(self) -> None:
        self.traces = 0

    def trace(self) -> str:
        self.traces += 1
        return json.dumps({"traceEvents": [
            {"name": "aten::mm", "cat": "run", "ph": "X", "pid": 0, "tid": 0, "ts": 0.0,
             "dur": 5.0, "args": {"node": "%mm", "phase": "fwd"}}]})


def test_the_simulated_trace_is_written_once_and_the_measured_after_every_step(
        tmp_path: Path) -> None:
    st = StepTrace(tmp_path / "step.json", tmp_path / "step.simulated.json")
    executor, plan = _Executor(), _Plan()
    writes = []
    for step in range(3):
        st.add("f_0", "step", executor, start_ns=step * 1000)
        st.complete("f_0", plan)
        writes.append(st.simulated_path.stat().st_mtime_ns)
        measured = json.loads(st.path.read_text())["traceEvents"]
        assert [e["dur"] for e in measured] == [step + 1.0]  # this step's run
    assert plan.traces == 1
    assert len(set(writes)) == 1
    simulated = json.loads(st.simulated_path.read_text())["traceEvents"]
    assert simulated == [{"name": "aten::mm", "cat": "run", "ph": "X", "pid": 0, "tid": 0,
                          "ts": 0.0, "dur": 5.0,
                          "args": {"node": "%mm", "phase": "fwd", "piece": "f_0"}}]
    other = _Plan()  # a new plan for the piece (a new batch size): written again
    st.add("f_0", "step", executor, start_ns=5000)
    st.complete("f_0", other)
    assert other.traces == 1
