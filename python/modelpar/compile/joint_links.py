"""How AOTAutograd's forward and backward graphs join (Note [Forward and
backward placed as one] in compile/backend.py): which backward inputs are
values the forward saved, which are the gradients of which forward outputs
(tangents), and which backward outputs are the gradients of which forward
inputs."""

from __future__ import annotations

from typing import Any

import torch
import torch.fx

from .fx_import import saved_rng_states

__all__ = ["link_joint_graphs"]


def link_joint_graphs(fw_module: torch.fx.GraphModule, bw_module: torch.fx.GraphModule,
                      fw: Any, bw: Any, num_fwd_outputs: int | None
                      ) -> tuple[list[tuple[str, str]], list[tuple[str, str]], list[tuple[int, int]]]:
    """``(saved, tangents, gradients)`` of an imported forward ``fw`` and
    backward ``bw`` (fx_import's results for ``fw_module`` / ``bw_module``):
    saved pairs (backward value, forward value), including the RNG states a
    recompute replays; tangent pairs (backward value, forward output value);
    gradient pairs (backward IR output, forward input index), empty when the
    backward does not return one gradient per forward input."""
    # A backward placeholder named like a forward node is the value the
    # forward saved for it; the rest are tangents.
    fw_nodes = {n.name for n in fw_module.graph.nodes if n.op != "output"}
    saved = [(bw.value_names[n.name], fw.value_names[n.name])
             for n in bw_module.graph.nodes
             if n.op == "placeholder" and n.name in fw_nodes
             and n.name in bw.value_names and n.name in fw.value_names]
    saved += saved_rng_states(fw_module, bw_module, fw.value_names, bw.value_names)
    # Tangents are the gradients of the forward's user outputs (the first
    # num_fwd_outputs), in order, skipping outputs that need none: pair
    # each with the next user output of its type.
    bw_ph = [n for n in bw_module.graph.nodes if n.op == "placeholder"]
    fw_out = next(n for n in fw_module.graph.nodes if n.op == "output").args[0]
    user_outs = [o for o in fw_out[:num_fwd_outputs or 0] if isinstance(o, torch.fx.Node)]
    tangents = []
    for t in (n for n in bw_ph if n.name.startswith("tangents_")):
        tval = t.meta.get("val")
        while user_outs:
            o = user_outs.pop(0)
            oval = o.meta.get("val")
            if (isinstance(tval, torch.Tensor) and isinstance(oval, torch.Tensor)
                    and tval.shape == oval.shape and tval.dtype == oval.dtype):
                if t.name in bw.value_names and o.name in fw.value_names:
                    tangents.append((bw.value_names[t.name], fw.value_names[o.name]))
                break
    # AOTAutograd's backward returns one gradient per forward input, in order.
    fw_inputs = [n for n in fw_module.graph.nodes if n.op == "placeholder"]
    gradients = []
    if len(bw.output_map) == len(fw_inputs):
        gradients = [(o, k) for k, o in enumerate(bw.output_map) if o >= 0]
    return saved, tangents, gradients
