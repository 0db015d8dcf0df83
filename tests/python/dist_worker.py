"""One rank of the distributed tests (test_distributed.py starts N of these,
or torchrun does). Reads RANK / WORLD_SIZE / MASTER_ADDR / MASTER_PORT from
the environment, initialises a Gloo group and runs one scenario; prints
``RESULT <json>`` on success and exits 1 with the traceback otherwise.

Scenarios:
  train CASE STEPS [PIPELINE [release|clip|scaler|trace|meta|outside]]  the test model CASE
      (tests/python/models.py, or "zoo:NAME": a transformers model of
      tests/python/zoo.py, its loss computed inside the model, or
      "graph-breaks": models.GraphBroken, cut into four graphs by Dynamo),
      compiled with devices="world" (or a pipeline over the ranks: "gpipe",
      "1f1b", "1f1b*", "interleaved", "zb-h1", "zb-v"; "none"), against eager in this
      process: the loss of each step, every gradient (summed over ranks: each
      exists on its owner only) and the parameters after STEPS momentum-SGD
      steps, then one inference (no_grad) step. With "release", the parameters
      other ranks own are released after step 0 (filled with NaN: never read).
      With "clip", the gradients are clipped every step
      (modelpar.clip_grad_norm_ against torch.nn.utils.clip_grad_norm_ in
      eager). With "meta", the model is built on the meta device and
      materialized (each rank initialises only what it owns); eager is the
      same model materialized whole in this process.
  loop twice|accumulate PIPELINE  the GPT trained as loops are written:
      the model alone called on two batches before one backward, or two
      backward calls per update; gradients summed over ranks against eager.
  memory PIPELINE  a wide MLP built on the meta device and materialized: the
      pages of the parameters other ranks own are never resident, those of
      its own are; 3 steps equal eager.
  fault raise|kill|hang RANK  rank RANK fails in step 1 (raises, is killed,
      or sleeps); the others must raise modelpar.ExecutionError naming it.
  generate NAME PIPELINE [trained]  the transformers model NAME
      (tests/python/zoo.py) decoding with a KV cache (model.generate) over the
      ranks, placed ("none") or pipelined ("gpipe" / "1f1b"), after 2 SGD
      steps through the same compiled forward with "trained": tokens and
      logits equal eager.
  state  a batch-norm MLP pipelined over the ranks: release_unowned refused
      after inference-only steps, state dicts equal eager after inference,
      after batch norm's in-place writes under no_grad, and after a training
      step and release_unowned.
  inputs PIPELINE  the MLP with each rank fed its own batch: ConfigError on
      every rank, nothing changed; then 3 steps on the same batches equal eager.
  mesh PP DP PIPELINE [DIR]  the MLP on a pp x dp mesh (options["mesh"]),
      batches from a DistributedSampler over dp, against eager on the global
      batch; with DIR, a DCP checkpoint and references saved there.
  mismatch  rank 1 compiles a model of another width: the plan check raises.
  evaluate-elsewhere  the MLP trained through one compiled function and run
      under no_grad through another whose plan binds a parameter on the other
      rank: every rank raises ExecutionError.
"""

from __future__ import annotations

import copy
import json
import os
import sys
import time
import traceback
from datetime import timedelta

import torch
import torch.distributed as dist

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import modelpar  # noqa: E402
from models import CASES, GRAPH_BREAKS, MLP  # noqa: E402
from tolerances import Compiled, Reordered  # noqa: E402


def _device() -> torch.device:
    """cpu with Gloo; the rank's GPU with NCCL (MODELPAR_DIST_BACKEND=nccl,
    scripts/gpu_check.sh)."""
    if os.environ.get("MODELPAR_DIST_BACKEND") == "nccl":
        return torch.device("cuda", int(os.environ.get("LOCAL_RANK", "0")))
    return torch.device("cpu")


def _result(**kw) -> None:
    print("RESULT " + json.dumps(kw), flush=True)


def _owned(model: torch.nn.Module) -> dict[str, bool]:
    return {n: p.grad is not None for n, p in model.named_parameters()}


def _summed(t: torch.Tensor | None, like: torch.Tensor) -> torch.Tensor:
    out = t.detach().clone() if t is not None else torch.zeros_like(like)
    dist.all_reduce(out)
    return out


