"""Pass `fuse-accumulation` (passes/pipeline/fuse_accumulation.h) computes
what the graph it rewrites computes: both graphs run on the interpreter on the
same random inputs and give the same sum, for a product seen through an even
chain of transposes (a Linear's weight gradient), an odd one (the operands
swap and transpose), and a product that is the add's first operand.

Tolerance: the fused sum is acc + a @ b rounded once inside BLAS (beta = 1)
where the graph rounded the product and then the sum; with entries of
N(0, 1), K = 16 and sums of magnitude ~10, the two differ by a few ulps of
10 (~1e-6), far under 1e-5.
"""

from __future__ import annotations

import pytest
import torch

import modelpar
from modelpar import _C

EVEN = """graph @even(%acc: f32[6, 5] input, %dy: f32[16, 6] input, %x: f32[16, 5] input) {
  %dyt: f32[6, 16] = aten::t(%dy) {layer="fc", phase=bwd, mb=1}
  %m: f32[6, 5] = aten::mm(%dyt, %x) {layer="fc", phase=bwd, mb=1}
  %t1: f32[5, 6] = aten::t(%m) {layer="fc", phase=bwd, mb=1}
  %t2: f32[6, 5] = aten::t(%t1) {layer="fc", phase=bwd, mb=1}
  %s: f32[6, 5] = aten::add.Tensor(%acc, %t2) {layer="fc", phase=bwd, mb=1}
  return %s
}
"""

ODD = """graph @odd(%acc: f32[6, 5] input, %p: f32[5, 16] input, %q: f32[16, 6] input) {
  %m: f32[5, 6] = aten::mm(%p, %q) {layer="fc", phase=bwd, mb=2}
  %mt: f32[6, 5] = aten::t(%m) {layer="fc", phase=bwd, mb=2}
  %s: f32[6, 5] = aten::add.Tensor(%mt, %acc) {layer="fc", phase=bwd, mb=2}
  return %s
}
"""


@pytest.mark.parametrize("text,shapes,expected", [
    (EVEN, [(6, 5), (16, 6), (16, 5)], lambda acc, dy, x: acc + dy.t() @ x),
    (ODD, [(6, 5), (5, 16), (16, 6)], lambda acc, p, q: (p @ q).t() + acc),
], ids=["even-transposes", "odd-transposes-first-operand"])
def test_the_fused_sum_equals_the_graphs(text, shapes, expected) -> None:
    fused_text = _C.run_passes(text, ["fuse-accumulation"])
    assert "aten::addmm" in fused_text and "aten::mm(" not in fused_text, fused_text
    g = torch.Generator().manual_seed(0)
    inputs = [torch.randn(*s, generator=g) for s in shapes]
    before = modelpar.run_graph(modelpar.parse_graph(text), inputs)[0]
    after = modelpar.run_graph(modelpar.parse_graph(fused_text), inputs)[0]
    torch.testing.assert_close(after, expected(*inputs), rtol=0, atol=1e-5)
    torch.testing.assert_close(after, before, rtol=0, atol=1e-5)
