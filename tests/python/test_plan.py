"""Model-parallel planning from Python: modelpar.plan_graph (the sequence of passes
cost → coarsen → place → lower → simulate), its summary and trace, memory
strings, errors, the ``python -m modelpar plan`` command line, and
``PlanRecord.place`` on a graph captured by torch.compile."""
from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

import modelpar
from tolerances import assert_exact

EXAMPLES = Path(__file__).resolve().parents[2] / "examples" / "ir"
MLP_STEP = EXAMPLES / "mlp_step.txt"

# Every value is f32[256] = 1 KiB; with the machine below a transfer takes
# 2 us + 1024 B / (1.024e9 B/s) = 3 us. Costs are given, so the cost pass
# keeps them.
#
#        %x
#        |
#        a  10 us
#       / \
#  20 b     c 20 us
#       \ /
#        d  5 us
DIAMOND = """
graph @diamond(%x: f32[256] input) {
  %a: f32[256] = aten::relu(%x) {layer="a", cost={time_us=10.0, out=1024, temp=0, persist=0}}
  %b: f32[256] = aten::relu(%a) {layer="b", cost={time_us=20.0, out=1024, temp=0, persist=0}}
  %c: f32[256] = aten::sigmoid(%a) {layer="c", cost={time_us=20.0, out=1024, temp=0, persist=0}}
  %d: f32[256] = aten::add.Tensor(%b, %c) {layer="d", cost={time_us=5.0, out=1024, temp=0, persist=0}}
  return %d
}
"""

MACHINE = {
    "format": "modelpar-machine-v1",
    "devices": [{"name": "dev", "memory_bytes": 1 << 30, "peak_flops": 1e12,
                 "memory_bandwidth_bytes_per_s": 1e11, "launch_overhead_us": 1.0}],
    "default_link": {"latency_us": 2.0, "bandwidth_bytes_per_s": 1.024e9},
}


@pytest.fixture
def machine(tmp_path: Path) -> Path:
    path = tmp_path / "machine.json"
    path.write_text(json.dumps(MACHINE), encoding="utf-8")
    return path


def _cli(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "modelpar", "plan", *args], capture_output=True,
                          text=True, timeout=120, env={**os.environ, "MODELPAR_DUMP_DIR": ""})


# ---- plan_graph ---------------------------------------------------------------------------


def test_diamond_plan_has_the_hand_computed_step_time(machine: Path, tmp_path: Path) -> None:
    g = modelpar.parse_graph(DIAMOND)
    p = modelpar.plan_graph(g, devices=2, placer="m-etf", machine=machine,
                            trace=tmp_path / "t.json")
    # m-ETF: device 0 runs a 0..10 and b 10..30 and sends b 30..33; device 1
    # receives a 10..13, runs c 13..33, receives b 30..33 and runs d 33..38.
    # One device: 10 + 20 + 20 + 5 = 55 us; speed-up 55 / 38.
    assert p.step_time_us == pytest.approx(38.0)
    assert p.single_device_us == pytest.approx(55.0)
    assert p.speedup == pytest.approx(55.0 / 38.0)
    assert p.placement == {"a": 0, "b": 0, "c": 1, "d": 1}
    assert p.order == [["a", "b"], ["c", "d"]]
    assert p.units_per_device == [2, 2]
    assert p.num_transfers == 2
    assert p.capacity_bytes == [1 << 30, 1 << 30]
    assert p.placer == "place-metf"
    assert isinstance(p.program, modelpar.Program) and p.program.num_devices == 2
    p.program.verify()
    text = str(p)
    assert "modelpar plan @diamond: placer m-etf, 2 devices, 4 nodes in 4 units" in text
    assert "simulated step time 38 us (one device 55 us, speed-up 1.45x)" in text
    assert [s["pass"] for s in p.stats] == ["cost", "coarsen", "place-metf", "lower", "simulate"]
    events = json.loads((tmp_path / "t.json").read_text())["traceEvents"]
    runs = {(e["args"]["node"], e["pid"], e["ts"], e["ts"] + e["dur"])
            for e in events if e.get("ph") == "X" and e.get("cat") == "run"}
    assert runs == {("%a", 0, 0.0, 10.0), ("%b", 0, 10.0, 30.0), ("%c", 1, 13.0, 33.0),
                    ("%d", 1, 33.0, 38.0)}
    assert json.loads(p.trace())["traceEvents"]


