"""A picture of one step of a multi-device plan: the simulated step above,
the measured one below, one lane per device, each operator coloured by its
phase (forward, backward, recompute, optimizer update) and each transfer
drawn under its sender's lane.

It reads the two Chrome traces the ``trace`` option writes
(compile/step_trace.py): ``step.json`` (measured: per device a compute
track, ``args.node`` naming the operator's node) and
``step.simulated.json`` (``args.phase`` per operator). The measured trace
has no phase; a node's phase is the simulated trace's for the same node
(both traces are of the same Program). Node names of a pipeline end in
``.mb<i>``, the micro-batch; runs of operators of one phase and micro-batch
with no gap between them are drawn as one block labelled with the micro-batch,
so the schedule (1F1B: forwards and backwards interleaved) shows at a glance.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any

__all__ = ["Block", "timeline_blocks", "plot_timeline"]

COLOURS = {"fwd": "#4C72B0", "bwd": "#DD8452", "recompute": "#8172B3", "update": "#937860",
           "transfer": "#55A868"}
LABELS = {"fwd": "forward", "bwd": "backward", "recompute": "recompute", "update": "update",
          "transfer": "transfer (send)"}
_MICROBATCH = re.compile(r"\.mb(\d+)$")


@dataclass
class Block:
    """A span of one device's timeline: operators of one phase and
    micro-batch back to back, or one transfer."""
    device: int
    kind: str  # a phase (fwd, bwd, recompute, update) or "transfer"
    microbatch: int | None
    start_us: float
    end_us: float


def _events(path: Path) -> list[dict[str, Any]]:
    return [e for e in json.loads(path.read_text(encoding="utf-8"))["traceEvents"]
            if e.get("ph") == "X"]


def timeline_blocks(events: list[dict[str, Any]], phase_of: dict[str, str],
                    gap_us: float) -> list[Block]:
    """The blocks of a trace's events: compute (``cat`` "run") merged per
    device while phase and micro-batch stay the same and the gap to the
    previous operator is at most ``gap_us``; sends one block each. An
    operator's phase is ``args.phase``, else ``phase_of[args.node]``, else
    forward; its micro-batch is its node's ``.mb<i>`` suffix."""
    blocks: list[Block] = []
    open_block: dict[int, Block] = {}
    for e in sorted(events, key=lambda e: e["ts"]):
        device, start, end = int(e["pid"]), float(e["ts"]), float(e["ts"]) + float(e.get("dur", 0))
        args = e.get("args", {})
        if e.get("cat") == "send":
            blocks.append(Block(device, "transfer", None, start, end))
            continue
        if e.get("cat") != "run":
            continue
        node = str(args.get("node", ""))
        phase = args.get("phase") or phase_of.get(node, "fwd")
        m = _MICROBATCH.search(node)
        mb = int(m.group(1)) if m else None
        b = open_block.get(device)
        # An operator of no micro-batch (a parameter's transpose, shared by
        # all) joins the block it follows, and a block of none so far takes
        # the micro-batch of the first operator that has one.
        if (b is not None and b.kind == phase and start - b.end_us <= gap_us
                and (mb is None or b.microbatch is None or b.microbatch == mb)):
            b.end_us = max(b.end_us, end)
            if b.microbatch is None:
                b.microbatch = mb
            continue
        b = Block(device, phase, mb, start, end)
        open_block[device] = b
        blocks.append(b)
    return blocks


def plot_timeline(measured: str | Path, simulated: str | Path, png: str | Path,
                  title: str) -> Path:
    """Draws the simulated (top) and measured (bottom) step of the traces
    ``simulated`` and ``measured`` into ``png``, each on its own time axis
    (the simulator's clock is the machine profile's, the measured one the
    wall clock), and returns the path.

    Raises:
        ImportError: matplotlib is not installed (``pip install matplotlib``).
    """
    # matplotlib is the demo's alone: imported here so that the package
    # imports without it, and without pyplot (Figure and its Agg canvas), so
    # that no GUI backend is touched.
    from matplotlib.figure import Figure
    from matplotlib.patches import Patch

    sim_events, meas_events = _events(Path(simulated)), _events(Path(measured))
    phase_of = {str(e["args"]["node"]): str(e["args"]["phase"]) for e in sim_events
                if "node" in e.get("args", {}) and "phase" in e.get("args", {})}
    devices = sorted({int(e["pid"]) for e in sim_events + meas_events})
    fig = Figure(figsize=(13, 2.2 + 0.75 * 2 * len(devices)), layout="constrained")
    axes = fig.subplots(2, 1)
    for ax, events, what in ((axes[0], sim_events, "simulated"), (axes[1], meas_events, "measured")):
        t0 = min(e["ts"] for e in events)
        span = max(e["ts"] + e.get("dur", 0) for e in events) - t0
        blocks = timeline_blocks(events, phase_of, gap_us=0.004 * span)
        for b in blocks:
            lane = devices.index(b.device)
            x, w = (b.start_us - t0) / 1e3, (b.end_us - b.start_us) / 1e3
            if b.kind == "transfer":  # a thin bar under the sender's operators
                ax.broken_barh([(x, max(w, span / 4e5))], (lane + 0.3, 0.12),
                               facecolors=COLOURS["transfer"])
                continue
            ax.broken_barh([(x, w)], (lane - 0.3, 0.6), facecolors=COLOURS.get(b.kind, "#999999"),
                           edgecolors="white", linewidth=0.3)
            if b.microbatch is not None and w > span / 1e3 / 60:
                ax.text(x + w / 2, lane, str(b.microbatch), ha="center", va="center",
                        fontsize=7, color="white")
        ax.set_yticks(range(len(devices)), [f"device {d}" for d in devices])
        ax.set_ylim(len(devices) - 0.5, -0.6)
        ax.set_xlim(0, span / 1e3 * 1.01)
        ax.set_xlabel("ms")
        ax.set_title(f"{what}: {span / 1e3:.2f} ms", loc="left", fontsize=10)
        ax.grid(axis="x", alpha=0.3)
    fig.suptitle(title, fontsize=11)
    fig.legend(handles=[Patch(color=COLOURS[k], label=LABELS[k]) for k in COLOURS],
               loc="outside lower center", ncols=len(COLOURS), fontsize=9, frameon=False)
    out = Path(png)
    out.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(out, dpi=110)
    return out