class _Case:
    """A test model (models.CASES) or a real one ("zoo:NAME", zoo.ZOO) seen
    the same way: make_model, batch, tol, batch_size, and the loss of a
    model on a batch."""

    def __init__(self, name: str) -> None:
        if name.startswith("zoo:"):
            from zoo import ZOO
            self._zoo = ZOO[name[len("zoo:"):]]
            self._test = None
        else:
            self._zoo = None
            self._test = GRAPH_BREAKS if name == "graph-breaks" else CASES[name]
        c = self._zoo or self._test
        self.make_model, self.batch, self.tol, self.batch_size = (
            c.make_model, c.batch, c.tol, c.batch_size)

    def loss(self, model: torch.nn.Module, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        if self._zoo is not None:
            return self._zoo.step(model, x, y)
        return self._test.loss(model(x), y)


def train(case_name: str, steps: int, pipeline: str | None, extra: str | None = None) -> None:
    """pipeline: a schedule, "none" (m-ETF) or "auto" (strategy="auto").
    extra: "release" (release_unowned after the first step), "clip"
    (modelpar.clip_grad_norm_ every step, against torch's in eager), "scaler"
    (modelpar.GradScaler against torch's in eager, with an inf put into one
    rank's gradient in step 0), "dropped" (the model's own activation
    checkpointing with every dropout at p = 1: masks that do not depend on
    which rank draws them, replayed in the recompute), "lora" (a zoo model
    with peft's LoRA adapters, every base weight frozen), "trace" (the
    trace option, files in $MODELPAR_TEST_TRACE_DIR), "meta" (built on meta,
    materialized) or "own-cache" (each rank its own profile cache,
    $MODELPAR_TEST_CACHE_ROOT/rank<r>, and the calibrated profile on), or
    "outside" (the model alone compiled, its loss computed outside: GPipe
    runs as two programs, the forward's and the backward's; the last step at
    a new batch size), or "inductor" (kernels="inductor")."""
    if extra == "own-cache":
        os.environ["XDG_CACHE_HOME"] = os.path.join(os.environ["MODELPAR_TEST_CACHE_ROOT"],
                                                    f"rank{dist.get_rank()}")
        os.environ.pop("MODELPAR_CPU_PROFILE", None)
    release = extra == "release"
    meta = extra == "meta"
    clip = extra == "clip"
    # "scaler": modelpar.GradScaler against torch's in eager (an overflow injected in step 0)
    scaler = modelpar.GradScaler("cpu", init_scale=1024.0) if extra == "scaler" else None
    ref_scaler = torch.amp.GradScaler("cpu", init_scale=1024.0) if scaler is not None else None
    scales: list[tuple[float, float]] = []
    norms: list[tuple[float, float]] = []  # (total, this rank's own) per step
    trace_dir = os.environ["MODELPAR_TEST_TRACE_DIR"] if extra == "trace" else None
    case = _Case(case_name)
    tol = case.tol.after(steps=steps)
    torch.manual_seed(0)  # the same initial parameters on every rank and in eager
    dev = _device()
    if meta:  # nothing allocated until materialize (below)
        with torch.device("meta"):
            model = case.make_model()
            eager = case.make_model()
    else:
        model = case.make_model().to(dev)
        if extra == "dropped":
            from zoo import dropping
            dropping(1.0)(model)
        elif extra == "lora":
            from zoo import lora_adapters
            lora_adapters(case_name[len("zoo:"):])(model)
        eager = copy.deepcopy(model)
    options: dict = {"devices": "world", "strict": True, "peer_timeout": 20.0}
    if pipeline == "auto":
        options["strategy"] = "auto"
    elif pipeline and pipeline != "none":
        options["pipeline"] = {"schedule": pipeline, "microbatches": 4}
        if extra == "dropped":  # the model checkpoints itself; p = 1 draws the same everywhere
            options["pipeline"].update(checkpoint="never", allow_random=True)
    if trace_dir:
        options["trace"] = os.path.join(trace_dir, "step.json")
    # Each rank measures its own device (Note [Measured memory]).
    options["measure_memory"] = extra is None and pipeline != "auto"
    if extra == "inductor":  # Note [Kernel regions]: within tolerances.Compiled
        options["kernels"] = "inductor"
        tol = Compiled(tol.reduction, tol.depth, tol.steps)

    def step_fn(x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        return case.loss(model, x, y)

    if extra == "outside":
        compiled = torch.compile(model, backend="modelpar", options=options)
        fast = lambda x, y: case.loss(compiled, x, y)  # noqa: E731
    else:
        fast = torch.compile(step_fn, backend="modelpar", options=options)
    materialized = None
    if meta:
        torch.manual_seed(0)
        modelpar.distributed.materialize.materialize_all(eager)
        torch.manual_seed(0)
        report = modelpar.materialize(model, fast, *case.batch(0, case.batch_size))
        print(report, flush=True)
        materialized = {"owned": report.owned, "elsewhere": report.elsewhere,
                        "resident_bytes": report.resident_bytes,
                        "total_bytes": report.total_bytes}
    opt = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)
    ref_opt = torch.optim.SGD(eager.parameters(), lr=0.05, momentum=0.9)
    losses = []
    max_grad = 0.0  # the largest gradient of any step
    owners: dict[str, int] = {}
    released = 0
    for step in range(steps):
        # "outside": the last step at a new batch size (planned again; a saved
        # size is an output every rank must get as an int)
        size = case.batch_size + (2 if extra == "outside" and step == steps - 1 else 0)
        x, y = (t.to(dev) for t in case.batch(step, size))
        loss = fast(x, y)
        ref = case.loss(eager, x, y)
        tol.assert_close(loss.detach(), ref.detach())
        if scaler is not None:  # gradients times the scale, as fp16 training makes them
            scaler.scale(loss).backward()
            ref_scaler.scale(ref).backward()
        else:
            loss.backward()
            ref.backward()
        if clip:  # a max norm the gradients exceed, so that clipping scales them
            kind = (2.0, float("inf"), 1.0)[step % 3]
            here = [p.grad for p in model.parameters() if p.grad is not None]
            local = float(torch.nn.utils.get_total_norm(here, kind)) if here else 0.0
            norm = modelpar.clip_grad_norm_(model, 0.05, norm_type=kind)
            ref_norm = torch.nn.utils.clip_grad_norm_(eager.parameters(), 0.05, norm_type=kind)
            assert float(ref_norm) > 0.05, float(ref_norm)
            tol.assert_close(norm, ref_norm, msg=lambda m: f"step {step}, gradient norm: {m}")
            norms.append((float(norm), local))
        counts = {}
        # A gradient's terms have the size of the model's gradients; some are
        # zero in exact arithmetic (attention key biases: softmax ignores a
        # shift of all scores), so the scale is the largest gradient.
        grad_scale = max(float(q.grad.abs().max()) for q in eager.parameters()
                         if q.grad is not None)
        max_grad = max(max_grad, grad_scale)
        for (n, p), q in zip(model.named_parameters(), eager.parameters()):
            here = torch.tensor([1 if p.grad is not None else 0], device=dev)
            dist.all_reduce(here)
            counts[n] = int(here.item())
            if q.grad is None:  # frozen: on no rank
                assert counts.pop(n) == 0, f"step {step}: frozen {n} got a gradient"
                continue
            got = _summed(p.grad, p)
            tol.assert_close(got, q.grad, scale=grad_scale,
                             msg=lambda m: f"step {step}, grad of {n}: {m}")
            if p.grad is not None:
                owners[n] = dist.get_rank()
        assert all(c == 1 for c in counts.values()), f"each gradient on one rank: {counts}"
        if scaler is not None:
            if step == 0:  # an overflow in the last parameter's gradient, on its rank only
                last = list(model.parameters())[-1]
                if last.grad is not None:
                    last.grad.view(-1)[0] = float("inf")
                list(eager.parameters())[-1].grad.view(-1)[0] = float("inf")
            scaler.step(opt)
            scaler.update()
            ref_scaler.step(ref_opt)
            ref_scaler.update()
            scales.append((scaler.get_scale(), ref_scaler.get_scale()))
        else:
            opt.step()
            ref_opt.step()
        opt.zero_grad()
        ref_opt.zero_grad()
        losses.append(float(loss.detach()))
        if release and step == 0:  # NaN where other ranks own: any read would show
            released = modelpar.release_unowned(model, poison=True)
    traced = None
    if trace_dir:  # the last training step's trace, this rank's file
        events = json.loads(open(os.path.join(trace_dir, f"step.rank{dist.get_rank()}.json")).read())
        spans = [e for e in events["traceEvents"] if e.get("ph") == "X"]
        traced = {"pids": sorted({e["pid"] for e in spans}),
                  "runs": sum(e["cat"] == "run" for e in spans),
                  "pieces": sorted({e["args"]["piece"] for e in spans}),
                  "simulated": os.path.exists(os.path.join(trace_dir, "step.simulated.json"))}
    # Parameters after the steps: each is current on its owner only. They
    # moved by lr x (momentum-summed) gradients, whose terms have the size of
    # the largest gradient (a parameter initialised to zero, such as a key
    # bias, holds only that rounding noise).
    update_scale = 0.05 * steps / (1 - 0.9) * max_grad
    for n, p in model.named_parameters():
        want = dict(eager.named_parameters())[n].detach()
        if not p.requires_grad:  # frozen: every rank's copy as it was
            assert torch.equal(p.detach(), want), f"frozen {n} changed"
            continue
        mine = p.detach().clone() if owners.get(n) == dist.get_rank() else torch.zeros_like(p)
        dist.all_reduce(mine)
        tol.assert_close(mine, want, scale=max(float(want.abs().max()), update_scale),
                         msg=lambda m: f"parameter {n} after {steps} steps: {m}")
    # The state for a checkpoint: each entry in exactly one rank's shard, and
    # gathered on rank 0 it equals eager's state (parameters and buffers).
    shard = sorted(modelpar.owned_state_dict(model))
    gathered = modelpar.gather_state_dict(model)
    if dist.get_rank() == 0:
        want = eager.state_dict()
        assert list(gathered) == list(want), (list(gathered), list(want))
        for n, v in want.items():
            assert gathered[n].device.type == "cpu"
            if v.is_floating_point():
                tol.assert_close(gathered[n], v.cpu(), scale=max(float(v.abs().max()), update_scale),
                                 msg=lambda m, n=n: f"state {n}: {m}")
            else:
                assert torch.equal(gathered[n], v.cpu()), n
    else:
        assert gathered == {}
    # An inference graph (no_grad), planned alone (a pipeline's forward-only
    # partition cuts the layers elsewhere): the parameters it binds on another
    # rank than training did are moved home (Note [One home per parameter]),
    # so it equals eager, also where other ranks' copies were released.
    x, y = (t.to(dev) for t in case.batch(steps, case.batch_size))
    with torch.no_grad():
        tol.assert_close(fast(x, y), case.loss(eager, x, y), msg=lambda m: f"inference: {m}")
    inference = "ok"
    # The plan plans() reports for it is the one that ran: every parameter
    # bound on the rank that owns it, and a `rehome-inputs` row (its step
    # simulated again with the added transfers) when any had to move.
    rec = modelpar.plans()[-1]
    evaluated = rec.pipeline or rec.joint or rec.graphs["inference"].placement
    bound = dict(zip(evaluated.program.graph.input_names,
                     modelpar._C.input_devices(evaluated.program)))
    misplaced = {n: (bound[n], r) for n, r in owners.items() if n in bound and bound[n] != r}
    assert not misplaced, f"inference binds parameters off their owners: {misplaced}"
    rehomed = "rehome-inputs" in str(evaluated)
    own = sorted(owners)
    searched = None
    if pipeline == "auto":
        rec = next(r for r in modelpar.plans() if r.search is not None)
        searched = {"machine": rec.search_machine,
                    "candidates": [(c["label"], c["status"], c["step_us"], c["chosen"])
                                   for c in rec.candidates]}
    # With measure_memory: what the training step's record shows, per rank
    # its own device's measured peak beside the plan's simulated ones.
    def kind(r) -> str:
        return ("step" if r.pipeline_mode == "step" else "placed" if r.joint is not None
                else "other")
    measured = [(sorted(r.measured_peak_bytes.items()), r.simulated_peak_bytes, kind(r))
                for r in modelpar.plans() if r.measured_peak_bytes]
    from modelpar.distributed import rank_executor as mp_dist
    replayed = any("aten::native_dropout_backward" in str(planned.program.graph)
                   for r in modelpar.plans() for planned in (r.pipeline, r.joint)
                   if planned is not None)
    _result(rank=dist.get_rank(), losses=losses, owned=own, searched=searched, shard=shard,
            replayed=replayed,
            reverse_group=bool(mp_dist._reverse_groups),
            plan=str(modelpar.plans()[-1].runs_on), plans=[p.runs_on for p in modelpar.plans()],
            stages=[[p.pipeline.schedule, list(p.pipeline.stage_device)]
                    for p in modelpar.plans() if p.pipeline is not None],
            released=released, inference=inference, rehomed=rehomed, norms=norms, scales=scales,
            traced=traced, materialized=materialized, measured=measured)


def _resident(t: torch.Tensor) -> float:
    """The fraction of the memory pages wholly inside ``t``'s storage that
    are resident (mincore(2))."""
    import ctypes
    libc = ctypes.CDLL(None, use_errno=True)
    page = os.sysconf("SC_PAGE_SIZE")
    start = t.untyped_storage().data_ptr()
    end = start + t.untyped_storage().nbytes()
    lo, hi = -(-start // page) * page, end // page * page
    assert hi > lo, "a tensor of less than a page"
    vec = (ctypes.c_ubyte * ((hi - lo) // page))()
    if libc.mincore(ctypes.c_void_p(lo), ctypes.c_size_t(hi - lo), vec) != 0:
        raise OSError(ctypes.get_errno(), "mincore")
    return sum(v & 1 for v in vec) / len(vec)


def memory(pipeline: str) -> None:
    """A wide MLP (8 x Linear(512, 512): 1 MiB per weight) on the meta device."""
    def make() -> torch.nn.Module:
        return torch.nn.Sequential(*[m for _ in range(8)
                                     for m in (torch.nn.Linear(512, 512), torch.nn.Tanh())])
    torch.manual_seed(0)
    eager = make()  # the default init draws what the constructors draw
    with torch.device("meta"):
        model = make()
    options: dict = {"devices": "world", "strict": True, "peer_timeout": 20.0}
    if pipeline != "none":
        options["pipeline"] = {"schedule": pipeline, "microbatches": 4}

    def step_fn(x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        return torch.nn.functional.mse_loss(model(x), y)

    fast = torch.compile(step_fn, backend="modelpar", options=options)
    g = torch.Generator().manual_seed(1)
    batches = [(torch.randn(16, 512, generator=g), torch.randn(16, 512, generator=g))
               for _ in range(3)]
    torch.manual_seed(0)
    report = modelpar.materialize(model, fast, *batches[0])
    weights = {n: p for n, p in model.named_parameters() if n.endswith("weight")}
    after_init = {n: _resident(p) for n, p in weights.items()}
    opt = torch.optim.SGD(model.parameters(), lr=0.05)
    ref_opt = torch.optim.SGD(eager.parameters(), lr=0.05)
    # Placement and micro-batching reorder the 512-term sums of 8 layers,
    # forward and backward (tests/python/tolerances.py), over 3 SGD steps.
    tol = Reordered(512, depth=16).after(steps=3)
    for x, y in batches:
        loss, ref = fast(x, y), torch.nn.functional.mse_loss(eager(x), y)
        tol.assert_close(loss.detach(), ref.detach())
        loss.backward()
        ref.backward()
        opt.step()
        ref_opt.step()
        opt.zero_grad()
        ref_opt.zero_grad()
    for n, p in model.named_parameters():
        if n in report.owned:
            tol.assert_close(p.detach(), dict(eager.named_parameters())[n].detach(),
                             msg=lambda m: f"parameter {n}: {m}")
    _result(rank=dist.get_rank(), owned=report.owned, resident_bytes=report.resident_bytes,
            total_bytes=report.total_bytes, after_init=after_init,
            after_steps={n: _resident(p) for n, p in weights.items()})


def fault(how: str, bad_rank: int) -> None:
    torch.manual_seed(0)
    model = MLP()
    opts = {"devices": "world", "strict": True, "peer_timeout": 8.0}

    def step_fn(x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        return torch.nn.functional.mse_loss(model(x), y)

    fast = torch.compile(step_fn, backend="modelpar", options=opts)
    x, y = torch.randn(8, 16), torch.randn(8, 4)
    fast(x, y).backward()  # step 0: everyone healthy
    rank = dist.get_rank()
    if rank == bad_rank:
        if how == "raise":
            raise RuntimeError(f"injected failure on rank {rank}")
        if how == "kill":
            os.kill(os.getpid(), 9)
        # hang: the others time out after peer_timeout (8 s) and raise; the
        # test waits for this rank too, so it hangs no longer than needed
        # (7 s of slack: the others started waiting when this rank began to)
        time.sleep(15)
        return
    start = time.monotonic()
    try:
        fast(x, y).backward()
    except modelpar.ExecutionError as e:
        _result(rank=rank, error=str(e), seconds=time.monotonic() - start,
                type=type(e).__name__)
        os._exit(0)  # do not wait in the group's destructor for the failed rank
    raise AssertionError(f"rank {rank}: step 1 succeeded although rank {bad_rank} failed")


def _mlp_options(schedule: str, **extra) -> dict:
    options: dict = {"devices": "world", "strict": True, "peer_timeout": 20.0, **extra}
    if schedule != "none":
        options["pipeline"] = {"schedule": schedule, "microbatches": 2}
    return options


def inputs(schedule: str) -> None:
    """The MLP over the ranks (m-ETF, "none", or a pipeline): a first step
    where each rank draws its own batch is a ConfigError on every rank,
    before any parameter changes (Note [Inputs every rank must agree on]);
    then 3 steps on the same batches equal eager."""
    case = CASES["mlp"]
    torch.manual_seed(0)
    model = case.make_model()
    eager = copy.deepcopy(model)
    before = {n: p.detach().clone() for n, p in model.named_parameters()}
    fast = torch.compile(lambda x, y: case.loss(model(x), y), backend="modelpar",
                         options=_mlp_options(schedule))
    opt = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)
    x, y = case.batch(100 + dist.get_rank(), case.batch_size)  # the DistributedSampler habit
    try:
        fast(x, y).backward()
        opt.step()
        raise AssertionError("ranks fed different batches trained without an error")
    except modelpar.ConfigError as e:
        error = str(e)
    for n, p in model.named_parameters():
        assert torch.equal(p.detach(), before[n]) and p.grad is None, f"{n} changed"
    ref_opt = torch.optim.SGD(eager.parameters(), lr=0.05, momentum=0.9)
    tol = case.tol.after(steps=3)
    losses = []
    for step in range(3):
        x, y = case.batch(step, case.batch_size)
        loss = fast(x, y)
        ref = case.loss(eager(x), y)
        tol.assert_close(loss.detach(), ref.detach(), msg=lambda m: f"step {step}: {m}")
        loss.backward()
        ref.backward()
        opt.step(), ref_opt.step(), opt.zero_grad(), ref_opt.zero_grad()
        losses.append(float(loss))
    _result(rank=dist.get_rank(), error=error, losses=losses)


def mesh(pp: int, dp: int, schedule: str, ckpt: str | None = None) -> None:
    """The MLP on a mesh of pp x dp ranks (options["mesh"]), each replica
    drawing its share of the global batch through a DistributedSampler over
    the dp dimension, against eager on the global batch: the loss of each
    replica's share, and every parameter after 3 momentum-SGD steps on the
    ranks that hold it. With ``ckpt``: the checkpoint saved after (DCP),
    beside what rank 0 gathered of its replica's state and every rank's
    optimizer state, for the test to load and compare."""
    from torch.utils.data import DistributedSampler
    case = CASES["mlp"]
    torch.manual_seed(0)
    model = case.make_model()
    eager = copy.deepcopy(model)
    options = _mlp_options(schedule, mesh={"pp": pp, "dp": dp})
    if ckpt:  # the measured trace, with the all-reduce's track
        options["trace"] = os.path.join(ckpt, "trace", "step.json")
    fast = torch.compile(lambda x, y: case.loss(model(x), y), backend="modelpar", options=options)
    grid = modelpar.distributed.mesh.device_mesh(pp, dp)
    replica = grid.get_local_rank("dp")
    opt = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)
    ref_opt = torch.optim.SGD(eager.parameters(), lr=0.05, momentum=0.9)
    tol = case.tol.after(steps=3)
    per_replica = case.batch_size
    sampler = DistributedSampler(range(dp * per_replica), num_replicas=dp, rank=replica,
                                 shuffle=False)
    rows = torch.tensor(list(sampler))
    losses = []
    max_grad = 0.0
    for step in range(3):
        gx, gy = case.batch(step, dp * per_replica)  # the global batch
        x, y = gx[rows], gy[rows]
        loss = fast(x, y)
        tol.assert_close(loss.detach(), case.loss(eager(x), y).detach(),
                         msg=lambda m: f"step {step}, replica {replica}'s loss: {m}")
        loss.backward()
        ref_opt.zero_grad()
        case.loss(eager(gx), gy).backward()
        max_grad = max(max_grad, max(float(q.grad.abs().max()) for q in eager.parameters()))
        for (n, p), q in zip(model.named_parameters(), eager.parameters()):
            if p.grad is not None:  # averaged over the replicas: the global batch's
                tol.assert_close(p.grad, q.grad, scale=max_grad,
                                 msg=lambda m, n=n: f"step {step}, grad of {n}: {m}")
        opt.step(), ref_opt.step(), opt.zero_grad()
        losses.append(float(loss))
    update_scale = 0.05 * 3 / (1 - 0.9) * max_grad
    owned = []
    for n, p in model.named_parameters():
        if p in opt.state:  # stepped here: this rank is its home
            want = dict(eager.named_parameters())[n].detach()
            tol.assert_close(p.detach(), want, scale=max(float(want.abs().max()), update_scale),
                             msg=lambda m, n=n: f"parameter {n} after 3 steps: {m}")
            owned.append(n)
    # every parameter held by exactly one rank of each replica
    counts = torch.tensor([1 if n in owned else 0 for n, _ in model.named_parameters()])
    dist.all_reduce(counts)
    assert counts.tolist() == [dp] * len(counts), counts
    summary = str(modelpar.plans()[-1])
    reduces = []
    if ckpt:
        with open(os.path.join(ckpt, "trace", f"step.rank{dist.get_rank()}.json")) as f:
            events = json.load(f)["traceEvents"]
        reduces = [e["ts"] for e in events if e.get("cat") == "dp-all-reduce"]
    if ckpt:
        modelpar.distributed.checkpoint.save(model, opt, os.path.join(ckpt, "dcp"))
        gathered = modelpar.gather_state_dict(model, process_group=grid.get_group("pp"))
        momentum = {n: opt.state[p]["momentum_buffer"].clone()
                    for n, p in model.named_parameters() if p in opt.state}
        torch.save(momentum, os.path.join(ckpt, f"momentum.rank{dist.get_rank()}.pt"))
        if dist.get_rank() == 0:
            torch.save({"model": gathered, "eager": eager.state_dict()},
                       os.path.join(ckpt, "reference.pt"))
    _result(rank=dist.get_rank(), replica=replica, losses=losses, owned=owned,
            summary=summary, reduces=reduces)


def evaluate_elsewhere() -> None:
    """Trains the MLP pipelined (GPipe) through one compiled function, then
    evaluates it through another torch.compile of the model, whose forward
    partition binds fc2 on the other rank: every rank refuses the run."""
    torch.manual_seed(0)
    model = MLP()
    pipeline = {"schedule": "gpipe", "microbatches": 4}
    opts = {"devices": "world", "strict": True, "peer_timeout": 8.0, "pipeline": pipeline}
    fast = torch.compile(lambda x, y: torch.nn.functional.mse_loss(model(x), y),
                         backend="modelpar", options=opts)
    x, y = torch.randn(8, 16), torch.randn(8, 4)
    fast(x, y).backward()
    evaluate = torch.compile(model, backend="modelpar", options=opts)
    try:
        with torch.no_grad():
            evaluate(x)
    except modelpar.ExecutionError as e:
        _result(rank=dist.get_rank(), error=str(e))
        return
    raise AssertionError("another compile bound a parameter elsewhere but nothing was raised")


def generate(name: str, pipeline: str, trained: bool = False) -> None:
    """zoo NAME decoding greedily with a KV cache (model.generate) over the
    ranks, placed (m-ETF, "none") or a pipeline over them: the tokens equal
    eager's in this process, every step's logits within the model's
    tolerance. ``trained``: first 2 momentum-SGD steps through the same
    compiled forward (the loss outside it), as eager does, so the decode
    graphs read the parameters each rank's optimizer updated."""
    from zoo import ZOO
    case = ZOO[name]
    torch.manual_seed(0)
    model = case.make_model()
    eager = copy.deepcopy(model)
    options: dict = {"devices": "world", "strict": True, "peer_timeout": 20.0}
    if pipeline != "none":
        options["pipeline"] = {"schedule": pipeline, "microbatches": 2, "checkpoint": "never"}
    model.forward = torch.compile(model.forward, backend="modelpar", options=options)
    if trained:
        opts = [torch.optim.SGD(m.parameters(), lr=0.05, momentum=0.9) for m in (model, eager)]
        for step in range(2):
            x, y = case.batch(step, case.batch_size)
            for m, opt in zip((model, eager), opts):
                case.step(m, x, y).backward()
                opt.step()
                opt.zero_grad()
    model.eval(), eager.eval()
    prompt = case.batch(0, 2)[0][:, :6]
    kwargs = dict(attention_mask=torch.ones_like(prompt), max_new_tokens=6, do_sample=False,
                  output_logits=True, return_dict_in_generate=True)
    eager = eager.generate(prompt, **kwargs)
    for step, logits in enumerate(eager.logits):  # greedy tokens are exact unless near a tie
        top2 = logits.topk(2).values
        assert (top2[:, 0] - top2[:, 1]).min() > 1e-4, f"a near tie at step {step}: pick a seed"
    out = model.generate(prompt, **kwargs)
    assert torch.equal(out.sequences, eager.sequences), (out.sequences, eager.sequences)
    for got, want in zip(out.logits, eager.logits):
        case.tol.assert_close(got, want)
    _result(rank=dist.get_rank(), tokens=out.sequences.tolist(), graphs=len(modelpar.plans()))


def mismatch() -> None:
    torch.manual_seed(0)
    model = MLP(d_hidden=32 if dist.get_rank() == 0 else 48)
    fast = torch.compile(model, backend="modelpar",
                         options={"devices": "world", "strict": True, "peer_timeout": 8.0})
    try:
        fast(torch.randn(8, 16)).sum().backward()
    except torch._dynamo.exc.BackendCompilerFailed as e:  # how Dynamo passes on backend errors
        inner = e.inner_exception
        assert isinstance(inner, modelpar.ConfigError), repr(inner)
        _result(rank=dist.get_rank(), error=str(inner))
        return
    raise AssertionError("the plans differ but nothing was raised")


def first_rank() -> None:
    """from_first_rank: rank 0's value reaches every rank; rank 0's error
    too, with its type when it is modelpar's (Note [Measured once, planned
    everywhere])."""
    from modelpar.distributed.first_rank import from_first_rank
    group = dist.distributed_c10d._get_default_group()
    rank = dist.get_rank()
    got = from_first_rank(lambda: {"rank": rank, "times": [1.5, -1.0]}, group, "a value", 20.0)

    def fails() -> None:
        raise modelpar.PlanDoesNotFitError("layer fc1 needs 9 MiB on device 0")
    try:
        from_first_rank(fails, group, "the node times", 20.0)
    except modelpar.PlanDoesNotFitError as e:
        _result(rank=rank, got=got, error=str(e))
        return
    raise AssertionError("rank 0's error did not reach this rank")


def loop(pattern: str, pipeline: str) -> None:
    """The GPT trained over the ranks as loops are written: "twice" (the
    model alone compiled, called on two batches before one backward) or
    "accumulate" (two backward calls into .grad before each update); the
    losses and every gradient (summed over ranks) against eager."""
    case = CASES["gpt"]
    torch.manual_seed(0)
    model = case.make_model()
    eager = copy.deepcopy(model)
    options: dict = {"devices": "world", "strict": True, "peer_timeout": 20.0}
    if pipeline != "none":
        options["pipeline"] = {"schedule": pipeline, "microbatches": 2}
    tol = case.tol.after(steps=4)
    losses = []
    if pattern == "twice":
        fast = torch.compile(model, backend="modelpar", options=options)
        for step in range(2):
            x1, y = case.batch(step, 8)
            x2, _ = case.batch(step + 10, 8)
            loss = case.loss(fast(x1), y) + 0.5 * case.loss(fast(x2), y)
            ref = case.loss(eager(x1), y) + 0.5 * case.loss(eager(x2), y)
            tol.assert_close(loss.detach(), ref.detach(), msg=lambda m: f"step {step}: {m}")
            loss.backward()
            ref.backward()
            losses.append(float(loss))
    else:
        fast = torch.compile(lambda x, y: case.loss(model(x), y), backend="modelpar",
                             options=options)
        for part in range(2):
            x, y = case.batch(part, 8)
            loss = fast(x, y) / 2
            ref = case.loss(eager(x), y) / 2
            tol.assert_close(loss.detach(), ref.detach(), msg=lambda m: f"part {part}: {m}")
            loss.backward()
            ref.backward()
            losses.append(float(loss))
    scale = max(float(q.grad.abs().max()) for q in eager.parameters())
    for (n, p), q in zip(model.named_parameters(), eager.parameters()):
        tol.assert_close(_summed(p.grad, p), q.grad, scale=scale,
                         msg=lambda m, n=n: f"grad of {n}: {m}")
    _result(losses=losses)


def state() -> None:
    """Issue 36's state over ranks: a batch-norm MLP pipelined over the ranks
    (stage s on rank s). After inference-only steps release_unowned is
    refused (no home known) and gather_state_dict equals eager; a no_grad
    step in train mode writes the running statistics on their rank, which
    becomes their home (gathered from there); after a training step
    release_unowned releases the other ranks' tensors and the state dicts
    are what they were before it."""
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(16, 32), torch.nn.ReLU(), torch.nn.Linear(32, 32),
                                torch.nn.BatchNorm1d(32), torch.nn.ReLU(), torch.nn.Linear(32, 4))
    eager = copy.deepcopy(model)
    opts = {"devices": "world", "strict": True, "peer_timeout": 8.0,
            "pipeline": {"schedule": "gpipe", "microbatches": 2}}
    fast = torch.compile(model, backend="modelpar", options=opts)
    x = torch.randn(8, 16)
    rank = dist.get_rank()

    def same_state() -> bool | list[str] | None:
        """True, or the entries that differ from eager's (on rank 0)."""
        full = modelpar.gather_state_dict(model)
        if rank != 0:
            return None
        want = eager.state_dict()
        differ = [f"{n}: {float((full[n].float() - w.float()).abs().max()):.3g}"
                  if n in full else f"{n}: missing" for n, w in want.items()
                  if n not in full or not torch.allclose(full[n].float(), w.float(), atol=1e-5)]
        return not differ or differ

    model.eval()
    eager.eval()
    with torch.no_grad():
        fast(x)
    try:
        modelpar.release_unowned(model)
        refused = None
    except modelpar.ConfigError as e:
        refused = str(e)
    after_inference = same_state()
    model.train()
    eager.train()
    with torch.no_grad():  # batch norm writes its running statistics in place
        fast(x)
        eager(x)
    after_writes = same_state()
    # A training step (its micro-batches normalize by their own statistics,
    # so the state is compared with the gathered state before the release).
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    fast(x).square().mean().backward()
    opt.step()
    trained = modelpar.gather_state_dict(model)
    released = modelpar.release_unowned(model)
    again = modelpar.gather_state_dict(model)
    after_training = None if rank != 0 else list(again) == list(trained) and all(
        torch.equal(again[n], trained[n]) for n in trained)
    _result(refused=refused, after_inference=after_inference, after_writes=after_writes,
            after_training=after_training, released=released,
            shard=sorted(modelpar.owned_state_dict(model)))


def main() -> None:
    backend = os.environ.get("MODELPAR_DIST_BACKEND", "gloo")
    if backend == "nccl":
        torch.cuda.set_device(int(os.environ.get("LOCAL_RANK", "0")))
    dist.init_process_group(backend, timeout=timedelta(seconds=60))
    scenario, *args = sys.argv[1:]
    try:
        if scenario == "train":
            train(args[0], int(args[1]), args[2] if len(args) > 2 else None,
                  args[3] if len(args) > 3 else None)
        elif scenario == "loop":
            loop(args[0], args[1])
        elif scenario == "memory":
            memory(args[0])
        elif scenario == "fault":
            fault(args[0], int(args[1]))
        elif scenario == "evaluate-elsewhere":
            evaluate_elsewhere()
        elif scenario == "generate":
            generate(args[0], args[1], len(args) > 2 and args[2] == "trained")
        elif scenario == "inputs":
            inputs(args[0])
        elif scenario == "mesh":
            mesh(int(args[0]), int(args[1]), args[2], args[3] if len(args) > 3 else None)
        elif scenario == "mismatch":
            mismatch()
        elif scenario == "first-rank":
            first_rank()
        elif scenario == "state":
            state()
        else:
            raise SystemExit(f"unknown scenario {scenario}")
    except BaseException:
        traceback.print_exc()
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(1)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
