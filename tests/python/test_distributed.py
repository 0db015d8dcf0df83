"""Plans over the ranks of a torch.distributed process group
(``options={"devices": "world"}``, python/modelpar/distributed/rank_executor.py and
runtime/rank_executor.h): N processes on localhost with Gloo, each running
tests/python/dist_worker.py, every wait bounded.

- m-ETF training of the test models over 2 and 4 ranks equals eager in one
  process: the loss of each of 3 momentum-SGD steps, every gradient (summed
  over the ranks: each exists on exactly one) and the parameters after;
- so does pipelined training (GPipe, 1F1B, 1F1B*, ZB-H1; checkpointing except
  the last stage, the default), stage s on rank s, and interleaved 1F1B
  (2 stages per rank, stage s on rank s % world), also when
  each rank has released (NaN-filled) the parameters other ranks own;
- so do real models (transformers' Llama, GPT-2, BERT, T5, ViT, ResNet),
  placed and pipelined, and every model's inference graph (no_grad), whose
  parameters are moved to the ranks training binds them on;
- a rank that raises, is killed, or hangs makes every other rank raise
  ExecutionError naming it within the peer timeout;
- ranks that planned differently raise ConfigError naming them;
- bad set-ups are ConfigErrors before anything is traced;
- ranks of one plan fed different batches raise ConfigError on every rank,
  and a graph the runtime cannot run is an error over ranks, not an eager run;
- a pp x dp mesh trains like eager on the global batch, its DCP checkpoint
  loads into an eager model with equal tensors, and training resumes from
  its last checkpoint after a rank is killed under torchrun.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest
import torch

import modelpar
from ci_sample import full_only
from rank_processes import free_port, start_ranks
from tolerances import Reordered

WORKER = Path(__file__).with_name("dist_worker.py")
LIMIT_S = 240  # the whole run of one scenario, compile included (2 slow cores)


def _launch(world: int, *args: str) -> list[tuple[int, dict | None, str]]:
    """Runs the scenario on `world` ranks; (exit code, RESULT, output) per rank.
    The ranks are forked from a warm process (Note [Ranks forked from a warm
    process] in rank_processes.py). The rendezvous store lives here, as
    torchrun's agent hosts it, so that it outlives any rank
    (TORCHELASTIC_USE_AGENT_STORE: rank 0 connects to it instead of hosting
    one)."""
    import torch.distributed as dist
    port = free_port()
    store = dist.TCPStore("127.0.0.1", port, world, is_master=True, wait_for_workers=False)
    env = {**os.environ, "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(port),
           "TORCHELASTIC_USE_AGENT_STORE": "True"}
    procs = start_ranks(world, WORKER, list(args), env)
    out = []
    try:
        for p in procs:
            text, _ = p.communicate(timeout=LIMIT_S)
            result = None
            for line in text.splitlines():
                if line.startswith("RESULT "):
                    result = json.loads(line[len("RESULT "):])
            out.append((p.returncode, result, text))
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
                p.wait(timeout=10)
        del store
    return out


def _all_ok(runs: list[tuple[int, dict | None, str]]) -> list[dict]:
    for rank, (code, result, text) in enumerate(runs):
        assert code == 0 and result is not None, f"rank {rank} failed (exit {code}):\n{text[-4000:]}"
    return [r for _, r, _ in runs]


def test_state_dicts_refuse_bad_input() -> None:
    import torch.distributed as dist
    model = torch.nn.Linear(3, 2)
    with pytest.raises(modelpar.ConfigError,
                       match="modelpar gather_state_dict needs an initialised process group"):
        modelpar.gather_state_dict(model)
    dist.init_process_group("gloo", store=dist.HashStore(), rank=0, world_size=1)
    try:
        with pytest.raises(modelpar.ConfigError, match=r"dst=1 is not a rank of the group \(0 to 0\)"):
            modelpar.gather_state_dict(model, dst=1)
        with pytest.raises(modelpar.ConfigError, match="expected a torch.nn.Module, got dict"):
            modelpar.owned_state_dict({"w": torch.ones(1)})
        # One rank, no step run: rank 0 is every entry's home.
        got = modelpar.gather_state_dict(model)
        assert list(got) == ["weight", "bias"] and torch.equal(got["weight"], model.weight)
        assert list(modelpar.owned_state_dict(model)) == ["weight", "bias"]
    finally:
        dist.destroy_process_group()


@pytest.mark.parametrize("world,case", [(2, "mlp"), (4, "mlp"), (2, "cnn"),
                                        full_only(4, "gpt")])
def test_training_over_ranks_equals_eager(world: int, case: str) -> None:
    results = _all_ok(_launch(world, "train", case, "3"))
    # Every rank saw the same losses (the holder broadcasts it) ...
    assert all(r["losses"] == results[0]["losses"] for r in results)
    # ... and each parameter is owned by exactly one rank (checked in the worker too).
    owned = [n for r in results for n in r["owned"]]
    assert len(owned) == len(set(owned))
    assert sum(1 for r in results if r["owned"]) >= 2, "the plan uses more than one rank"
    # The inference graph (no_grad) binds every parameter on its training
    # rank (GPT's tied embedding too) and equals eager (checked in the worker).
    assert all(r["inference"] == "ok" for r in results), results
    # owned_state_dict: the shards split the state, no entry twice or missing
    # (gather_state_dict on rank 0 equals eager's: checked in the worker).
    shards = [n for r in results for n in r["shard"]]
    model = __import__("models").CASES[case].make_model()
    assert sorted(shards) == sorted(model.state_dict())
    _assert_measured_memory(results)


def _assert_measured_memory(results: list[dict]) -> None:
    """measure_memory (Note [Measured memory]): each rank reports its own
    device's peak in every plan it ran. A pipelined training step measures
    within issue 35's 10 % of its simulated peak there: plans for ranks are
    simulated with each rank's receives in their senders' order, as the rank
    executor runs them (Note [Receiving in send order]; before, a value
    received early lived longer than simulated: the MLP's GPipe step
    measured 1.30x on rank 1, GPT interleaved 1.11x). A placed training step
    measures at most 10 % over the larger of its forward's and backward's
    simulated peaks (the backward's runs above what runs: the CNN's rank 1
    0.82x; Note [Saved values cross after the forward]). So does a graph
    planned apart (inference, whose parameters stay bound on their training
    ranks: Note [Memory model] charges a parameter held where no node reads
    it to that rank; before, the MLP's rank 0 measured 2.3x its simulated
    peak); its reader counts the parameter twice, as a received copy and in
    its first user's persistent bytes (the MLP's rank 1 0.57x)."""
    for r in results:
        assert r["measured"], r["rank"]
        for measured, simulated, kind in r["measured"]:
            assert [d for d, _ in measured] == [r["rank"]], measured
            got, sim = measured[0][1], simulated[r["rank"]]
            if kind == "step":
                assert got == pytest.approx(sim, rel=0.10), (r["rank"], kind, measured, simulated)
            else:
                assert got <= 1.10 * sim, (r["rank"], kind, measured, simulated)


def test_a_training_step_planned_again_keeps_the_first_plans_homes() -> None:
    # strategy="auto" searches again at each batch size and may choose another
    # plan, which binds a parameter on another rank than the first training
    # step (whose optimizer updates it there); the rank executor refused that
    # run. keep_homes(gradients_go_home=True) binds each parameter at its home
    # and sends it to its readers; the placement says so too, so the two
    # phases split from the plan bind it there as well. Two partitions of the
    # skip step over 3 devices stand for the two batch sizes' plans.
    from modelpar import _C
    from modelpar.distributed.homes import keep_homes
    g = modelpar.ir.load_graph(Path(__file__).resolve().parents[2] / "examples/ir/skip_step_symbolic.txt")

    def planned(partition: str):
        return modelpar.plan_pipeline(g, devices=3, microbatches=2, batch_size=16,
                                      schedule="gpipe", partition=partition, checkpoint="never")

    def params(program) -> dict[str, int]:
        graph = program.graph
        return {n: d for n, r, d in zip(graph.input_names, _C.graph_input_roles(graph),
                                        _C.input_devices(program)) if r != "input"}

    key = ("test_distributed.py", "keeps_the_first_plans_homes", 0)
    first, second = planned("balance-time"), planned("balance-size")
    homes = params(first.program)
    assert params(second.program) != homes  # the case: another plan binds elsewhere
    assert keep_homes(first, key, training=True, gradients_go_home=True) is first
    moved = keep_homes(second, key, training=True, gradients_go_home=True)
    assert params(moved.program) == homes
    assert "rehome-inputs" in str(moved)
    fw, bw, _carried = _C.split_phases(moved)
    for part in (fw, bw):
        got = params(part)
        assert got == {n: homes[n] for n in got}, (got, homes)
    # The moved plan computes what the first one does.
    from modelpar.planning.placement import example_inputs
    inputs = example_inputs(first.program.graph, {"B": 16})
    want = modelpar.Executor(first.program, device_map="cpu-workers").run(inputs)
    got = modelpar.Executor(moved.program, device_map="cpu-workers").run(inputs)
    for a, b in zip(got, want):
        torch.testing.assert_close(a, b, rtol=0, atol=1e-6)  # same ops, other devices
    # A graph that does not train moves what has a home, as before.
    inference = keep_homes(second, key, training=False)
    assert params(inference.program) == homes


@pytest.mark.parametrize("case,schedule", [full_only("gpt", "gpipe"), ("gpt", "none"),
                                           full_only("mlp", "none"), ("gpt", "auto"),
                                           full_only("zoo:mixtral", "none")])
def test_the_model_compiled_alone_trains_over_ranks_like_eager(case: str, schedule: str) -> None:
    # The loss computed outside the compiled model: GPipe runs as two programs
    # (the forward's, then the backward's), which bound GPT's tied embedding
    # and head weight on different ranks until split-phases bound an input
    # the placement leaves free where the whole step does. The last step is
    # at a new batch size: the forward then saves the batch size for the
    # backward, and a rank that did not hold it got a placeholder tensor
    # where AOTAutograd asserts an int (m-ETF); and Dynamo compiles the step
    # again with a dynamic batch, whose joint plan bound Mixtral's parameters
    # elsewhere (refused) until it kept the earlier plan's layers; and
    # strategy="auto" searches again at the new batch size.
    results = _all_ok(_launch(2, "train", case, "3", schedule, "outside"))
    assert all(r["losses"] == results[0]["losses"] for r in results)
    assert all(r["owned"] for r in results), [r["owned"] for r in results]
    assert all(r["inference"] == "ok" for r in results), results


@pytest.mark.parametrize("schedule", [full_only("gpipe"), "1f1b", "none"])
def test_a_model_with_graph_breaks_trains_over_ranks_like_eager(schedule: str) -> None:
    # Four graphs over the ranks (Note [A graph the pipeline cannot cut]):
    # under a pipeline the blocks are pipelined and the pieces with fewer
    # layers than ranks placed. The gradient a later graph's backward makes
    # for an earlier graph's output reaches every rank (Note [Input
    # gradients over ranks]); it stayed on the rank that made it, and the
    # earlier graph's ranks got None: step 1's loss differed from eager.
    results = _all_ok(_launch(2, "train", "graph-breaks", "3", schedule))
    assert all(r["losses"] == results[0]["losses"] for r in results)
    for r in results:
        if schedule != "none":
            assert any(p.endswith("(pipeline)") for p in r["plans"]), r["plans"]
            assert any("not pipelined" in p for p in r["plans"]), r["plans"]


@pytest.mark.parametrize("world,case,schedule", [(2, "mlp", "gpipe"), (2, "mlp", "1f1b"),
                                                 (2, "mlp", "1f1b*"), full_only(4, "gpt", "gpipe"),
                                                 full_only(4, "gpt", "1f1b"),
                                                 (2, "gpt", "interleaved"),
                                                 full_only(2, "mlp", "zb-h1"),
                                                 (2, "gpt", "zb-v")])
def test_pipelined_training_over_ranks_equals_eager(world: int, case: str, schedule: str) -> None:
    # "interleaved": v=2 stages per rank (4 stages of the GPT over 2 ranks,
    # stage s on rank s % 2); "zb-h1": each backward split into B and W;
    # "zb-v": 2 stages per rank in a V (stages 0, 1 on ranks 0, 1 and
    # stages 2, 3 back on ranks 1, 0), backwards split as in zb-h1.
    results = _all_ok(_launch(world, "train", case, "3", schedule))
    assert all(r["losses"] == results[0]["losses"] for r in results)
    assert all("pipeline" in r["plan"] for r in results)
    # The training step's pipeline ran the schedule asked for, its stages
    # placed as the schedule places them.
    placed = {"interleaved": list(range(world)) * 2,
              "zb-v": list(range(world)) + list(reversed(range(world)))}.get(schedule,
                                                                             list(range(world)))
    for r in results:
        assert [schedule, placed] in r["stages"], r["stages"]
    # Stage s on rank s (s % world interleaved, a V for zb-v): every rank owns parameters.
    assert all(r["owned"] for r in results), [r["owned"] for r in results]
    # The MLP's forward-only partition cuts its layers elsewhere: fc2 moves
    # home, and the plan plans() reports for it says so (the worker checks
    # every parameter is bound on its owner).
    if case == "mlp" and schedule in ("gpipe", "1f1b"):
        assert all(r["rehomed"] for r in results), results
    _assert_measured_memory(results)


@pytest.mark.parametrize("world,case,schedule", [(2, "mlp", "none"), (2, "mlp", "1f1b"),
                                                 full_only(4, "gpt", "gpipe")])
def test_gradient_clipping_over_ranks_uses_the_whole_models_norm(world: int, case: str,
                                                                 schedule: str) -> None:
    # modelpar.clip_grad_norm_ every step (L2, inf, L1 norms), against
    # torch.nn.utils.clip_grad_norm_ in eager: the norms, losses, every
    # gradient after clipping and the parameters equal eager (the worker
    # checks them).
    results = _all_ok(_launch(world, "train", case, "3", schedule, "clip"))
    totals = [[total for total, _ in r["norms"]] for r in results]
    assert len(totals[0]) == 3 and all(t == totals[0] for t in totals), totals
    # Each rank holds only part of the gradient: the norm of its own share is
    # smaller, so clipping by it (torch's clip_grad_norm_ on a rank) would
    # scale each rank's gradients differently.
    for r in results:
        assert all(own < total for total, own in r["norms"][::2]), r["norms"]


@pytest.mark.parametrize("schedule", [full_only("none"), "1f1b"])
def test_grad_scaler_skips_a_step_on_every_rank_when_one_rank_overflows(schedule: str) -> None:
    # Step 0's last gradient is set to inf on the rank that holds it (and in
    # eager): modelpar.GradScaler all-reduces the inf check, so every rank
    # skips that step and backs off its scale as eager's scaler does; the
    # worker checks losses, gradients and parameters against eager. (With
    # torch.amp.GradScaler the other rank steps and fails that check.)
    results = _all_ok(_launch(2, "train", "mlp", "3", schedule, "scaler"))
    for r in results:
        assert [ours for ours, _ in r["scales"]] == [eager for _, eager in r["scales"]], r["scales"]
        assert r["scales"][0][0] == 512.0, r["scales"]  # 1024 backed off by the skipped step


@pytest.mark.parametrize("case,schedule", [("llama", "none"), full_only("gpt2", "gpipe"),
                                           full_only("bert", "1f1b"), ("resnet", "none"),
                                           ("mixtral", "1f1b")])
def test_real_models_train_over_ranks_like_eager(case: str, schedule: str) -> None:
    # Transformers models of tests/python/zoo.py (random init, unmodified)
    # over 2 ranks, placed (m-ETF) or pipelined, the loss computed inside (T5,
    # ViT, BART, Swin, ConvNeXt and the other decoders pass too, 10-54 s
    # each: kept out of CI; Mixtral's experts group their rows per
    # micro-batch, Note [Row-group offsets]):
    # losses, every gradient and the parameters after 3 steps equal eager, and
    # so does an inference step (the worker checks them). ResNet's pipelines
    # normalise per micro-batch (DeferredBatchNorm), unlike eager: placed only.
    pytest.importorskip("transformers")
    results = _all_ok(_launch(2, "train", f"zoo:{case}", "3", schedule))
    assert all(r["losses"] == results[0]["losses"] for r in results)
    assert all(r["inference"] == "ok" for r in results), results
    assert all(r["owned"] for r in results), [r["owned"] for r in results]
    want = "pipeline" if schedule != "none" else "m-etf"
    assert all(want in r["plan"] for r in results), [r["plan"] for r in results]


@pytest.mark.parametrize("case,schedule,extra", [full_only("mistral", "none", ""), full_only("mistral", "1f1b", ""),
                                                 ("llama", "gpipe", "trained")])
def test_generate_decodes_over_ranks_like_eager(case: str, schedule: str, extra: str) -> None:
    # model.generate with a KV cache over 2 ranks (the worker checks tokens
    # and logits against eager): the prompt's and the decode steps' graphs are
    # planned apart and may bind a parameter on different ranks (no step
    # trains, so no copy is stale: Note [One home per parameter]); the
    # sliding-window cache of Mistral is a view on the rank that computed it
    # and reaches the others in the same layout (Note [Framed tensors keep
    # their layout]), so every rank traces the same decode graph (GPT-2, T5,
    # BART, Mixtral and Qwen2 pass too, 10-21 s each: kept out of CI). After
    # training through the same compiled forward ("trained": 2 SGD steps) the
    # decode graphs read each parameter at its training home.
    pytest.importorskip("transformers")
    results = _all_ok(_launch(2, "generate", case, schedule, *([extra] if extra else [])))
    assert results[0]["tokens"] == results[1]["tokens"]
    assert all(r["graphs"] >= 2 for r in results), results


@pytest.mark.parametrize("schedule", [full_only("none"), "1f1b"])
def test_a_checkpointed_dropout_trains_over_ranks_like_eager(schedule: str) -> None:
    # GPT-2 under its own activation checkpointing with every dropout at p = 1
    # (each rank draws from its own generator, so only masks that do not
    # depend on the draws can equal eager's): the forward's masks are saved
    # and sent to where the recompute runs (Note [Replaying a checkpointed
    # dropout]); the worker checks losses, gradients and parameters against
    # eager over 3 steps.
    pytest.importorskip("transformers")
    results = _all_ok(_launch(2, "train", "zoo:gpt2", "3", schedule, "dropped"))
    assert all(r["replayed"] for r in results), results


@pytest.mark.filterwarnings("ignore:modelpar pipeline")
@pytest.mark.parametrize("pattern,schedule", [("twice", "none"), ("twice", "gpipe"),
                                              ("accumulate", "1f1b")])
def test_training_loops_over_ranks_like_eager(pattern: str, schedule: str) -> None:
    # The model called twice before one backward (each call's saved
    # activations kept on every rank), and gradient accumulation (two
    # backward calls into each owner's .grad): tests/python/test_training_loops.py
    # in one process.
    _all_ok(_launch(2, "loop", pattern, schedule))


@pytest.mark.parametrize("case,schedule", [full_only("zoo:llama", "none"), ("zoo:gpt2", "1f1b")])
def test_lora_fine_tuning_trains_over_ranks_like_eager(case: str, schedule: str) -> None:
    # peft's LoRA adapters with every base weight frozen: the worker checks
    # the loss, that no rank has a gradient for a frozen weight and every
    # adapter's is on one rank equal to eager's, the adapters after 3 steps,
    # and that every rank's frozen copy is untouched.
    pytest.importorskip("transformers")
    pytest.importorskip("peft")
    _all_ok(_launch(2, "train", case, "3", schedule, "lora"))


@pytest.mark.parametrize("world,case,schedule", [(2, "gpt", "1f1b")])
def test_a_group_per_direction_trains_like_one(world: int, case: str, schedule: str,
                                               monkeypatch) -> None:
    # Note [One stream per direction]: over NCCL the transfers from higher to
    # lower ranks go over a second group; MODELPAR_REVERSE_GROUP=1 does the
    # same on Gloo, where the worker checks the same losses, gradients and
    # parameters against eager (4 ranks, m-ETF: passes too, 50 s).
    monkeypatch.setenv("MODELPAR_REVERSE_GROUP", "1")
    results = _all_ok(_launch(world, "train", case, "3", schedule))
    assert all(r["losses"] == results[0]["losses"] for r in results)
    assert all(r["reverse_group"] for r in results), results


@pytest.mark.parametrize("world,case", [(2, "mlp"), full_only(2, "cnn")])
def test_auto_strategy_over_ranks_plans_on_rank_0s_measurements(world: int, case: str,
                                                                 tmp_path, monkeypatch) -> None:
    # strategy="auto" with the calibrated CPU profile on, each rank with its
    # own cache: rank 0 has none (it calibrates the CPU while the others
    # wait), rank 1 a corrupt one that planning must never read. Rank 0
    # then times the step's nodes; every rank searches on its numbers (Note
    # [Measured once, planned everywhere]) and so lists the same candidates
    # with the same simulated times to the last digit and runs the same
    # plan, which trains like eager (the worker checks losses, gradients,
    # parameters over 3 steps).
    monkeypatch.setenv("MODELPAR_TEST_CACHE_ROOT", str(tmp_path))
    corrupt = tmp_path / "rank1" / "modelpar"
    corrupt.mkdir(parents=True)
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "rank1"))
    monkeypatch.delenv("MODELPAR_CPU_PROFILE", raising=False)
    from modelpar.profiles import cpu as cpu_profile
    Path(cpu_profile._cache_file(1)).write_text("not a profile")
    monkeypatch.undo()
    monkeypatch.setenv("MODELPAR_TEST_CACHE_ROOT", str(tmp_path))
    results = _all_ok(_launch(world, "train", case, "3", "auto", "own-cache"))
    searched = [r["searched"] for r in results]
    for rank, s in enumerate(searched[1:], start=1):  # what differs, named (seen once under CI load)
        if s["machine"] != searched[0]["machine"]:
            mine, theirs = json.loads(searched[0]["machine"]), json.loads(s["machine"])
            keys = sorted(k for k in set(mine) | set(theirs) if mine.get(k) != theirs.get(k))
            raise AssertionError(f"rank {rank} searched on another machine than rank 0: {keys}: "
                                 f"{[(k, mine.get(k), theirs.get(k)) for k in keys]}")
        differ = [(a, b) for a, b in zip(searched[0]["candidates"], s["candidates"]) if a != b]
        assert not differ and len(s["candidates"]) == len(searched[0]["candidates"]), \
            f"rank {rank}'s candidates differ from rank 0's (rank 0, rank {rank}): {differ}"
    assert json.loads(searched[0]["machine"])["calibration"]["threads"] == 1
    labels = [label for label, *_ in searched[0]["candidates"]]
    assert "one-device" not in labels and any(label.startswith("placement") for label in labels)
    assert sum(chosen for *_, chosen in searched[0]["candidates"]) == 1
    assert all(r["losses"] == results[0]["losses"] for r in results)


def test_what_rank_0_measures_or_raises_reaches_every_rank() -> None:
    results = _all_ok(_launch(2, "first-rank"))
    for r in results:
        assert r["got"] == {"rank": 0, "times": [1.5, -1.0]}, r
    assert results[0]["error"] == "layer fc1 needs 9 MiB on device 0"
    assert results[1]["error"] == ("modelpar distributed: rank 0 failed to measure the node "
                                   "times, which every rank plans with: PlanDoesNotFitError: "
                                   "layer fc1 needs 9 MiB on device 0")


@pytest.mark.parametrize("schedule", [full_only("none"), "1f1b"])
def test_inductor_kernel_regions_over_ranks_train_like_eager(schedule: str) -> None:
    # kernels="inductor" (Note [Kernel regions]): each rank compiles the runs
    # of its own instructions between transfers; losses and parameters after
    # 3 steps equal eager within tolerances.Compiled (checked on every rank).
    results = _all_ok(_launch(2, "train", "mlp", "3", schedule, "inductor"))
    assert all(r["losses"] == results[0]["losses"] for r in results)


@pytest.mark.parametrize("schedule", ["none", "gpipe"])
def test_released_parameters_of_other_ranks_are_never_read(schedule: str) -> None:
    # After step 0 each rank fills the parameters other ranks own with NaN
    # (release_unowned(poison=True)); steps 1 and 2 still equal eager.
    results = _all_ok(_launch(2, "train", "mlp", "3", schedule, "release"))
    sizes = {n: p.numel() * 4 for n, p in __import__("models").MLP().named_parameters()}
    for r in results:
        assert r["released"] == sum(v for n, v in sizes.items() if n not in r["owned"]), r


def test_state_dicts_over_ranks_never_return_released_or_stale_entries() -> None:
    # Issue 36: after inference-only steps release_unowned zeroed rank-1-homed
    # tensors on rank 0, whose state dicts then returned the zeros; batch
    # norm's running statistics written under no_grad on rank 1 were taken
    # from rank 0's stale copy. Now release_unowned is refused until a
    # training step fixed the homes, and each entry comes from its home.
    results = _all_ok(_launch(2, "state"))
    for r in results:
        assert r["refused"] is not None and "run a training step" in r["refused"], r
        assert r["released"] > 0, r
    assert results[0]["after_inference"] is True, results[0]
    assert results[0]["after_writes"] is True, results[0]
    assert results[0]["after_training"] is True, results[0]
    shards = [n for r in results for n in r["shard"]]
    assert len(shards) == len(set(shards)) and len(shards) == 11, shards


@pytest.mark.parametrize("case, schedule", [full_only("mlp", "none"), ("mlp", "1f1b"),
                                            ("graph-breaks", "gpipe")])
def test_trace_over_ranks_writes_one_file_per_rank(case: str, schedule: str, tmp_path,
                                                  monkeypatch) -> None:
    # trace="step.json" over a group: rank r writes step.rankR.json with the
    # measured spans of its own device only; rank 0 also the simulated plan,
    # in a folder that does not exist yet (1F1B plans, and wrote the
    # simulated trace, before any step made the folder: ConfigError). With
    # graph breaks every piece's runs are in the file (Note [One trace for
    # the pieces of a step]: the last piece's alone were, the rest lost).
    tmp_path = tmp_path / "runs"
    monkeypatch.setenv("MODELPAR_TEST_TRACE_DIR", str(tmp_path))
    results = _all_ok(_launch(2, "train", case, "3", schedule, "trace"))
    for rank, r in enumerate(results):
        assert r["traced"]["pids"] == [rank], r["traced"]
        assert r["traced"]["runs"] > 0, r["traced"]
    pieces = {p for r in results for p in r["traced"]["pieces"]}
    assert len(pieces) == (5 if case == "graph-breaks" else 1), results
    assert results[0]["traced"]["simulated"]
    assert sorted(f.name for f in tmp_path.iterdir()) == [
        "step.rank0.json", "step.rank1.json", "step.simulated.json"]


@pytest.mark.parametrize("how", ["raise", "kill", "hang"])
def test_a_failed_rank_makes_the_others_raise_naming_it(how: str) -> None:
    runs = _launch(2 if how != "kill" else 4, "fault", how, "1")
    for rank, (code, result, text) in enumerate(runs):
        if rank == 1:
            continue
        assert code == 0 and result is not None, f"rank {rank} (exit {code}):\n{text[-4000:]}"
        assert result["type"] == "ExecutionError"
        assert "rank 1 failed" in result["error"], result["error"]
        assert result["seconds"] < 8.0 + 5.0, result  # the peer timeout, plus slack


def test_another_compile_binding_a_parameter_elsewhere_is_refused_on_every_rank() -> None:
    # Homes are known per compiled function: a second torch.compile of the
    # model that binds fc2 on the other rank would read its stale copy, so
    # every rank refuses the run (nothing runs, nobody waits).
    results = _all_ok(_launch(2, "evaluate-elsewhere"))
    for r in results:
        assert "but an earlier graph bound it on rank" in r["error"], r
        assert "evaluate through the compiled function you train with" in r["error"], r


def test_ranks_that_planned_differently_raise_config_error() -> None:
    results = _all_ok(_launch(2, "mismatch"))
    for r in results:
        assert "planned" in r["error"] and "ranks 0" in r["error"] and "ranks 1" in r["error"], r


@pytest.mark.parametrize("pipeline,meta", [full_only(None, False), ("1f1b", False), ("1f1b", True)])
def test_the_torchrun_example_trains_like_eager(pipeline: str | None, meta: bool) -> None:
    """examples/torchrun_train.py under torchrun itself (2 processes); with
    --meta the model is built on the meta device and materialized, whose
    default init draws what the eager constructors draw."""
    example = Path(__file__).resolve().parents[2] / "examples" / "torchrun_train.py"
    args = (["--pipeline", pipeline] if pipeline else []) + (["--meta"] if meta else [])
    env = {**os.environ, "OMP_NUM_THREADS": "1",
           "PYTHONPATH": os.pathsep.join(p for p in sys.path if p)}
    run = subprocess.run([sys.executable, "-m", "torch.distributed.run", "--nproc-per-node", "2",
                          "--master-port", str(free_port()), str(example), *args],
                         env=env, capture_output=True, text=True, timeout=LIMIT_S)
    assert run.returncode == 0, run.stdout[-3000:] + run.stderr[-3000:]
    got = [float(line.split()[-1]) for line in run.stdout.splitlines() if line.startswith("step ")]
    evaluated = [float(line.split()[-1]) for line in run.stdout.splitlines()
                 if line.startswith("eval loss ")]
    # The same model, seed and batches eagerly in this process.
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(16, 32), torch.nn.ReLU(), torch.nn.Linear(32, 32),
                                torch.nn.Tanh(), torch.nn.Linear(32, 4))
    opt = torch.optim.SGD(model.parameters(), lr=0.05)
    g = torch.Generator().manual_seed(1)
    want = []
    batches = [(torch.randn(8, 16, generator=g), torch.randn(8, 4, generator=g)) for _ in range(3)]
    norms = []
    for x, y in batches:
        loss = torch.nn.functional.mse_loss(model(x), y)
        loss.backward()
        norms.append(float(torch.nn.utils.clip_grad_norm_(model.parameters(), 0.5)))
        opt.step()
        opt.zero_grad()
        want.append(loss.item())
    with torch.no_grad():  # the example evaluates the first batch after training
        want.append(torch.nn.functional.mse_loss(model(batches[0][0]), batches[0][1]).item())
    assert max(norms) > 0.5, norms  # the example's clipping scaled some step's gradients
    # Placement adds the MLP's sums (32 wide, 3 layers forward and backward)
    # in other orders (tests/python/tolerances.py), over 3 SGD steps.
    assert len(got) == 3 and len(evaluated) == 1, run.stdout
    Reordered(32, depth=6).after(steps=3).assert_close(torch.tensor(got + evaluated),
                                                       torch.tensor(want))


def test_world_without_an_initialised_group_is_a_config_error() -> None:
    import torch.distributed as dist
    assert not dist.is_initialized()
    with pytest.raises(modelpar.ConfigError, match="init_process_group"):
        modelpar.planning.options.resolve_options({"devices": "world"})


def test_bad_distributed_options_are_config_errors() -> None:
    with pytest.raises(modelpar.ConfigError, match="devices takes"):
        modelpar.planning.options.resolve_options({"devices": "everything"})
    with pytest.raises(modelpar.ConfigError, match="peer_timeout"):
        modelpar.planning.options.resolve_options({"devices": 2, "peer_timeout": 5})
    with pytest.raises(modelpar.ConfigError, match="peer_timeout"):
        modelpar.planning.options.resolve_options({"devices": "world", "peer_timeout": -1})
    with pytest.raises(modelpar.ConfigError, match="input_check_every is for runs over a process"):
        modelpar.planning.options.resolve_options({"devices": 2, "input_check_every": 2})
    with pytest.raises(modelpar.ConfigError, match="input_check_every takes an int >= 0"):
        modelpar.planning.options.resolve_options({"devices": "world", "input_check_every": -1})


def test_devices_other_than_the_group_size_is_a_config_error() -> None:
    import torch.distributed as dist
    store = dist.HashStore()
    dist.init_process_group("gloo", store=store, rank=0, world_size=1)
    try:
        group = dist.distributed_c10d._get_default_group()
        with pytest.raises(modelpar.ConfigError, match="devices=2 but the process group has 1 rank"):
            modelpar.planning.options.resolve_options({"devices": 2, "process_group": group})
        with pytest.raises(modelpar.ConfigError, match="process_group takes"):
            modelpar.planning.options.resolve_options({"devices": "world", "process_group": "default"})
        with pytest.raises(modelpar.ConfigError, match="not yet supported over a process group"):
            modelpar.planning.options.resolve_options({"devices": "world", "cuda_graphs": True})
        # The mode asks for what helps where it can: a warning, stream replay.
        with pytest.warns(UserWarning, match="runs as mode='default', by stream replay"):
            o = modelpar.planning.options.resolve_options({"devices": "world"}, "reduce-overhead")
        assert o.world and not o.cuda_graphs
        assert modelpar.planning.options.resolve_options({"devices": "world", "trace": "t.json"}).trace == "t.json"
        assert modelpar.planning.options.resolve_options({"devices": "world", "strategy": "auto"}).strategy == "auto"
        opts = modelpar.planning.options.resolve_options({"devices": "world", "peer_timeout": 5})
        assert (opts.world, opts.devices, opts.peer_timeout) == (True, 1, 5.0)
    finally:
        dist.destroy_process_group()


@pytest.mark.parametrize("world,case,schedule", [(2, "mlp", "none"), full_only(2, "gpt", "1f1b"),
                                                 (2, "cnn", "none")])
def test_a_model_built_on_meta_trains_like_eager(world: int, case: str, schedule: str) -> None:
    # Built on the meta device and materialized: each rank initialises, in
    # the one random stream, only the tensors it owns (GPT: the embedding
    # tied to the output layer keeps its first holder's value); training
    # equals the same model materialized whole in one process (the worker
    # checks losses, every gradient and the parameters after 3 steps).
    results = _all_ok(_launch(world, "train", case, "3", schedule, "meta"))
    reports = [r["materialized"] for r in results]
    names = sorted(reports[0]["owned"] + reports[0]["elsewhere"])
    for rep in reports:  # every rank saw the same tensors, and owns a part
        assert sorted(rep["owned"] + rep["elsewhere"]) == names
        assert 0 < rep["resident_bytes"] < rep["total_bytes"], rep
    # Each tensor is owned by exactly one rank, the one whose optimizer updates it.
    owned = [n for rep in reports for n in rep["owned"]]
    assert sorted(owned) == names, reports
    for r in results:
        trained = {n for n in r["owned"]}  # parameters whose gradient this rank got
        params = trained & set(r["materialized"]["owned"])
        assert params == trained, (trained, r["materialized"]["owned"])


@pytest.mark.parametrize("schedule", [full_only("none"), "1f1b"])
def test_materialized_ranks_hold_only_their_own_parameters(schedule: str) -> None:
    # mincore(2) on each 1 MiB weight: the pages of those other ranks own are
    # never resident, neither after materialize nor after 3 training steps;
    # those of the rank's own are.
    results = _all_ok(_launch(2, "memory", schedule))
    weights = sorted(results[0]["after_init"])
    owners = {n: [r["rank"] for r in results if n in r["owned"]] for n in weights}
    assert all(len(o) == 1 for o in owners.values()), owners
    for r in results:
        for n in weights:
            want = 1.0 if owners[n] == [r["rank"]] else 0.0
            assert r["after_init"][n] == want and r["after_steps"][n] == want, (r["rank"], n, r)
        assert r["resident_bytes"] < 0.9 * r["total_bytes"], r


@pytest.mark.parametrize("schedule", [full_only("none"), "1f1b"])
def test_ranks_fed_different_batches_raise_config_error_on_every_rank(schedule: str) -> None:
    # Note [Inputs every rank must agree on]: each rank reads only the inputs
    # placed on its device, so ranks each drawing their own batch trained on
    # x from one and y from another, silently. The first step's fingerprint
    # all-gather makes it a ConfigError on every rank naming the inputs and
    # ranks, before anything changes (the worker checks the parameters);
    # the same batches then train like eager.
    results = _all_ok(_launch(2, "inputs", schedule))
    for r in results:
        assert "different data for 'x', 'y'" in r["error"], r["error"]
        assert "'x' differs in values between ranks [0] vs [1]" in r["error"], r["error"]
        assert "DistributedSampler" in r["error"], r["error"]
    assert results[0]["losses"] == results[1]["losses"]


def test_an_unsupported_graph_over_ranks_is_an_error_not_an_eager_run() -> None:
    # Note [No eager fallback over ranks]: without a process group a graph
    # the runtime cannot run falls back to eager with a warning; over ranks
    # each rank would run it with its own stale copies of other ranks'
    # parameters, so it is an error naming the graph and why (every rank
    # compiles the same graph and raises alike; one rank shows it here).
    import torch.distributed as dist
    from test_compile_backend import _WithCond
    dist.init_process_group("gloo", store=dist.HashStore(), rank=0, world_size=1)
    try:
        fast = torch.compile(_WithCond(), backend="modelpar", options={"devices": "world"})
        with pytest.raises(torch._dynamo.exc.BackendCompilerFailed) as err:
            fast(torch.randn(3, 4))
        inner = err.value.inner_exception
        assert isinstance(inner, modelpar.UnsupportedOpError), repr(inner)
        assert "higher-order op cond" in str(inner), str(inner)
        assert "the forward graph of forward" in str(inner), str(inner)
        assert "never run eagerly instead" in str(inner), str(inner)
    finally:
        torch._dynamo.reset()
        dist.destroy_process_group()


def _load_checkpoint_into_eager(folder: Path, world: int) -> None:
    """The DCP checkpoint the mesh scenario saved, loaded into an eager MLP
    and optimizer in this process (no process group): every tensor equals
    the one its home rank held (the model gathered from the homes of
    replica 0; each rank's momentum buffers, equal over the replicas)."""
    from models import MLP
    torch.manual_seed(1)  # other values than the checkpoint's
    model = MLP()
    opt = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)
    modelpar.distributed.checkpoint.load(model, opt, folder / "dcp")
    reference = torch.load(folder / "reference.pt")
    state = model.state_dict()
    assert list(state) == list(reference["model"])
    for name, want in reference["model"].items():
        assert torch.equal(state[name], want), name
    momentum: dict[str, torch.Tensor] = {}
    for rank in range(world):
        for name, buf in torch.load(folder / f"momentum.rank{rank}.pt").items():
            assert name not in momentum or torch.equal(momentum[name], buf), name
            momentum[name] = buf
    assert sorted(momentum) == sorted(n for n, _ in model.named_parameters())
    for name, p in model.named_parameters():
        assert torch.equal(opt.state[p]["momentum_buffer"], momentum[name]), name
    assert opt.param_groups[0]["momentum"] == 0.9 and opt.param_groups[0]["lr"] == 0.05


