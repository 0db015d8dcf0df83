"""modelpar.Executor on CPU workers: the reference interpreter's results,
errors raised with device and instruction (also when a peer is blocked in a
receive), traces, device maps."""

from __future__ import annotations

import json
import pathlib
import time

import pytest
import torch

import modelpar

ROOT = pathlib.Path(__file__).resolve().parents[2]
MLP = ROOT / "examples" / "ir" / "mlp_pipeline_2dev.txt"

# Python-defined operators: the workers call them with the GIL released by run().
_lib = torch.library.Library("mp_pytest", "DEF")
_lib.define("fail_after(Tensor x, float seconds) -> Tensor")
_lib.define("sleep(Tensor x, float seconds) -> Tensor")


def _fail_after(x: torch.Tensor, seconds: float) -> torch.Tensor:
    time.sleep(seconds)
    raise RuntimeError("injected failure from Python")


def _sleep(x: torch.Tensor, seconds: float) -> torch.Tensor:
    time.sleep(seconds)
    return x.clone()


_lib.impl("fail_after", _fail_after, "CPU")
_lib.impl("sleep", _sleep, "CPU")


@pytest.fixture(autouse=True)
def _seed() -> None:
    torch.manual_seed(0)


def mlp_inputs() -> list[torch.Tensor]:
    return [torch.randn(8, 16), torch.randn(8, 4), torch.randn(16, 32), torch.randn(32, 4)]


def test_mlp_pipeline_on_two_workers_equals_reference_interpreter():
    program = modelpar.ir.load_program(MLP)
    inputs = mlp_inputs()
    want = modelpar.run_program(program, inputs)
    ex = modelpar.Executor(program, device_map="cpu-workers", threads_per_device=1)
    for _ in range(3):
        got = ex.run(inputs)
        assert len(got) == len(want)
        for g, w in zip(got, want):
            assert torch.equal(g, w)
    assert ex.num_devices == 2
    assert ex.device_map == "2 cpu-workers x 1 threads"
    assert "2 devices" in repr(ex)


def test_the_callers_python_dispatch_modes_do_not_see_the_workers_ops():
    # Note [Python dispatch modes stay on the caller] (executor.py): the mode
    # sees none of the step's ops, is back on the stack after it, and the
    # step computes what it computes without the mode.
    from torch.utils._python_dispatch import TorchDispatchMode, _get_current_dispatch_mode_stack

    class CountOps(TorchDispatchMode):
        seen = 0

        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            CountOps.seen += 1
            return func(*args, **(kwargs or {}))

    program = modelpar.ir.load_program(MLP)
    inputs = mlp_inputs()
    want = modelpar.Executor(program, device_map="cpu-workers", threads_per_device=1).run(inputs)
    ex = modelpar.Executor(program, device_map="cpu-workers", threads_per_device=1)
    with CountOps() as mode:
        got = ex.run(inputs)
        assert _get_current_dispatch_mode_stack() == [mode]
    assert CountOps.seen == 0
    for g, w in zip(got, want):
        assert torch.equal(g, w)


def test_failing_op_names_device_and_instruction_and_wakes_blocked_peer():
    program = modelpar.parse_program(
        """
        program devices=2
        graph @g(%x: f32[4] input {device=0}) {
          %a: f32[4] = mp_pytest::fail_after(%x, 0.1) {device=0}
          %b: f32[4] = aten::relu(%a) {device=1}
          return %b
        }
        device 0 {
          run %a
          send %a -> 1
        }
        device 1 {
          recv %a <- 0
          run %b
        }""")
    ex = modelpar.Executor(program)
    with pytest.raises(modelpar.ExecutionError, match=r"device 0, instruction 0 \(run %a, mp_pytest::fail_after\)"):
        ex.run([torch.randn(4)])
    with pytest.raises(modelpar.ExecutionError, match="injected failure from Python"):
        ex.run([torch.randn(4)])


