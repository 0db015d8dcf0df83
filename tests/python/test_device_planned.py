"""The modelpar device planned: ``modelpar.device.configure(devices=N, ...)``
checks its options as torch.compile does, places every captured step over N
CPU worker devices and replays it; eager Python training on it equals the
CPU; learning-rate schedules and non-capturable Adam replay (the numbers the
update reads are graph inputs); the plan cache is bounded."""

from __future__ import annotations

import pytest
import torch

import modelpar
from modelpar import ConfigError
from device_training import train_on
from test_device_backend import OPTIMIZERS, TOL, Block, _train
from tolerances import Reordered


@pytest.fixture(autouse=True)
def _default_options():
    yield
    modelpar.device.configure()


@pytest.mark.parametrize("options, message", [
    ({"devices": 0}, "devices=0 is not valid; devices takes an int from 1 to 64"),
    ({"devices": 2, "placer": "m-best"}, "placer='m-best' is not valid; placer takes one of"),
    ({"placer": "m-etf"}, "placer='m-etf' needs devices > 1"),
    ({"devices": 2, "device_map": "gpu"}, "device_map='gpu' is not valid"),
    ({"memory": "lots"}, "memory='lots' is not valid"),
    ({"devices": 2, "pipeline": {"schedule": "zigzag"}},
     r"pipeline\['schedule'\]='zigzag' is not valid; schedule takes one of 'gpipe', '1f1b', '1f1b\*'"),
    ({"devices": 2, "pipeline": {"partition": "madpipe", "schedule": "1f1b"}},
     "'madpipe' only with schedule '1f1b\\*'"),
    ({"devices": 2, "pipeline": {"batched_inputs": "x"}},
     r"pipeline\['batched_inputs'\]='x' is not valid; batched_inputs takes a list of input names"),
    ({"max_plans": 0}, "max_plans=0 is not valid; max_plans takes an int >= 1"),
    ({"cache": "yes"}, "cache='yes' is not valid; cache takes True or False"),
    ({"device": 2}, "unknown key 'device'; valid keys: strict, devices, device_map"),
])
def test_configure_refuses_bad_options_as_torch_compile_does(options, message) -> None:
    modelpar.device.configure(devices=3, max_plans=4)
    with pytest.raises(ConfigError, match=message):
        modelpar.device.configure(**options)
    opts = modelpar.device.device_options()
    assert (opts["devices"], opts["max_plans"]) == (3, 4)  # nothing applied


def test_configure_takes_torch_compile_values() -> None:
    modelpar.device.configure(devices=4, placer="m-topo", memory="1GiB", device_map="cpu")
    opts = modelpar.device.device_options()
    assert (opts["devices"], opts["placer"], opts["memory"]) == (4, "m-topo", 2**30)
    modelpar.device.set_device_options(strict=True)  # keeps the planning options
    assert modelpar.device.device_options()["devices"] == 4 and modelpar.device.device_options()["strict"]
    modelpar.device.configure(devices=2, pipeline={"schedule": "1f1b", "batched_inputs": ["images"]})
    modelpar.device.set_device_options(warn_on_graph_break=False)
    pipeline = modelpar.device.device_options()["pipeline"]
    assert (pipeline["schedule"], pipeline["microbatches"], pipeline["batched_inputs"]) == \
        ("1f1b", 4, ["images"])


@pytest.mark.parametrize("devices", [2, 4])
@pytest.mark.parametrize("name", sorted(OPTIMIZERS))
def test_step_placed_on_cpu_workers_trains_like_cpu(name: str, devices: int) -> None:
    want, cpu_model = _train("cpu", OPTIMIZERS[name], steps=4)
    modelpar.device.configure(devices=devices, placer="m-etf")
    modelpar.device.reset_device_counters()
    got, dev_model = _train("modelpar", OPTIMIZERS[name], steps=4)
    # TOL: the same kernels, but each on a one-thread CPU worker, which may
    # add a reduction's fp32 terms in another order than eager's threads.
    TOL.assert_close(torch.tensor(got), torch.tensor(want))
    for (n, p_cpu), p_dev in zip(cpu_model.state_dict().items(), dev_model.state_dict().values()):
        TOL.assert_close(p_dev.cpu(), p_cpu, msg=n)
    counters = modelpar.device.device_counters()
    assert counters["captures"] == (1 if name == "sgd" else 2)
    assert counters["captures"] + counters["replays"] == 4
    plan = modelpar.device.plans()[-1]
    assert f"placer m-etf, {devices} devices" in str(plan)
    assert f"{devices} cpu-workers" in str(plan)
    assert str(plan) == modelpar.device.last_plan()


def _train_scheduled_adam(device: str, steps: int) -> list[float]:
    # Not capturable: the step counts are CPU tensors.
    return train_on(device, Block, lambda p: torch.optim.Adam(p, lr=0.01), steps,
                    make_scheduler=lambda o: torch.optim.lr_scheduler.StepLR(o, step_size=2, gamma=0.5))[0]