@pytest.mark.parametrize("pp,dp,schedule", [(1, 2, "none"), (2, 1, "1f1b"), (2, 2, "1f1b")])
def test_a_mesh_trains_like_eager_on_the_global_batch(pp: int, dp: int, schedule: str,
                                                      tmp_path) -> None:
    # options["mesh"]: each dp replica runs the plan over its pp ranks on its
    # share of the global batch (a DistributedSampler over dp); each stage's
    # gradients are averaged over its dp group. The worker checks each
    # replica's loss, every averaged gradient and every parameter after 3
    # momentum-SGD steps against eager on the global batch (the average of
    # dp means of equal shares is the global mean up to the order of its
    # sums, within the MLP's tolerances.py bound), then saves a DCP
    # checkpoint, which loads into an eager model here with equal tensors.
    results = _all_ok(_launch(pp * dp, "mesh", str(pp), str(dp), schedule, str(tmp_path)))
    assert sorted(r["replica"] for r in results) == sorted(list(range(dp)) * pp)
    for r in results:
        if dp > 1:
            assert f"data parallel: gradients averaged over a dp group of {dp} ranks" in \
                r["summary"], r["summary"]
            assert "bucket" in r["summary"], r["summary"]
            # the all-reduce on a track of its own in the measured trace
            assert len(r["reduces"]) >= 1 and min(r["reduces"]) >= 0, r["reduces"]
    # the replicas' losses differ (their batches do); the stages of one agree
    by_replica: dict[int, list] = {}
    for r in results:
        by_replica.setdefault(r["replica"], []).append(r["losses"])
    assert all(all(ls == v[0] for ls in v) for v in by_replica.values()), by_replica
    if dp > 1:
        assert by_replica[0] != by_replica[1]
    _load_checkpoint_into_eager(tmp_path, pp * dp)