def test_plan_graph_runs_every_placer_on_the_mlp_example() -> None:
    g = modelpar.ir.load_graph(MLP_STEP)
    before = str(g)
    for placer in modelpar.planning.placement.PLACERS:
        p = modelpar.plan_graph(MLP_STEP, devices=2, placer=placer, memory="16GiB")
        assert p.num_devices == 2
        assert set(p.placement) == {"h", "a", "p", "loss", "g", "dp", "at", "dw2", "w2t", "da",
                                    "dh", "xt", "dw1", "w1_new", "w2_new"}
        assert p.step_time_us > 0 and p.single_device_us > 0
        assert sum(p.nodes_per_device) == 15
        # Each layer's nodes share a device.
        layers = {"fc1": {"h", "a", "dh", "xt", "dw1", "w1_new"},
                  "fc2": {"p", "at", "dw2", "w2t", "da", "w2_new"}}
        for nodes in layers.values():
            assert len({p.placement[n] for n in nodes}) == 1
        assert f"placer {placer}" in str(p)
    assert modelpar.plan_graph(g, devices=1).speedup == pytest.approx(1.0)
    assert str(g) == before  # the caller's graph is not modified


def test_lowered_program_computes_what_the_graph_computes(machine: Path) -> None:
    g = modelpar.parse_graph(DIAMOND)
    p = modelpar.plan_graph(g, devices=2, machine=machine)
    assert p.nodes_per_device == [2, 2] and p.num_transfers == 2
    x = torch.randn(256, generator=torch.Generator().manual_seed(0))
    for got, want in zip(modelpar.run_program(p.program, [x]), modelpar.run_graph(g, [x])):
        assert_exact(got, want)  # the same kernels in the same order on one thread


def test_memory_sizes_parse_and_garbage_raises_config_error() -> None:
    assert modelpar.planning.placement.parse_bytes("16GiB") == 16 << 30
    assert modelpar.planning.placement.parse_bytes("512MiB") == 512 << 20
    assert modelpar.planning.placement.parse_bytes("1.5GB") == 1_500_000_000
    assert modelpar.planning.placement.parse_bytes("2 kib") == 2048
    assert modelpar.planning.placement.parse_bytes(4096) == 4096
    for bad in ("16 gigs", "", "-1GiB", "1.5.3GB", "GiB", True, 1.5, None):
        with pytest.raises(modelpar.ConfigError, match="is not a size"):
            modelpar.planning.placement.parse_bytes(bad)
    p = modelpar.plan_graph(MLP_STEP, devices=2, memory=["1MiB", 2 << 20])
    assert p.capacity_bytes == [1 << 20, 2 << 20]
    with pytest.raises(modelpar.ConfigError, match="memory has 3 values for 2 devices"):
        modelpar.plan_graph(MLP_STEP, devices=2, memory=["1MiB"] * 3)
    with pytest.raises(modelpar.ConfigError, match="is not a size"):
        modelpar.plan_graph(MLP_STEP, devices=2, memory="lots")


def test_bad_options_raise_config_error_naming_the_valid_values() -> None:
    with pytest.raises(modelpar.ConfigError, match="devices=0 is not valid; devices takes an int"):
        modelpar.plan_graph(MLP_STEP, devices=0)
    with pytest.raises(modelpar.ConfigError, match="devices='2' is not valid"):
        modelpar.plan_graph(MLP_STEP, devices="2")
    with pytest.raises(modelpar.ConfigError,
                       match="placer='m-fast' is not valid; placer takes one of 'm-topo', 'm-etf', 'm-sct'"):
        modelpar.plan_graph(MLP_STEP, devices=2, placer="m-fast")
    with pytest.raises(modelpar.ConfigError, match="cannot read machine profile"):
        modelpar.plan_graph(MLP_STEP, devices=2, machine="/nonexistent/machine.json")


def test_a_plan_that_does_not_fit_names_layer_device_and_bytes() -> None:
    with pytest.raises(modelpar.PlanDoesNotFitError) as info:
        modelpar.plan_graph(MLP_STEP, devices=2, memory="2KiB")
    msg = str(info.value)
    assert "layer 'fc1'" in msg and "on device 0" in msg
    assert "4.5 KiB" in msg and "2.0 KiB available of 2.0 KiB" in msg


def test_dump_dir_receives_the_ir_after_every_pass(tmp_path: Path) -> None:
    modelpar.plan_graph(MLP_STEP, devices=2, dump_dir=tmp_path)
    names = sorted(f.name for f in tmp_path.iterdir())
    assert names == ["mlp_step.plan-01-cost.txt", "mlp_step.plan-02-coarsen.txt",
                     "mlp_step.plan-03-place-metf.txt", "mlp_step.plan-04-lower.txt",
                     "mlp_step.plan-05-simulate.txt"]
    modelpar.ir.load_program(tmp_path / "mlp_step.plan-04-lower.txt").verify()


# ---- the command line ---------------------------------------------------------------------


