"""Data parallelism over a mesh's ``dp`` dimension: each replica of the plan
(the ranks of one ``pp`` group) trains on its own batch, and the gradient of
every parameter a rank is home to is averaged over that rank's ``dp`` group
(Note [Gradients averaged over the replicas]) by :class:`GradientReducer`,
with c10d all-reduces in buckets, before the compiled step returns it."""

from __future__ import annotations

import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import torch

from .groups import outside_tracing, wait_for

__all__ = ["BUCKET_BYTES", "GradientReducer", "gradient_reducer", "trace_events"]

#: The Chrome-trace track (tid) of the all-reduces, beside the executor's
#: compute, send and recv tracks (0, 1, 2: runtime/execution_trace.cpp).
TRACE_TRACK = 3

#: Bytes of gradients per all-reduce (DDP's default bucket_cap_mb=25).
BUCKET_BYTES = 25 * 2**20


# Note [Gradients averaged over the replicas]: under a mesh, each data-parallel
# replica runs the same plan over its pp group (every replica checks it
# planned what the others did: RankExecutor), so rank (pp=s, dp=d) holds the
# gradients of the same parameters for every d: those it is home to
# (Note [One home per parameter] in homes.py). After the rank's executor has
# made them, their gradients are packed into buckets of at most BUCKET_BYTES
# (one dtype each, the last layers' first: the order the backward finishes
# them), and each bucket's all-reduce (a sum; Gloo has no average) is
# launched asynchronously as soon as it is packed, so it overlaps the packing
# of the next; then each is awaited, divided by the dp size and copied back
# into the gradient (its strides kept) before the compiled backward returns
# it, so autograd accumulates the average into .grad as DDP leaves it. Each
# stage's ranks reduce over their own dp group, independently of the other
# stages: under 1F1B the last stage finishes its backward first, and its
# all-reduce runs while the first stage is still in its cooldown.
# Not done yet: starting a bucket inside the executor's step as soon as its
# last micro-batch gradient is final (the executor has no callback for that;
# docs/distributed.md), and costing the all-reduce in the simulator.


@dataclass
class ReduceStats:
    """What the last step's all-reduces did (shown by ``modelpar.plans()``)."""
    tensors: int = 0
    bytes: int = 0
    buckets: int = 0
    steps: int = 0
    last_us: float = 0.0       # from the first launch to the last bucket copied back
    last_wait_us: float = 0.0  # of which blocked waiting for the all-reduces
    spans: list[tuple[int, int, int]] = field(default_factory=list)  # (bucket, start, end) ns