def test_bad_mesh_options_are_config_errors() -> None:
    # Validated up front, before anything is traced, naming the sizes.
    import torch.distributed as dist
    from torch.distributed.device_mesh import init_device_mesh
    resolve = modelpar.planning.options.resolve_options
    with pytest.raises(modelpar.ConfigError, match="mesh needs devices='world'"):
        resolve({"devices": 2, "mesh": {"pp": 2, "dp": 1}})
    dist.init_process_group("gloo", store=dist.HashStore(), rank=0, world_size=1)
    try:
        with pytest.raises(modelpar.ConfigError,
                           match=r"mesh pp=2 x dp=2 = 4 ranks, but the world has 1"):
            resolve({"devices": "world", "mesh": {"pp": 2, "dp": 2}})
        with pytest.raises(modelpar.ConfigError, match="keys 'pp' and 'dp'"):
            resolve({"devices": "world", "mesh": {"pp": 1, "tp": 1}})
        with pytest.raises(modelpar.ConfigError, match=r"mesh\['dp'\]=0 is not valid"):
            resolve({"devices": "world", "mesh": {"pp": 1, "dp": 0}})
        with pytest.raises(modelpar.ConfigError, match="give one"):
            resolve({"devices": "world", "mesh": {"pp": 1, "dp": 1},
                     "process_group": dist.distributed_c10d._get_default_group()})
        with pytest.raises(modelpar.ConfigError, match="named 'pp' and 'dp'"):
            resolve({"devices": "world",
                     "mesh": init_device_mesh("cpu", (1, 1), mesh_dim_names=("pp", "tp"))})
        opts = resolve({"devices": "world", "mesh": {"pp": 1, "dp": 1}})
        assert opts.world and opts.devices == 1 and opts.dp_group is not None
        mesh = init_device_mesh("cpu", (1, 1), mesh_dim_names=("dp", "pp"))
        assert resolve({"devices": "world", "mesh": mesh}).mesh is mesh
    finally:
        dist.destroy_process_group()