def test_python_ops_on_different_workers_overlap():
    program = modelpar.parse_program(
        """
        program devices=2
        graph @g(%x: f32[4] input {device=0}, %y: f32[4] input {device=1}) {
          %a: f32[4] = mp_pytest::sleep(%x, 0.2) {device=0}
          %b: f32[4] = mp_pytest::sleep(%y, 0.2) {device=1}
          return %a, %b
        }
        device 0 { run %a }
        device 1 { run %b }""")
    ex = modelpar.Executor(program, record_trace=True)
    x, y = torch.randn(4), torch.randn(4)
    a, b = ex.run([x, y])
    assert torch.equal(a, x) and torch.equal(b, y)
    (sa, ea), (sb, eb) = ex.last_trace()["host"][0][0], ex.last_trace()["host"][1][0]
    assert sa < eb and sb < ea


def test_chrome_trace_of_a_step(tmp_path):
    program = modelpar.ir.load_program(MLP)
    ex = modelpar.Executor(program, record_trace=True, threads_per_device=1)
    ex.run(mlp_inputs())
    trace = json.loads(ex.chrome_trace())
    names = {e["name"] for e in trace["traceEvents"]}
    assert "send %a_0 -> 1" in names and "recv %a_0 <- 0" in names and "aten::mm" in names
    path = tmp_path / "step.json"
    ex.write_chrome_trace(path)
    assert json.loads(path.read_text()) == trace
    spans = ex.last_trace()
    assert len(spans["host"]) == 2 and spans["step_ns"] > 0


def test_trace_needs_record_trace():
    ex = modelpar.Executor(modelpar.ir.load_program(MLP))
    ex.run(mlp_inputs())
    with pytest.raises(modelpar.ConfigError, match="record_trace"):
        ex.chrome_trace()


def test_device_maps_are_checked():
    program = modelpar.ir.load_program(MLP)
    with pytest.raises(modelpar.ConfigError, match="names 3 devices but the program has 2"):
        modelpar.Executor(program, device_map=["cpu", "cpu", "cpu"])
    with pytest.raises(modelpar.ConfigError, match="is not a device"):
        modelpar.Executor(program, device_map="gpu")
    if not modelpar.runtime.executor.cuda_devices_built():
        with pytest.raises(modelpar.ConfigError, match="no CUDA support"):
            modelpar.Executor(program, device_map="cuda:0")


def test_bad_inputs_are_rejected():
    ex = modelpar.Executor(modelpar.ir.load_program(MLP))
    with pytest.raises(TypeError, match="input 1"):
        ex.run([torch.randn(8, 16), "y", torch.randn(16, 32), torch.randn(32, 4)])
    with pytest.raises(modelpar.ExecutionError, match="f32"):
        ex.run([torch.randn(9, 16), torch.randn(8, 4), torch.randn(16, 32), torch.randn(32, 4)])


@pytest.mark.skipif(not torch.cuda.is_available() or not modelpar.runtime.executor.cuda_devices_built(),
                    reason="needs a GPU and a CUDA build")
def test_one_gpu_hosting_two_logical_devices():
    program = modelpar.ir.load_program(MLP)
    inputs = [t.cuda() for t in mlp_inputs()]
    want = modelpar.run_program(program, inputs)
    got = modelpar.Executor(program, device_map="cuda:0").run(inputs)
    for g, w in zip(got, want):
        torch.testing.assert_close(g, w)


def test_graph_replay_on_cpu_workers_equals_stream_replay_and_says_why_not_captured():
    program = modelpar.ir.load_program(MLP)
    streams = modelpar.Executor(program, threads_per_device=1)
    graphs = modelpar.Executor(program, threads_per_device=1, replay="graphs", warmup_steps=1)
    assert "warming up" in graphs.replay_status()["summary"]
    for _ in range(4):  # warm-up, "capture", two replays; new values every step
        inputs = mlp_inputs()
        for g, w in zip(graphs.run(inputs), streams.run(inputs)):
            assert torch.equal(g, w)
    st = graphs.replay_status()
    assert st["requested"] == "graphs" and st["steps"] == 4
    assert st["static_buffers"] and not st["captured"]
    assert "CPU worker devices run the stream path" in st["summary"]
    assert streams.replay_status()["summary"] == "stream replay"


