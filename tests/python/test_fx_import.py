"""FX -> IR conversion pieces that the end-to-end tests do not reach:
names of layers and inputs, what is refused, and the text of constants."""

from __future__ import annotations

import math

import pytest
import torch
import torch.fx

import modelpar
from modelpar.compile.fx_import import (GraphKind, UnsupportedGraph, import_graph, layer_name,
                                        source_name)


@pytest.mark.parametrize("path, layer", [
    ("L['self'].blocks.0.attn.qkv", "blocks.0.attn.qkv"),
    ("L['self'].blocks[0]._modules['attn']", "blocks.0.attn"),
    ("L['self']", ""),
    ("L['model'].fc1", "fc1"),
    ("L__self___fc1", "fc1"),
])
def test_layer_names_are_module_paths(path: str, layer: str) -> None:
    assert layer_name(path) == layer


@pytest.mark.parametrize("source, name", [
    ("L['self']._modules['blocks']._modules['0']._parameters['weight']", "blocks.0.weight"),
    ("L['x']", "x"),
    ("L['args'][0]", "args.0"),
    ("L['self']._modules['bn']._buffers['running_mean']", "bn.running_mean"),
    ("something odd", None),
])
def test_input_names_come_from_dynamo_sources(source: str, name: str | None) -> None:
    assert source_name(source) == name


def my_opaque_helper(x: torch.Tensor) -> torch.Tensor:
    return x * 2


torch.fx.wrap("my_opaque_helper")


def test_an_opaque_python_callable_is_refused_by_name() -> None:
    gm = torch.fx.symbolic_trace(lambda x: my_opaque_helper(x) + 1)
    for node in gm.graph.nodes:
        node.meta["val"] = torch.empty(2)
    with pytest.raises(UnsupportedGraph, match="opaque Python callable .*my_opaque_helper"):
        import_graph(gm, GraphKind.INFERENCE, "g")


def test_constants_are_exact_and_lifted_tensors_become_inputs() -> None:
    class M(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.register_buffer("c", torch.tensor([1.0, 2.0]))

    values = [0.1, 1e-05, 1 / 3, 1e300, -0.0, math.inf]
    g = torch.fx.Graph()
    x = g.placeholder("x")
    c = g.get_attr("c")
    h = g.call_function(torch.ops.aten.add.Tensor, (x, c))
    outs = [g.call_function(torch.ops.aten.mul.Tensor, (h, v)) for v in values]
    g.output((*outs, None))
    gm = torch.fx.GraphModule(M(), g)
    for node in gm.graph.nodes:
        node.meta["val"] = torch.empty(2)
    imported = import_graph(gm, GraphKind.INFERENCE, "consts")
    assert "%c: f32[2] buffer" in imported.text
    assert imported.output_map == list(range(len(values))) + [-1]
    graph = modelpar.parse_graph(imported.text)
    cg = modelpar._C.CompiledGraph(graph, imported.output_map, imported.constants)
    xv = torch.randn(2)
    results = cg.run([xv])
    for v, r in zip(values, results):
        assert torch.equal(r, (xv + torch.tensor([1.0, 2.0])) * v)
    assert results[-1] is None