def test_a_checkpoint_round_trips_in_one_process_and_refuses_another_model(tmp_path) -> None:
    # Without a process group: DCP's no_dist save and load, every entry
    # (model, momentum buffers, param groups) back equal; another model is
    # a ConfigError naming the missing entry, a missing folder one naming it.
    from models import MLP
    ckpt = modelpar.distributed.checkpoint
    torch.manual_seed(0)
    model = MLP()
    opt = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    torch.nn.functional.mse_loss(model(torch.randn(4, 16)), torch.randn(4, 4)).backward()
    opt.step()
    ckpt.save(model, opt, tmp_path / "c")
    torch.manual_seed(1)
    other = MLP()
    other_opt = torch.optim.SGD(other.parameters(), lr=0.5, momentum=0.5)
    ckpt.load(other, other_opt, tmp_path / "c")
    for (n, a), b in zip(model.state_dict().items(), other.state_dict().values()):
        assert torch.equal(a, b), n
    for p, q in zip(model.parameters(), other.parameters()):
        assert torch.equal(opt.state[p]["momentum_buffer"], other_opt.state[q]["momentum_buffer"])
    assert other_opt.param_groups[0]["lr"] == 0.1
    with pytest.raises(modelpar.ConfigError, match="has no tensor '0.fc1.weight' of the model"):
        ckpt.load(torch.nn.Sequential(MLP()), None, tmp_path / "c")
    with pytest.raises(modelpar.ConfigError, match="cannot read a DCP checkpoint"):
        ckpt.load(model, None, tmp_path / "missing")


