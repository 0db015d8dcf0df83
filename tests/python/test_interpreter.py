"""modelpar.run_graph / run_program against eager PyTorch, the Graph/Program
objects, and the mapping of C++ errors to modelpar's Python exceptions."""

from __future__ import annotations

import threading

import pytest
import torch

import modelpar
from tolerances import Reordered

# The interpreter calls the same ATen kernels as the references, on the calling thread;
# where a reference goes through another entry point (F.batch_norm vs native_batch_norm,
# addmm vs mm + add) a sum may be added up in another order. The longest sum in these
# graphs is 100 (batch norm over 4 x 5 x 5), one reduction deep (tests/python/tolerances.py).
TOL = Reordered(100)


@pytest.fixture(autouse=True)
def _seed() -> None:
    torch.manual_seed(0)


def run(text: str, *inputs):
    return modelpar.run_graph(modelpar.parse_graph(text), list(inputs))


# ---- results equal eager ----------------------------------------------------------


def test_mm_and_addmm_equal_eager():
    x, w, b = torch.randn(4, 8), torch.randn(8, 3), torch.randn(3)
    y, z = run(
        """
        graph @lin(%x: f32[4, 8] input, %w: f32[8, 3] param, %b: f32[3] param) {
          %y: f32[4, 3] = aten::mm(%x, %w)
          %z: f32[4, 3] = aten::addmm(%b, %x, %w, beta=0.5, alpha=2)
          return %y, %z
        }""",
        x, w, b)
    TOL.assert_close(y, x @ w)
    TOL.assert_close(z, torch.addmm(b, x, w, beta=0.5, alpha=2))


def test_convolution_and_conv2d_with_single_int_lists_equal_eager():
    x, w, b = torch.randn(2, 3, 8, 8), torch.randn(4, 3, 3, 3), torch.randn(4)
    c1, c2 = run(
        """
        graph @conv(%x: f32[2, 3, 8, 8] input, %w: f32[4, 3, 3, 3] param, %b: f32[4] param) {
          %c1: f32[2, 4, 4, 4] = aten::convolution(%x, %w, %b, [2, 2], [1, 1], [1, 1], false, [0, 0], 1)
          %c2: f32[2, 4, 8, 8] = aten::conv2d(%x, %w, %b, 1, 1)
          return %c1, %c2
        }""",
        x, w, b)
    TOL.assert_close(c1, torch.nn.functional.conv2d(x, w, b, stride=2, padding=1))
    TOL.assert_close(c2, torch.nn.functional.conv2d(x, w, b, padding=1))


def test_native_batch_norm_training_updates_running_stats_like_eager():
    x, w, b = torch.randn(4, 3, 5, 5), torch.randn(3), torch.randn(3)
    rm, rv = torch.randn(3), torch.rand(3) + 0.5
    rm_eager, rv_eager = rm.clone(), rv.clone()
    out, mean, invstd = run(
        """
        graph @bn(%x: f32[4, 3, 5, 5] input, %w: f32[3] param, %b: f32[3] param,
                  %rm: f32[3] buffer, %rv: f32[3] buffer) {
          %y: f32[4, 3, 5, 5], %m: f32[3], %s: f32[3] = aten::native_batch_norm(%x, %w, %b, %rm, %rv, true, 0.1, 1e-05)
          return %y, %m, %s
        }""",
        x, w, b, rm, rv)
    expected = torch.ops.aten.native_batch_norm(x, w, b, rm_eager, rv_eager, True, 0.1, 1e-5)
    for got, want in zip((out, mean, invstd), expected):
        TOL.assert_close(got, want)
    torch.testing.assert_close(out, torch.nn.functional.batch_norm(
        x, rm.clone(), rv.clone(), w, b, training=True, momentum=0.1, eps=1e-5),
        **TOL.tolerance(out))
    TOL.assert_close(rm, rm_eager)  # buffers were updated in place
    TOL.assert_close(rv, rv_eager)