class GradientReducer:
    """Averages the gradient outputs ``outputs`` (graph output indices) of
    a rank's step over ``group`` (its dp group).

    Raises (from :meth:`reduce`):
        ExecutionError: an all-reduce did not complete within ``timeout_s``
            (a replica died or stopped calling the step).
    """

    def __init__(self, group: Any, outputs: Sequence[int], timeout_s: float, what: str,
                 bucket_bytes: int = BUCKET_BYTES) -> None:
        import torch.distributed as dist
        self.group = group
        self.outputs = sorted(set(outputs))
        self.timeout_s = timeout_s
        self.what = what
        self.bucket_bytes = bucket_bytes
        self.size = dist.get_world_size(group)
        self.stats = ReduceStats()

    def buckets(self, outs: Sequence[Any]) -> list[list[torch.Tensor]]:
        """The gradients of ``outs`` this rank holds, last output first, in
        buckets of one dtype and device and at most ``bucket_bytes`` each
        (a larger gradient is a bucket of its own)."""
        seen: set[int] = set()
        grads = []
        for o in reversed(self.outputs):
            g = outs[o] if o < len(outs) else None
            if isinstance(g, torch.Tensor) and g.numel() > 0 and id(g) not in seen:
                seen.add(id(g))
                grads.append(g)
        out: list[list[torch.Tensor]] = []
        size = 0
        for g in grads:
            nbytes = g.numel() * g.element_size()
            last = out[-1] if out else None
            if (last is None or last[0].dtype != g.dtype or last[0].device != g.device
                    or size + nbytes > self.bucket_bytes):
                out.append([g])
                size = nbytes
            else:
                last.append(g)
                size += nbytes
        return out

    def reduce(self, outs: Sequence[Any]) -> None:
        """Averages this rank's gradients in ``outs`` over the group, in place."""
        if self.size == 1 or not self.outputs:
            return
        with outside_tracing():  # Note [Collectives outside the tracer's dispatch]
            self._reduce(outs)

    def _reduce(self, outs: Sequence[Any]) -> None:
        import torch.distributed as dist
        start = time.perf_counter_ns()
        pending = []
        for k, bucket in enumerate(self.buckets(outs)):
            flat = torch.cat([g.detach().reshape(-1) for g in bucket])
            launched = time.perf_counter_ns()
            work = dist.all_reduce(flat, op=dist.ReduceOp.SUM, group=self.group, async_op=True)
            pending.append((k, bucket, flat, work, launched))
        waited = 0
        spans = []
        nbytes = 0
        for k, bucket, flat, work, launched in pending:
            t0 = time.perf_counter_ns()
            wait_for(work, self.timeout_s,
                     f"the data-parallel all-reduce of {self.what} (bucket {k} of "
                     f"{len(pending)}, {flat.numel() * flat.element_size()} bytes)")
            waited += time.perf_counter_ns() - t0
            flat.div_(self.size)
            offset = 0
            with torch.no_grad():
                for g in bucket:
                    n = g.numel()
                    g.copy_(flat[offset:offset + n].view(g.shape))
                    offset += n
            nbytes += flat.numel() * flat.element_size()
            spans.append((k, launched, time.perf_counter_ns()))
        s = self.stats
        s.tensors = sum(len(b) for _, b, *_ in pending)
        s.bytes, s.buckets, s.spans = nbytes, len(pending), spans
        s.steps += 1
        s.last_us = (time.perf_counter_ns() - start) / 1e3
        s.last_wait_us = waited / 1e3

    def summary(self) -> str:
        s = self.stats
        head = (f"gradients averaged over a dp group of {self.size} ranks (c10d all-reduce, "
                f"buckets of <= {self.bucket_bytes / 2**20:g} MiB)")
        if not s.steps:
            return head + "; not run yet"
        return (f"{head}; last step: {s.tensors} gradients, {s.bytes} bytes in {s.buckets} "
                f"bucket{'s' if s.buckets != 1 else ''}, {s.last_us:.1f} us "
                f"({s.last_wait_us:.1f} us waiting)")


def gradient_reducer(opts: Any, record: Any, outputs: Sequence[int],
                     what: str) -> GradientReducer | None:
    """The reducer of a step whose graph outputs ``outputs`` are parameter
    gradients, under a mesh with a dp dimension (``opts.dp_group``); None
    otherwise. It is shown in ``record``'s summary (``plans()``)."""
    import torch.distributed as dist
    if getattr(opts, "dp_group", None) is None or not outputs \
            or dist.get_world_size(opts.dp_group) == 1:
        return None
    reducer = GradientReducer(opts.dp_group, outputs, opts.peer_timeout, what)
    if record is not None:
        record.data_parallel = reducer
    return reducer


def trace_events(chrome_trace: str, spans: Sequence[tuple[int, int, int]], start_ns: int) -> str:
    """``chrome_trace`` (a rank executor's last step) with each bucket's
    all-reduce, from its launch to its average copied back, as spans on a
    "dp all-reduce" track of the rank's process; ``spans`` are
    (bucket, start, end) in perf_counter ns, ``start_ns`` the step's start on
    that clock (taken just before the executor's own, microseconds apart)."""
    import json
    trace = json.loads(chrome_trace)
    events = trace["traceEvents"]
    pids = sorted({e["pid"] for e in events if e.get("ph") == "X"})
    if not pids:
        return chrome_trace
    pid = pids[0]
    events.append({"name": "thread_name", "ph": "M", "pid": pid, "tid": TRACE_TRACK,
                   "args": {"name": "dp all-reduce"}})
    for bucket, begin, end in spans:
        events.append({"name": f"all-reduce bucket {bucket}", "cat": "dp-all-reduce", "ph": "X",
                       "pid": pid, "tid": TRACE_TRACK, "ts": (begin - start_ns) / 1e3,
                       "dur": (end - begin) / 1e3, "args": {"bucket": bucket}})
    return json.dumps(trace)