@pytest.mark.parametrize("devices", [1, 2])
def test_scheduled_non_capturable_adam_replays(devices: int) -> None:
    steps = 6
    want = _train_scheduled_adam("cpu", steps)
    modelpar.device.configure(devices=devices)
    modelpar.device.reset_device_counters()
    got = _train_scheduled_adam("modelpar", steps)
    # The same Adam arithmetic as the CPU (not capturable on either side);
    # TOL.after(steps): the reordering error of every step accumulates.
    TOL.after(steps).assert_close(torch.tensor(got), torch.tensor(want))
    counters = modelpar.device.device_counters()
    assert counters["graph_breaks"] == 0
    # Adam creates its state in the first step; every later step, with its
    # own learning rate and bias corrections, replays the second plan.
    assert counters["captures"] == 2 and counters["replays"] == steps - 2
    assert ": float input" in modelpar.device.last_graph()


def test_plan_cache_is_bounded_least_recently_used_first() -> None:
    modelpar.device.configure(max_plans=2)
    modelpar.device.clear_device_plans()
    modelpar.device.reset_device_counters()
    for n in (1, 2, 1, 3, 1, 2):  # captures A, B; replays A; C evicts B; A; B evicts C
        assert (torch.ones(n).to("modelpar") * 2).sum().item() == 2.0 * n
    counters = modelpar.device.device_counters()
    assert (counters["captures"], counters["replays"], counters["evictions"]) == (4, 2, 2)
    assert len(modelpar.device.plans()) == 2


class Convs(torch.nn.Module):
    """Two convolutions and a linear layer, no batch norm (a pipeline
    normalises each micro-batch on its own, so batch norm would differ)."""

    def __init__(self) -> None:
        super().__init__()
        self.conv1 = torch.nn.Conv2d(3, 4, 3, padding=1)
        self.conv2 = torch.nn.Conv2d(4, 4, 3, padding=1)
        self.fc = torch.nn.Linear(4 * 6 * 6, 5)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = torch.relu(self.conv1(x))
        return self.fc(torch.relu(self.conv2(h)).flatten(1))


def _train_convs(device: str, steps: int, batch: int = 10) -> tuple[list[float], torch.nn.Module]:
    return train_on(device, Convs, lambda p: torch.optim.SGD(p, lr=0.05, momentum=0.9), steps, batch)


@pytest.mark.parametrize("schedule", ["gpipe", "1f1b", "1f1b*"])
def test_eager_python_pipelined_on_the_device_trains_like_cpu(schedule: str) -> None:
    steps = 4
    want, cpu_model = _train_convs("cpu", steps)
    modelpar.device.configure(devices=2, pipeline={"microbatches": 3, "schedule": schedule})
    modelpar.device.reset_device_counters()
    got, dev_model = _train_convs("modelpar", steps)
    # Micro-batches of 4, 4, 2 add every weight gradient up in three parts
    # (another fp32 order); the longest sum is fc's 144 inputs.
    tol = Reordered(144, depth=6, steps=steps)
    tol.assert_close(torch.tensor(got), torch.tensor(want))
    for (n, p_cpu), p_dev in zip(cpu_model.state_dict().items(), dev_model.state_dict().values()):
        tol.assert_close(p_dev.cpu(), p_cpu, msg=n)
    counters = modelpar.device.device_counters()
    assert counters["captures"] == 2 and counters["replays"] == steps - 2  # momentum buffers
    summary = str(modelpar.device.plans()[-1])
    assert f"2 stages on 2 devices, 3 micro-batches of 4, schedule {schedule}" in summary
    assert "batch 10 (inputs %x, %x_1; dimension 0)" in summary


def test_pipeline_says_when_it_cannot_find_the_batch() -> None:
    modelpar.device.configure(devices=2, pipeline={"microbatches": 2})
    with pytest.raises(RuntimeError, match=r"f32\[6, 4, 6, 6\] has the batch size 6 in 3 dimensions"):
        _train_convs("modelpar", 1, batch=6)  # 6 is also the image size


class DropoutMlp(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.fc1 = torch.nn.Linear(8, 16)
        self.fc2 = torch.nn.Linear(16, 3)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.fc2(torch.nn.functional.dropout(torch.relu(self.fc1(x)), 0.3))


def test_a_dropout_pipeline_on_the_device_runs() -> None:
    # Issue 36: dropout draws per micro-batch (allow_random defaults to True
    # as under torch.compile), so the pipelined step differs from the
    # captured one by design; its first-step check refused it, blaming "a
    # number from the batch size".
    modelpar.device.configure(devices=2, pipeline={"microbatches": 2})
    torch.manual_seed(0)
    model = DropoutMlp().to("modelpar")
    modelpar.attach(model)
    opt = torch.optim.SGD(model.parameters(), lr=0.05)
    for _ in range(3):
        x = torch.randn(10, 8).to("modelpar")
        y = torch.randint(0, 3, (10,)).to("modelpar")
        opt.zero_grad()
        loss = torch.nn.functional.cross_entropy(model(x), y)
        loss.backward()
        opt.step()
        assert 0.0 < loss.item() < 10.0
    assert "2 stages on 2 devices" in str(modelpar.device.plans()[-1])