def test_training_survives_a_killed_rank_by_resuming_from_its_last_checkpoint(tmp_path) -> None:
    # examples/torchrun_train.py --resume under torchrun --max-restarts 1: rank
    # 1 SIGKILLs itself at step 3 (the checkpoint of steps 0-1 written), the
    # agent restarts the group, the script loads the last complete DCP
    # checkpoint and goes on: every step's loss equals the uninterrupted
    # run's, bit for bit (the same plan, the same parameters, the same batches).
    # Restarts reuse torchrun's store: under the static rendezvous always, under
    # c10d unless TORCH_DISABLE_SHARE_RDZV_TCP_STORE=1 (pytorch#135712). A
    # restarted rank then may read its peer's dead Gloo address from the first
    # attempt ("connectFullMesh ... Connection refused" or a hang, 5 of 12 runs
    # here); c10d with its own store per round passed 8 of 8.
    example = Path(__file__).resolve().parents[2] / "examples" / "torchrun_train.py"
    env = {**os.environ, "OMP_NUM_THREADS": "1", "TORCH_DISABLE_SHARE_RDZV_TCP_STORE": "1",
           "PYTHONPATH": os.pathsep.join(p for p in sys.path if p)}

    def run(folder: Path, *extra: str) -> tuple[dict[int, float], str]:
        # Its own session, so that a timeout kills the workers too, not only
        # the agent (orphaned ranks would hold a core for the rest of the run).
        agent = subprocess.Popen([sys.executable, "-m", "torch.distributed.run", "--nproc-per-node",
                                  "2", "--max-restarts", "1", "--rdzv-backend", "c10d",
                                  "--rdzv-endpoint", f"127.0.0.1:{free_port()}",
                                  str(example), "--pipeline", "1f1b", "--steps", "6",
                                  "--resume", str(folder), "--checkpoint-every", "2", *extra],
                                 env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                                 start_new_session=True)
        try:
            stdout, stderr = agent.communicate(timeout=LIMIT_S)
        except subprocess.TimeoutExpired:
            os.killpg(agent.pid, signal.SIGKILL)
            stdout, stderr = agent.communicate()
            pytest.fail(f"torchrun did not finish in {LIMIT_S} s:\n{stdout[-3000:]}{stderr[-3000:]}")
        assert agent.returncode == 0, stdout[-3000:] + stderr[-3000:]
        losses = {int(line.split()[1]): float(line.split()[-1])
                  for line in stdout.splitlines() if line.startswith("step ")}
        return losses, stdout

    whole, _ = run(tmp_path / "whole")
    resumed, out = run(tmp_path / "killed", "--kill-at", "3")
    assert f"resumed from {tmp_path / 'killed' / 'step2'}" in out, out
    assert sorted(whole) == list(range(6)) and resumed == whole, (resumed, whole)