def test_functional_batch_norm_returns_new_running_stats():
    x, w, b = torch.randn(4, 3, 2, 2), torch.randn(3), torch.randn(3)
    rm, rv = torch.zeros(3), torch.ones(3)
    got = run(
        """
        graph @bn(%x: f32[4, 3, 2, 2] input, %w: f32[3] param, %b: f32[3] param,
                  %rm: f32[3] buffer, %rv: f32[3] buffer) {
          %y: f32[4, 3, 2, 2], %m: f32[3], %s: f32[3], %nrm: f32[3], %nrv: f32[3] = aten::_native_batch_norm_legit_functional(%x, %w, %b, %rm, %rv, true, 0.1, 1e-05)
          return %y, %nrm, %nrv
        }""",
        x, w, b, rm, rv)
    want = torch.ops.aten._native_batch_norm_legit_functional(x, w, b, rm, rv, True, 0.1, 1e-5)
    TOL.assert_close(got[0], want[0])
    TOL.assert_close(got[1], want[3])
    TOL.assert_close(got[2], want[4])
    torch.testing.assert_close(rm, torch.zeros(3))  # functional: inputs untouched


def test_embedding_layer_norm_gelu_softmax_block_equals_eager():
    ids = torch.randint(0, 10, (2, 5))
    emb, g, b = torch.randn(10, 8), torch.randn(8), torch.randn(8)
    w = torch.randn(8, 8)
    y, mean, rstd, p = run(
        """
        graph @block(%ids: i64[B, 5] input, %emb: f32[10, 8] param, %g: f32[8] param,
                     %b: f32[8] param, %w: f32[8, 8] param) {
          %e: f32[B, 5, 8] = aten::embedding(%emb, %ids)
          %n: f32[B, 5, 8], %mean: f32[B, 5, 1], %rstd: f32[B, 5, 1] = aten::native_layer_norm(%e, [8], %g, %b, 1e-05)
          %flat: f32[10, 8] = aten::reshape(%n, [10, 8])
          %h: f32[10, 8] = aten::mm(%flat, %w)
          %a: f32[10, 8] = aten::gelu(%h, approximate="tanh")
          %v: f32[B, 5, 8] = aten::view(%a, [2, 5, 8])
          %p: f32[B, 5, 8] = aten::_softmax(%v, -1, false)
          return %n, %mean, %rstd, %p
        }""",
        ids, emb, g, b, w)
    e = torch.nn.functional.embedding(ids, emb)
    n_want, mean_want, rstd_want = torch.ops.aten.native_layer_norm(e, [8], g, b, 1e-5)
    TOL.assert_close(y, torch.nn.functional.layer_norm(e, [8], g, b, 1e-5))
    TOL.assert_close(mean, mean_want)
    TOL.assert_close(rstd, rstd_want)
    a = torch.nn.functional.gelu(n_want.reshape(10, 8) @ w, approximate="tanh")
    TOL.assert_close(p, torch.softmax(a.view(2, 5, 8), dim=-1))


def test_cat_permute_t_and_views_equal_eager():
    x, z = torch.randn(2, 3, 4), torch.randn(2, 3, 2)
    c, pm, tt = run(
        """
        graph @shapes(%x: f32[2, 3, 4] input, %z: f32[2, 3, 2] input) {
          %c: f32[2, 3, 6] = aten::cat([%x, %z], -1)
          %pm: f32[6, 2, 3] = aten::permute(%c, [2, 0, 1])
          %r: f32[6, 6] = aten::reshape(%pm, [6, 6])
          %tt: f32[6, 6] = aten::t(%r)
          return %c, %pm, %tt
        }""",
        x, z)
    c_want = torch.cat([x, z], -1)
    TOL.assert_close(c, c_want)
    TOL.assert_close(pm, c_want.permute(2, 0, 1))
    TOL.assert_close(tt, c_want.permute(2, 0, 1).reshape(6, 6).t())