def test_cuda_graph_issues_answer_for_a_gpu_without_one():
    assert modelpar.runtime.executor.cuda_graph_issues(modelpar.ir.load_program(MLP), "cuda:0") == []
    program = modelpar.parse_program(
        """
        program devices=1
        graph @g(%x: f32[8] input) {
          %n: i64[N, 1] = aten::nonzero(%x)
          return %n
        }
        device 0 {
          run %n
        }""")
    [issue] = modelpar.runtime.executor.cuda_graph_issues(program, "cuda:0")
    assert (issue["device"], issue["instruction"]) == (0, 0)
    assert "aten::nonzero" in issue["what"]
    with pytest.raises(modelpar.ConfigError, match="replay must be"):
        modelpar.Executor(program, replay="cudagraphs")


def test_workers_share_the_process_threads_among_the_devices_that_compute():
    # Note [Every core used]: a worker gets the process's threads divided
    # among the devices that run ops; a one-device plan of a 2-device
    # program (what strategy="auto" may choose) gets them all.
    from modelpar.planning.placement import plan_graph
    from modelpar.runtime.executor import threads_per_worker
    two = modelpar.ir.load_program(MLP)
    assert two.num_devices == 2 and two.computing_devices == 2
    graph = modelpar.parse_graph(str(two.graph))
    one = plan_graph(graph, devices=2, placer="m-topo", memory=None).program
    one_device = plan_graph(graph, devices=1).program
    assert one_device.computing_devices == 1
    assert threads_per_worker(two, threads=8) == 4
    assert threads_per_worker(two, threads=1) == 1  # at least one each
    assert threads_per_worker(one_device, threads=8) == 8
    assert threads_per_worker(one, threads=6) == 6 // one.computing_devices
    ex = modelpar.Executor(one_device, device_map="cpu-workers",
                           threads_per_device=threads_per_worker(one_device, threads=2))
    assert ex.device_map == "1 cpu-workers x 2 threads"


def test_an_input_written_in_place_on_a_copy_reaches_the_callers_tensor():
    # Note [In-place writes reach the caller]: a CPU worker copies an input
    # on another device (here the modelpar device; a GPU map copies a CPU
    # model's tensors the same way); the program's in-place write lands in
    # the copy and is written back after the step. Before, the caller's
    # tensor kept its old values (batch norm's running statistics under
    # no_grad, a static KV cache).
    program = modelpar.parse_program("""program devices=1
graph @g(%x: f32[4] input {device=0}, %y: f32[4] input {device=0}) {
  %z: f32[4] = aten::add_.Tensor(%x, %y) {device=0}
  %w: f32[4] = aten::mul.Tensor(%z, %y) {device=0}
  return %w
}
device 0 {
  run %z
  run %w
}
""")
    ex = modelpar.Executor(program, device_map="cpu-workers", threads_per_device=1)
    x, y = torch.ones(4), torch.full((4,), 2.0)
    assert torch.equal(ex.run([x, y])[0], torch.full((4,), 6.0))
    assert torch.equal(x, torch.full((4,), 3.0))  # same device: written in place directly
    xm, ym = torch.ones(4).to("modelpar"), torch.full((4,), 2.0).to("modelpar")
    assert torch.equal(ex.run([xm, ym])[0], torch.full((4,), 6.0))
    assert torch.equal(xm.to("cpu"), torch.full((4,), 3.0))
    assert torch.equal(ym.to("cpu"), torch.full((4,), 2.0))  # read only: left alone