def test_cli_prints_the_summary_and_writes_the_trace(machine: Path, tmp_path: Path) -> None:
    graph = tmp_path / "diamond.txt"
    graph.write_text(DIAMOND, encoding="utf-8")
    trace = tmp_path / "out.json"
    r = _cli(str(graph), "--devices", "2", "--machine", str(machine), "--placer", "m-sct",
             "--trace", str(trace))
    assert r.returncode == 0, r.stderr
    assert "modelpar plan @diamond: placer m-sct, 2 devices" in r.stdout
    assert "speed-up" in r.stdout and "peak mem" in r.stdout and "place-msct" in r.stdout
    assert json.loads(trace.read_text())["traceEvents"]


def test_cli_error_exits_1_with_one_line_and_no_traceback() -> None:
    r = _cli(str(MLP_STEP), "--devices", "2", "--memory", "2KiB")
    assert r.returncode == 1 and r.stdout == ""
    assert r.stderr.strip().splitlines() == [
        "python -m modelpar plan: error: modelpar place-metf: layer 'fc1' needs 4.5 KiB on "
        "device 0, which has 2.0 KiB available of 2.0 KiB; use more devices or enable "
        "checkpointing"]


@pytest.mark.parametrize("args, message", [
    (["--devices", "2", "--placer", "m-best"], "placer='m-best' is not valid"),
    (["--devices", "0"], "devices=0 is not valid"),
    (["--devices", "2", "--memory", "16 gigs"], "'16 gigs' is not a size"),
    (["--devices", "2", "--memory", "1GiB,2GiB,3GiB"], "memory has 3 values for 2 devices"),
    (["--devices", "2", "--machine", "/nonexistent.json"], "cannot read machine profile"),
])
def test_cli_errors_print_one_line_and_return_1(args: list[str], message: str,
                                                capsys: pytest.CaptureFixture[str]) -> None:
    from modelpar.__main__ import main

    assert main(["plan", str(MLP_STEP), *args]) == 1
    out, err = capsys.readouterr()
    assert out == ""
    lines = err.strip().splitlines()
    assert len(lines) == 1, err
    assert lines[0].startswith("python -m modelpar plan: error: ") and message in lines[0]


def test_cli_reports_unreadable_and_malformed_graphs(tmp_path: Path,
                                                     capsys: pytest.CaptureFixture[str]) -> None:
    from modelpar.__main__ import main

    assert main(["plan", str(tmp_path / "missing.txt")]) == 1
    assert "cannot read" in capsys.readouterr().err
    bad = tmp_path / "bad.txt"
    bad.write_text("graph @g(%x: f32[4] input) {\n  %y = aten::relu(%x)\n}\n", encoding="utf-8")
    assert main(["plan", str(bad)]) == 1
    err = capsys.readouterr().err
    assert "2:" in err and len(err.strip().splitlines()) == 1


def test_cli_memory_list_gives_one_capacity_per_device(capsys: pytest.CaptureFixture[str]) -> None:
    from modelpar.__main__ import main

    assert main(["plan", str(MLP_STEP), "--devices", "2", "--memory", "1GiB, 512MiB",
                 "--dump-dir", ""]) == 0
    out = capsys.readouterr().out
    assert "1.0 GiB" in out and "512.0 MiB" in out


# ---- graphs captured by torch.compile -----------------------------------------------------


def test_place_a_compiled_mlp_training_step() -> None:
    from models import CASES

    torch._dynamo.reset()
    modelpar.clear_plans()
    case = CASES["mlp"]
    model = case.make_model()
    fast = torch.compile(model, backend="modelpar")
    x, y = case.batch(0, case.batch_size)
    case.loss(fast(x), y).backward()
    plan = modelpar.plans()[-1]
    placed = plan.place(devices=2, placer="m-etf")
    assert set(placed.plans) == {"forward", "backward"}
    fw, bw = placed["forward"], placed["backward"]
    assert placed.step_time_us == pytest.approx(fw.step_time_us + bw.step_time_us)
    assert placed.single_device_us == pytest.approx(fw.single_device_us + bw.single_device_us)
    assert fw.num_devices == 2 and bw.num_devices == 2
    text = str(placed)
    assert "[forward]" in text and "[backward]" in text and "speed-up" in text
    # Layers of the model name the placement units.
    assert "fc1" in str(fw)
    for placer in ("m-topo", "m-sct"):
        assert plan.place(devices=4, placer=placer).step_time_us > 0


def test_two_towers_example_puts_one_tower_on_each_device() -> None:
    p = modelpar.plan_graph(EXAMPLES / "two_towers.txt", devices=2, placer="m-etf")
    assert p.placement["a1"] != p.placement["b1"]
    assert p.placement["a1"] == p.placement["a2"] and p.placement["b1"] == p.placement["b2"]
    assert p.speedup > 1.5