def test_input_fingerprints_see_shape_dtype_and_sampled_values_and_the_check_period() -> None:
    import torch.distributed as dist
    from modelpar.distributed.input_check import SAMPLES, AgreementCheck, fingerprint
    x = torch.arange(4096, dtype=torch.float32).reshape(64, 64)
    assert fingerprint(x) == fingerprint(x.clone())
    assert fingerprint(x)[0] != fingerprint(x.double())[0]          # dtype
    assert fingerprint(x)[0] != fingerprint(x.reshape(32, 128))[0]  # shape
    changed = x.clone()
    changed.view(-1)[4096 // SAMPLES] += 1                          # a sampled element
    assert fingerprint(changed)[0] == fingerprint(x)[0] and fingerprint(changed) != fingerprint(x)
    assert fingerprint(x.t()) != fingerprint(x)                     # a view's own order
    assert fingerprint(torch.ones(3, dtype=torch.bool)) != fingerprint(torch.zeros(3, dtype=torch.bool))
    assert fingerprint(8) != fingerprint(9) and fingerprint(None) == fingerprint(None)
    dist.init_process_group("gloo", store=dist.HashStore(), rank=0, world_size=1)
    try:
        group = dist.distributed_c10d._get_default_group()
        for every, due in ((0, [True, False, False, False, False]),
                           (2, [True, False, True, False, True])):
            check = AgreementCheck(group, [0], ["x"], every, 5.0, "a step", lambda n, d: d)
            got = []
            for _ in range(5):
                got.append(check.due())
                check.maybe_check([x])
            assert got == due, (every, got)
    finally:
        dist.destroy_process_group()