def test_in_place_ops_mutate_and_alias_like_eager():
    x, b = torch.randn(3, 4), torch.randn(3, 4)
    x_eager = x.clone()
    expected = torch.relu_(x_eager.add_(b))
    out, = run(
        """
        graph @inplace(%x: f32[3, 4] input, %b: f32[3, 4] input) {
          %s: f32[3, 4] = aten::add_.Tensor(%x, %b)
          %r: f32[3, 4] = aten::relu_(%s)
          return %r
        }""",
        x, b)
    TOL.assert_close(out, expected)
    TOL.assert_close(x, expected)  # the input itself was mutated
    assert out.data_ptr() == x.data_ptr()


def test_scalar_inputs_and_results_cross_into_python():
    x = torch.randn(5)
    y, n = run(
        """
        graph @s(%x: f32[N] input, %k: float input, %flag: bool input) {
          %y: f32[N] = aten::mul.Scalar(%x, %k)
          %n: int = aten::sym_size.int(%x, 0)
          return %y, %n
        }""",
        x, 3, True)
    TOL.assert_close(y, x * 3)
    assert n == 5 and isinstance(n, int)


def test_runs_concurrently_from_threads():
    g = modelpar.parse_graph("""
        graph @lin(%x: f32[64, 64] input) {
          %y: f32[64, 64] = aten::mm(%x, %x)
          return %y
        }""")
    xs = [torch.randn(64, 64) for _ in range(4)]
    results: list = [None] * 4

    def work(i: int) -> None:
        results[i] = modelpar.run_graph(g, [xs[i]])[0]

    threads = [threading.Thread(target=work, args=(i,)) for i in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    for x, y in zip(xs, results):
        TOL.assert_close(y, x @ x)


# ---- programs -----------------------------------------------------------------------

TWO_DEVICES = """
program devices=2
graph @step(%x: f32[4, 8] input {device=0}, %w: f32[8, 3] param {device=1}) {
  %h: f32[4, 8] = aten::relu(%x) {device=0}
  %y: f32[4, 3] = aten::mm(%h, %w) {device=1}
  return %y
}
device 0 {
  run %h
  send %h -> 1
}
device 1 {
  recv %h <- 0
  run %y
}
"""


def test_two_device_program_equals_eager():
    program = modelpar.parse_program(TWO_DEVICES)
    x, w = torch.randn(4, 8), torch.randn(8, 3)
    y, = modelpar.run_program(program, [x, w])
    TOL.assert_close(y, torch.relu(x) @ w)


def test_failing_op_in_program_names_device_and_instruction():
    program = modelpar.parse_program(TWO_DEVICES.replace("%w: f32[8, 3]", "%w: f32[5, 3]"))
    with pytest.raises(modelpar.ExecutionError, match=r"^device 1, instruction 1 \(run %y, aten::mm\): "):
        modelpar.run_program(program, [torch.randn(4, 8), torch.randn(5, 3)])


def test_deadlocked_program_is_rejected_before_running():
    text = TWO_DEVICES.replace("device 1 {\n  recv %h <- 0", "device 1 {\n  recv %h <- 0\n  recv %y <- 0")
    program = modelpar.parse_program(text)
    with pytest.raises(modelpar.InvalidIrError):
        modelpar.run_program(program, [torch.randn(4, 8), torch.randn(8, 3)])


def test_program_object_properties_and_round_trip():
    program = modelpar.parse_program(TWO_DEVICES)
    assert program.num_devices == 2
    assert program.graph.name == "step"
    assert modelpar.parse_program(str(program)) == program
    assert "digraph" in program.to_dot()
    program.verify()


# ---- Graph objects --------------------------------------------------------------------

LIN = """graph @lin(%x: f32[4, 8] input, %w: f32[8, 3] param) {
  %y: f32[4, 3] = aten::mm(%x, %w)
  return %y
}
"""


def test_graph_properties_print_and_equality(tmp_path):
    g = modelpar.parse_graph(LIN)
    assert (g.name, g.num_nodes, g.num_values) == ("lin", 1, 3)
    assert g.input_names == ["x", "w"]
    assert g.output_names == ["y"]
    assert str(g) == LIN
    assert modelpar.parse_graph(str(g)) == g
    assert g != modelpar.parse_graph(LIN.replace("@lin", "@other"))
    assert g != "not a graph"
    assert "digraph" in g.to_dot()
    g.verify()
    path = tmp_path / "lin.txt"
    path.write_text(LIN)
    assert modelpar.ir.load_graph(path) == g


# ---- errors map to Python classes -------------------------------------------------------


def test_parse_error_carries_line_and_column():
    with pytest.raises(modelpar.ParseError) as info:
        modelpar.parse_graph("graph @g(%x: f32[4] input) {\n  %y: f32[4] = aten::relu(%x\n  return %y\n}")
    err = info.value
    assert err.line == 3 and err.column > 0
    assert f"{err.line}:{err.column}: expected ')'" in str(err)
    assert isinstance(err, modelpar.InvalidIrError)
    assert isinstance(err, ValueError) and isinstance(err, modelpar.Error)
    assert isinstance(err, RuntimeError)


def test_unknown_operator_raises_unsupported_op_error():
    g = modelpar.parse_graph(LIN.replace("aten::mm", "aten::matmul_but_wrong"))
    with pytest.raises(modelpar.UnsupportedOpError, match="node %y: unknown operator aten::matmul_but_wrong"):
        modelpar.run_graph(g, [torch.randn(4, 8), torch.randn(8, 3)])


def test_argument_of_wrong_type_raises_invalid_ir_error():
    # (A number where a Tensor is due is fine: it becomes a wrapped-number
    # tensor, as in PyTorch's Python API.)
    g = modelpar.parse_graph(LIN.replace("aten::mm(%x, %w)", 'aten::mm(%x, "three")'))
    with pytest.raises(modelpar.InvalidIrError, match="argument 'mat2' expects Tensor, got \"three\""):
        modelpar.run_graph(g, [torch.randn(4, 8), torch.randn(8, 3)])


def test_unknown_keyword_raises_invalid_ir_error_listing_names():
    g = modelpar.parse_graph(LIN.replace("aten::mm(%x, %w)", "aten::mm(%x, %w, beta=1)"))
    with pytest.raises(modelpar.InvalidIrError, match="unknown keyword argument 'beta'; valid names: self, mat2"):
        modelpar.run_graph(g, [torch.randn(4, 8), torch.randn(8, 3)])


def test_wrong_input_shape_raises_execution_error():
    g = modelpar.parse_graph(LIN)
    with pytest.raises(modelpar.ExecutionError, match=r"input 1 \(%w\): expected f32\[8, 3\], got f32\[8, 4\]"):
        modelpar.run_graph(g, [torch.randn(4, 8), torch.randn(8, 4)])


def test_output_type_mismatch_raises_execution_error():
    g = modelpar.parse_graph(LIN.replace("%y: f32[4, 3]", "%y: f32[4, 7]"))
    with pytest.raises(modelpar.ExecutionError, match="output 0 .* is f32\\[4, 3\\] at run time but the IR says f32\\[4, 7\\]"):
        modelpar.run_graph(g, [torch.randn(4, 8), torch.randn(8, 3)])


def test_failing_operator_raises_execution_error_naming_node():
    g = modelpar.parse_graph(LIN.replace("%w: f32[8, 3]", "%w: f32[5, 3]"))
    with pytest.raises(modelpar.ExecutionError, match=r"node %y \(aten::mm\): .*cannot be multiplied"):
        modelpar.run_graph(g, [torch.randn(4, 8), torch.randn(5, 3)])


def test_non_tensor_input_raises_type_error():
    g = modelpar.parse_graph(LIN)
    with pytest.raises(TypeError, match="input 1: expected a torch.Tensor, int, float or bool, got str"):
        modelpar.run_graph(g, [torch.randn(4, 8), "w"])


# ---- ints outside int64 and size arithmetic (Note [Checked size arithmetic]) -------

SIZE = """
graph @size(%a: int input, %b: int input) {
  %q: int = modelpar::sym_floordiv(%a, %b)
  return %q
}
"""


@pytest.mark.parametrize("big, side", [(2**63, "above"), (2**200, "above"), (-(2**63) - 1, "below")])
def test_int_argument_outside_int64_raises_execution_error_and_leaves_no_python_error(big, side):
    g = modelpar.parse_graph(SIZE)
    with pytest.raises(modelpar.ExecutionError, match=f"input 0: the int is {side} the int64 range"):
        modelpar.run_graph(g, [big, 1])
    # Nothing was left set: the next call through the same binding works.
    assert modelpar.run_graph(g, [7, 2]) == [3]


@pytest.mark.parametrize("big, side", [(2**63, "above"), (-(2**70), "below")])
def test_compiled_graph_int_argument_outside_int64_raises_execution_error(big, side):
    cg = modelpar._C.CompiledGraph(modelpar.parse_graph(SIZE), [0], [])
    args = [9, big]
    with pytest.raises(modelpar.ExecutionError, match=f"graph @size argument 1: the int is {side} the int64 range"):
        cg(args)
    assert args == [9, big], "arguments are stolen only once they have all converted"
    assert cg.run([7, 2]) == [3]
    assert int("12") == 12  # a pending OverflowError would surface on the next C call


def test_int64_min_floordiv_minus_one_raises_execution_error():
    with pytest.raises(modelpar.ExecutionError, match=r"node %q \(modelpar::sym_floordiv\): .*-9223372036854775808 // -1 does not fit in int64"):
        modelpar.run_graph(modelpar.parse_graph(SIZE), [-(2**63), -1])


def test_floordiv_by_zero_raises_execution_error():
    with pytest.raises(modelpar.ExecutionError, match=r"integer division by zero \(5 // 0\)"):
        modelpar.run_graph(modelpar.parse_graph(SIZE), [5, 0])


def test_nan_converted_to_int_raises_execution_error():
    g = modelpar.parse_graph("""
graph @f(%x: float input) {
  %i: int = modelpar::sym_int(%x)
  return %i
}
""")
    with pytest.raises(modelpar.ExecutionError, match="sym_int: cannot convert float nan to integer"):
        modelpar.run_graph(g, [float("nan")])
    with pytest.raises(modelpar.ExecutionError, match="sym_int: cannot convert float inf to integer"):
        modelpar.run_graph(g, [float("inf")])


def test_none_for_a_tensor_argument_is_an_undefined_tensor() -> None:
    """AOTAutograd's backward of efficient attention passes attn_bias=None to
    a `Tensor` argument, as the dispatcher allows (seen on the first GPU
    run): the IR resolves; on the CPU the op itself has no kernel."""
    g = modelpar.parse_graph("""graph @g(%go: f32[1, 2, 4, 8] input, %q: f32[1, 2, 4, 8] input, %k: f32[1, 2, 4, 8] input, %v: f32[1, 2, 4, 8] input, %o: f32[1, 2, 4, 8] input, %lse: f32[1, 2, 32] input, %s: i64[] input, %off: i64[] input) {
  %dq: f32[1, 2, 4, 8], %dk: f32[1, 2, 4, 8], %dv: f32[1, 2, 4, 8], %db: f32[0] = aten::_scaled_dot_product_efficient_attention_backward(%go, %q, %k, %v, None, %o, %lse, %s, %off, 0.0, [true, true, true, false])
  return %dq, %dk, %dv
}""")
    inputs = [torch.randn(1, 2, 4, 8)] * 5 + [torch.randn(1, 2, 32), torch.tensor(0), torch.tensor(0)]
    with pytest.raises(modelpar.ExecutionError, match="from the 'CPU' backend"):
        modelpar.run_graph(g, inputs)
