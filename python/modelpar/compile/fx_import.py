"""FX → IR: turn one ATen-level FX graph from AOTAutograd (a forward,
backward or inference graph) into the text of an ``ir::Graph``
(ir/README.md), which ``parse_graph`` reads back.

What maps to what:

| FX | IR |
|----|----|
| placeholder (tensor / SymInt / float / bool) | graph input ``%name: f32[B, 16] param`` / ``%s0: int input``; role from AOT's input descriptors |
| ``get_attr`` of a tensor (a constant AOT lifted) | an extra trailing input, role ``buffer``, bound by the caller on every run |
| ``call_function`` of an ``OpOverload`` | a node calling ``schema.name`` + ``overload_name`` (``aten::add.Tensor``) |
| ``operator.getitem`` of a multi-output op | one of that node's outputs (no node of its own) |
| Python int arithmetic on sizes (``operator.mul``, ``torch.sym_max``, ...) | ``modelpar::sym_*`` nodes (runtime/sym_ops.h); ``torch.sym_sum`` a chain of ``sym_add`` |
| ``meta["val"]`` | the value's dtype and shape; a symbolic size ``s0`` is a named dim, a size expression ``4*s0`` the dim ``e_4xs0`` |
| ``nn_module_stack`` (forward), ``fwd_nn_module_stack`` / ``seq_nr`` (backward) | ``layer="blocks.0.attn"`` |
| output | the graph's returns; ``None`` outputs are recorded in ``output_map`` (-1) |

Anything else (a higher-order op, an opaque Python callable, a dtype or
argument the IR cannot express) raises ``UnsupportedGraph`` naming it; the
backend then runs that graph eagerly or, with ``strict``, fails.

Note [Layers of backward nodes]: in torch 2.13 a node of AOTAutograd's
backward graph has no ``nn_module_stack`` and no ``from_node``; the joint-graph
tracer copies the forward node's stack onto it as ``fwd_nn_module_stack``
(with ``fwd_source_fn_stack``) and gives both the same ``seq_nr``. The layer of
a backward node is therefore read from ``fwd_nn_module_stack``, or, where
that is missing, looked up by ``seq_nr`` in the forward graph's
``seq_nr -> layer`` map (``ImportedGraph.layer_of_seq``). Forward ops that the
min-cut partitioner recomputes in the backward keep ``partitioner_tag ==
"is_forward"`` and their own ``nn_module_stack``: phase ``recompute``.
"""

from __future__ import annotations

import enum
import functools
import math
import operator
import re
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import torch
import torch.fx

from ..ir.torch_names import DTYPE_NAMES, LAYOUT_NAMES, MEMORY_FORMAT_NAMES

__all__ = ["GraphKind", "InputRole", "ImportedGraph", "UnsupportedGraph", "import_graph",
           "layer_name", "source_name"]


class GraphKind(enum.Enum):
    FORWARD = "forward"
    BACKWARD = "backward"
    INFERENCE = "inference"


class InputRole(enum.Enum):
    INPUT = "input"
    PARAM = "param"
    BUFFER = "buffer"


class UnsupportedGraph(Exception):
    """The FX graph holds something the IR or the runtime cannot express.
    ``what`` names it (``higher_order.cond``, ``opaque Python callable foo``)."""

    def __init__(self, what: str, detail: str = "") -> None:
        super().__init__(f"{what}: {detail}" if detail else what)
        self.what = what


@dataclass
class ImportedGraph:
    """The IR text of one FX graph and what running it needs besides."""
    name: str
    kind: GraphKind
    text: str
    #: For each FX output, the index of the graph output returning it, or -1 for None.
    output_map: list[int]
    #: Values of the trailing constant inputs (lifted tensor attributes).
    constants: list[torch.Tensor]
    #: seq_nr -> layer of this graph's nodes (a forward graph hands it to its backward).
    layer_of_seq: dict[int, str] = field(default_factory=dict)
    #: FX node name -> the IR value it became (placeholders and single-value nodes).
    value_names: dict[str, str] = field(default_factory=dict)


# ---- types ---------------------------------------------------------------------

# Python operators on sizes -> modelpar::sym_* (runtime/sym_ops.h).
_SYM_OPS: dict[Callable[..., Any], str] = {
    operator.add: "sym_add", operator.sub: "sym_sub", operator.mul: "sym_mul",
    operator.floordiv: "sym_floordiv", operator.mod: "sym_mod", operator.truediv: "sym_truediv",
    operator.pow: "sym_pow", operator.neg: "sym_neg", operator.eq: "sym_eq", operator.ne: "sym_ne",
    operator.lt: "sym_lt", operator.le: "sym_le", operator.gt: "sym_gt", operator.ge: "sym_ge",
    operator.not_: "sym_not", torch.sym_not: "sym_not", torch.sym_max: "sym_max",
    torch.sym_min: "sym_min", torch.sym_float: "sym_float", torch.sym_int: "sym_int",
    math.ceil: "sym_ceil", math.floor: "sym_floor",
}

_DIM_CHARS = {"*": "x", "+": "p", "-": "m", "/": "d", " ": ""}


def _dim(d: int | torch.SymInt, aliases: Mapping[Any, Any] | None = None) -> str:
    """A dimension in IR syntax: `8`, `s0`, or `e_4xs0` for an expression;
    ``aliases`` (symbol -> symbol) renames symbols first (Note [One batch
    symbol])."""
    if isinstance(d, int):
        return str(d)
    expr = d.node.expr
    if aliases:
        expr = expr.xreplace(aliases)
    if expr.is_Integer:
        return str(int(expr))
    text = str(expr)
    if expr.is_Symbol:
        return text
    return "e_" + "".join(_DIM_CHARS.get(c, c if c.isalnum() else "_") for c in text)


def _size_hint(d: torch.SymInt) -> int | None:
    """The size `d` has at the call being compiled."""
    try:
        from torch.fx.experimental.symbolic_shapes import optimization_hint
    except ImportError:  # torch before optimization_hint
        return d.node.shape_env.size_hint(d.node.expr)
    return optimization_hint(d)


def symbol_sizes(*modules: torch.fx.GraphModule) -> dict[str, int]:
    """The value of every symbolic dimension (`s0`, `e_4xs0`) of the graphs'
    values at the call being compiled (the shape environment's hints), by the
    name the IR gives it: the cost model prices a graph at these sizes
    instead of at CostOptions::default_symbol_size."""
    out: dict[str, int] = {}
    for gm in modules:
        for node in gm.graph.nodes:
            val = node.meta.get("val")
            dims = (list(val.shape) if isinstance(val, torch.Tensor)
                    else [val] if isinstance(val, torch.SymInt) else [])
            for d in dims:
                if not isinstance(d, torch.SymInt) or d.node.expr.is_Integer:
                    continue
                try:
                    hint = _size_hint(d)
                except Exception:  # unbacked or unhinted: no size to cost at
                    continue
                if hint is not None:
                    out[_dim(d)] = int(hint)
    return out


def _type(val: Any, where: str, aliases: Mapping[Any, Any] | None = None) -> str:
    """IR type of an FX value (meta["val"]); ``aliases`` as in _dim."""
    if isinstance(val, torch.Tensor):
        if type(val) not in (torch.Tensor, torch.nn.Parameter) and not _is_fake(val):
            raise UnsupportedGraph(f"tensor subclass {type(val).__name__}", where)
        if val.layout != torch.strided:
            raise UnsupportedGraph(f"{val.layout} tensor", where)
        dtype = DTYPE_NAMES.get(val.dtype)
        if dtype is None:
            raise UnsupportedGraph(f"dtype {val.dtype}", where)
        return f"{dtype}[{', '.join(_dim(d, aliases) for d in val.shape)}]"
    if isinstance(val, (bool, torch.SymBool)):
        return "bool"
    if isinstance(val, (int, torch.SymInt)):
        return "int"
    if isinstance(val, (float, torch.SymFloat)):
        return "float"
    raise UnsupportedGraph(f"value of type {type(val).__name__}", where)


# Note [Checkpointed ops that draw nothing]: under activation checkpointing
# (torch.utils.checkpoint, transformers' gradient_checkpointing_enable)
# AOTAutograd wraps every op tagged nondeterministic_seeded in the forward as
# run_and_save_rng_state(op, ...) and its recompute in the backward as
# run_with_rng_state(state, op, ...), so that the recompute draws the same
# random numbers. Scaled dot-product attention carries the tag for its
# dropout, which is 0 in a model without attention dropout (every
# transformers config here): such a call draws nothing, and the pair is the
# op itself, with an empty u8[0] tensor for the state. Dropout that draws is
# Note [Replaying a checkpointed dropout]; any other op that would draw is
# refused, naming it: its recompute would have to replay the forward's
# numbers.
#
# Note [Replaying a checkpointed dropout]: native_dropout(x, p, train) draws
# a bool mask and returns (x * mask * scale, mask), scale = 1 / (1 - p). Its
# recompute needs the mask, not the generator's state: the forward's
# native_dropout runs as it is and its mask is the "state" the forward saves
# for the backward (a bool tensor of x's shape, where AOTAutograd saved the
# generator's bytes); the backward's run_with_rng_state(mask, native_dropout,
# x', p, train) is native_dropout_backward(x', mask, scale), which computes
# x' * mask * scale: the forward's output to the bit in fp32 and fp64 (one
# rounding of the scale apart in bf16), and the forward's mask. The mask is
# kept from the forward to the backward, as eager keeps the generator's
# state: one byte per element of x, the price of replaying on CPU worker
# threads that share one generator, where restoring its state would replay
# whatever another device drew meanwhile.
@functools.cache
def _rng_state_ops() -> tuple[Any, Any]:
    """(run_and_save_rng_state, run_with_rng_state); None where this torch
    has no such op."""
    hop = torch.ops.higher_order
    return (getattr(hop, "run_and_save_rng_state", None),
            getattr(hop, "run_with_rng_state", None))


def _replays_from_mask(op: Any) -> bool:
    """Whether a checkpointed call of ``op`` that draws is replayed from its
    mask (Note [Replaying a checkpointed dropout])."""
    return op is torch.ops.aten.native_dropout.default


def _dropout_scale(schema: torch._C.FunctionSchema, args: Sequence[Any],
                   kwargs: Mapping[str, Any], where: str) -> float:
    """native_dropout's scale, 1 / (1 - p) (0 for p = 1, as ATen's)."""
    p = args[1] if len(args) > 1 else kwargs.get("p")
    if not isinstance(p, (int, float)) or isinstance(p, bool):
        raise UnsupportedGraph(f"{schema.name} with a dropout probability of {p!r} "
                               "(a number is replayed)", where)
    return 0.0 if p == 1 else 1.0 / (1.0 - float(p))


def _draws_nothing(schema: torch._C.FunctionSchema, args: Sequence[Any],
                   kwargs: Mapping[str, Any]) -> bool:
    """Whether a call of an op tagged nondeterministic_seeded draws no random
    numbers: its dropout probability (``dropout_p`` / ``p`` / ``dropout``) is
    0, or it does not train (native_dropout's and lstm's ``train``)."""
    given = {a.name: (args[i] if i < len(args) else kwargs.get(a.name, a.default_value))
             for i, a in enumerate(schema.arguments)}
    if given.get("train") is False:
        return True
    for name in ("dropout_p", "p", "dropout"):
        if name in given:
            return isinstance(given[name], (int, float)) and given[name] == 0
    return False


def saved_rng_states(fw_module: torch.fx.GraphModule, bw_module: torch.fx.GraphModule,
                     fw_names: Mapping[str, str], bw_names: Mapping[str, str]
                     ) -> list[tuple[str, str]]:
    """(backward input, forward value) of each RNG state the forward saves
    for its checkpointed recompute (Note [Checkpointed ops that draw
    nothing]): AOTAutograd names them anew in the backward,
    ``rng_state_output_<k>`` for the forward's k-th, so they pair by order."""
    ops = _rng_state_ops()
    if ops[0] is None:
        return []
    states = [n.name for n in fw_module.graph.nodes
              if n.op == "call_function" and n.target is operator.getitem
              and isinstance(n.args[0], torch.fx.Node) and n.args[0].target is ops[0]
              and n.args[1] == 0]
    inputs = {}
    for n in bw_module.graph.nodes:
        m = re.fullmatch(r"rng_state_output_(\d+)", n.name) if n.op == "placeholder" else None
        if m is not None:
            inputs[int(m.group(1))] = n.name
    return [(bw_names[inputs[k]], fw_names[states[k]]) for k in sorted(inputs)
            if k < len(states) and inputs[k] in bw_names and states[k] in fw_names]


def _fake_call(op: torch._ops.OpOverload, args: Sequence[Any], kwargs: Mapping[str, Any],
               where: str) -> list[Any]:
    """The outputs of ``op`` on the traced values of its FX arguments (a
    higher-order op's node carries none of its own)."""
    from torch._guards import detect_fake_mode
    vals = torch.fx.node.map_arg((tuple(args), dict(kwargs)), lambda n: n.meta.get("val"))
    mode = detect_fake_mode(list(vals[0]) + list(vals[1].values()))
    if mode is None:
        raise UnsupportedGraph(f"{op} without traced arguments", where)
    with mode:
        out = op(*vals[0], **vals[1])
    return list(out) if isinstance(out, (tuple, list)) else [out]


def _is_fake(t: torch.Tensor) -> bool:
    from torch._subclasses.fake_tensor import FakeTensor
    return isinstance(t, FakeTensor)


def _string(s: str) -> str:
    out = ['"']
    for c in s:
        if c in '"\\':
            out.append("\\" + c)
        elif c == "\n":
            out.append("\\n")
        elif c == "\t":
            out.append("\\t")
        elif ord(c) < 0x20 or ord(c) == 0x7F:
            out.append(f"\\x{ord(c):02x}")
        else:
            out.append(c)
    out.append('"')
    return "".join(out)


def _float(x: float) -> str:
    # repr() is the shortest text that reads back to the same double, and
    # always has a '.' or an exponent; the IR parser reads it exactly.
    if math.isnan(x):
        return "nan"
    if math.isinf(x):
        return "inf" if x > 0 else "-inf"
    return repr(float(x))


# ---- layers --------------------------------------------------------------------

_ROOT = re.compile(r"""^(?:L|G)\[['"][^'"]*['"]\]""")
_PART = re.compile(r"""\.([A-Za-z0-9_]+)|\[['"]([^'"]*)['"]\]|\[(\d+)\]""")
_HIDDEN_PARTS = {"_modules", "_parameters", "_buffers"}


def layer_name(path: str) -> str:
    """The module path of an nn_module_stack entry, as users write it:
    ``L['self'].blocks[0]._modules['attn']`` -> ``blocks.0.attn``; the root
    module itself -> ``""``."""
    m = _ROOT.match(path)
    if not m:  # older mangled form: L__self___blocks_0_attn
        return re.sub(r"^L__self___?", "", path)
    parts = []
    for name, key, index in _PART.findall(path[m.end():]):
        part = name or key or index
        if part not in _HIDDEN_PARTS:
            parts.append(part)
    return ".".join(parts)


def source_name(source: str) -> str | None:
    """An IR value name for a Dynamo input source: ``L['self']._modules['fc1']
    ._parameters['weight']`` -> ``fc1.weight``, ``L['x']`` -> ``x``."""
    m = _ROOT.match(source)
    if not m:
        return None
    parts = [name or key or index for name, key, index in _PART.findall(source[m.end():])
             if (name or key or index) not in _HIDDEN_PARTS]
    if not parts or parts[0].isdigit():  # L['x'] -> x, L['args'][0] -> args.0
        parts.insert(0, re.sub(r"""^(?:L|G)\[['"]|['"]\]$""", "", m.group(0)))
    name = re.sub(r"[^A-Za-z0-9_.]", "_", ".".join(parts))
    return name or None


def _layer_of(meta: Mapping[str, Any], key: str) -> str | None:
    stack = meta.get(key)
    if not stack:
        return None
    path = list(stack.values())[-1][0]
    return layer_name(path)


# ---- the importer ---------------------------------------------------------------

_Ref = str | list  # an IR value name, or a list of refs (a Tensor[] result)


@dataclass
class _Opaque:
    """A non-tensor attribute (a higher-order op's subgraph)."""
    name: str


class _Importer:
    def __init__(self, gm: torch.fx.GraphModule, kind: GraphKind, name: str,
                 describe: Callable[[torch.fx.Node], tuple[InputRole, str | None]],
                 layer_of_seq: Mapping[int, str],
                 aliases: Mapping[Any, Any] | None = None) -> None:
        self.gm = gm
        self.aliases = dict(aliases or {})
        self.kind = kind
        self.name = name
        self.describe = describe
        self.fw_layer_of_seq = layer_of_seq
        self.env: dict[torch.fx.Node, _Ref] = {}
        self.taken = {n.name for n in gm.graph.nodes}
        self.inputs: list[str] = []
        self.const_inputs: list[str] = []
        self.constants: list[torch.Tensor] = []
        self.lines: list[str] = []
        self.layer_of_seq: dict[int, str] = {}
        self.outputs: list[str] = []
        self.output_map: list[int] = []

    def fresh(self, base: str) -> str:
        name, i = base, 0
        while name in self.taken:
            i += 1
            name = f"{base}_{i}"
        self.taken.add(name)
        return name

    def run(self) -> ImportedGraph:
        for node in self.gm.graph.nodes:
            if node.op == "placeholder":
                self.placeholder(node)
            elif node.op == "get_attr":
                self.get_attr(node)
            elif node.op == "call_function":
                self.call_function(node)
            elif node.op == "output":
                self.output(node)
            else:
                raise UnsupportedGraph(f"FX {node.op} node {node.target}", f"node {node.name}")
        head = ", ".join(self.inputs + self.const_inputs)
        body = "".join(f"  {line}\n" for line in self.lines)
        ret = ", ".join(f"%{o}" for o in self.outputs)
        text = f"graph @{self.name}({head}) {{\n{body}  return {ret}\n}}\n"
        names = {n.name: r for n, r in self.env.items() if isinstance(r, str)}
        return ImportedGraph(self.name, self.kind, text, self.output_map, self.constants,
                             self.layer_of_seq, names)

    # -- node kinds --

    def placeholder(self, node: torch.fx.Node) -> None:
        val = node.meta.get("val")
        if val is None:
            raise UnsupportedGraph("graph input without a value", f"placeholder {node.name}")
        role, preferred = self.describe(node)
        if node.users and all(u.target is _rng_state_ops()[1] and u.args[0] is node
                              for u in node.users):
            # a saved RNG state: the forward made it empty (Note [Checkpointed
            # ops that draw nothing]) or it is a dropout's mask (Note
            # [Replaying a checkpointed dropout])
            self.inputs.append(f"%{node.name}: {self.saved_state_type(node)} {role.value}")
            self.env[node] = node.name
            return
        if not isinstance(val, torch.Tensor):  # a size is named after its symbol: %s0: int
            role = InputRole.INPUT
            expr = val.node.expr if isinstance(val, torch.SymInt) else None
            if expr is not None and self.aliases:
                expr = expr.xreplace(self.aliases)  # %s17 of an aliased s17 is %s77_1
            preferred = str(expr) if expr is not None and expr.is_Symbol else None
        name = self.fresh(preferred) if preferred else node.name
        self.inputs.append(f"%{name}: {_type(val, node.name, self.aliases)} {role.value}")
        self.env[node] = name

    def get_attr(self, node: torch.fx.Node) -> None:
        obj: Any = self.gm
        for part in str(node.target).split("."):
            obj = getattr(obj, part)
        if not isinstance(obj, torch.Tensor):
            # A subgraph of a higher-order op: its user says what it is.
            self.env[node] = _Opaque(str(node.target))
            return
        self.const_inputs.append(f"%{node.name}: {_type(obj, node.name, self.aliases)} buffer")
        self.constants.append(obj)
        self.env[node] = node.name

    def call_function(self, node: torch.fx.Node) -> None:
        target = node.target
        if target is operator.getitem:
            base = self.env.get(node.args[0])  # type: ignore[arg-type]
            if not isinstance(base, list):
                raise UnsupportedGraph("getitem of a single value", f"node {node.name}")
            self.env[node] = base[node.args[1]]  # type: ignore[index]
            return
        if isinstance(target, torch._ops.OpOverload):
            self.op_node(node, target)
        elif target in _SYM_OPS:
            self.sym_node(node, _SYM_OPS[target])
        elif target is getattr(torch, "sym_sum", None):
            self.sym_sum(node)
        elif target is not None and target in _rng_state_ops():
            self.rng_state_op(node)
        elif isinstance(target, torch._ops.HigherOrderOperator):
            raise UnsupportedGraph(f"higher-order op {target.name()}",
                                   f"node {node.name} calls a subgraph; it has no ATen schema")
        else:
            what = getattr(target, "__qualname__", None) or repr(target)
            module = getattr(target, "__module__", None)
            what = f"{module}.{what}" if module and module != "builtins" else what
            raise UnsupportedGraph(f"opaque Python callable {what}",
                                   f"node {node.name}; it has no ATen schema")

    def op_node(self, node: torch.fx.Node, op: torch._ops.OpOverload) -> None:
        schema = op._schema
        qualified = schema.name + (f".{schema.overload_name}" if schema.overload_name else "")
        where = f"node {node.name} ({qualified})"
        args = [self.arg(a, where) for a in node.args]
        args += [f"{k}={self.arg(v, where)}" for k, v in node.kwargs.items()]
        results = self.results(node, schema, where)
        call = f"{qualified}({', '.join(args)})"
        # ir/random_ops.h (isRandom): an op the
        # schema tags nondeterministic_seeded is marked random=true unless
        # its arguments draw nothing (attention or an LSTM with dropout 0).
        random = (torch.Tag.nondeterministic_seeded in op.tags
                  and not _draws_nothing(schema, node.args, node.kwargs))
        attrs = self.attrs(node, random=random)
        self.lines.append(f"{results} = {call}{attrs}")

    def sym_node(self, node: torch.fx.Node, name: str) -> None:
        where = f"node {node.name} ({name})"
        args = ", ".join(self.arg(a, where) for a in node.args)
        if node.kwargs:
            raise UnsupportedGraph(f"keyword arguments to {name}", where)
        val = node.meta.get("val")
        self.env[node] = node.name
        self.lines.append(f"%{node.name}: {_type(val, where, self.aliases)} = modelpar::{name}({args})"
                          f"{self.attrs(node)}")

    def sym_sum(self, node: torch.fx.Node) -> None:
        """``torch.sym_sum(terms)`` (a sum of sizes, e.g. a sliding-window
        mask's bounds) as a chain of ``modelpar::sym_add``."""
        where = f"node {node.name} (sym_sum)"
        if node.kwargs or len(node.args) != 1 or not isinstance(node.args[0], (list, tuple)):
            raise UnsupportedGraph("torch.sym_sum not of one list of terms", where)
        terms = [self.arg(a, where) for a in node.args[0]]
        terms = (terms + ["0", "0"])[:max(len(terms), 2)]  # sym_add takes two terms
        typ = _type(node.meta.get("val"), where, self.aliases)
        acc = terms[0]
        for i, term in enumerate(terms[1:], start=2):
            name = node.name if i == len(terms) else self.fresh(f"{node.name}_partial")
            self.lines.append(f"%{name}: {typ} = modelpar::sym_add({acc}, {term}){self.attrs(node)}")
            acc = f"%{name}"
        self.env[node] = node.name

    def rng_state_op(self, node: torch.fx.Node) -> None:
        """``run_and_save_rng_state(op, ...)`` / ``run_with_rng_state(state,
        op, ...)`` of an op that draws no random numbers with its arguments:
        the op itself, and an empty state (Note [Checkpointed ops that draw
        nothing])."""
        saves = node.target is _rng_state_ops()[0]
        op = node.args[0 if saves else 1]
        args = node.args[1:] if saves else node.args[2:]
        where = f"node {node.name} ({getattr(node.target, '__name__', node.target)})"
        if not isinstance(op, torch._ops.OpOverload):
            raise UnsupportedGraph(f"{node.target} of {op!r}", where)
        schema = op._schema
        qualified = schema.name + (f".{schema.overload_name}" if schema.overload_name else "")
        draws = not _draws_nothing(schema, args, node.kwargs)
        if draws and not _replays_from_mask(op):
            raise UnsupportedGraph(
                f"activation checkpointing of {qualified}, which draws random numbers here "
                "(its recompute must replay them; only native_dropout's is replayed, from "
                "its mask)", where)
        if draws and not saves:  # Note [Replaying a checkpointed dropout]
            self.replay_dropout(node, schema, args, where)
            return
        outs = _fake_call(op, args, node.kwargs, where)
        names = [self.fresh(f"{node.name}_{i}") for i in range(len(outs))]
        results = ", ".join(f"%{n}: {_type(v, where, self.aliases)}" for n, v in zip(names, outs))
        call = [self.arg(a, where) for a in args]
        call += [f"{k}={self.arg(v, where)}" for k, v in node.kwargs.items()]
        self.lines.append(f"{results} = {qualified}({', '.join(call)})"
                          f"{self.attrs(node, random=draws)}")
        produced: Any = names if len(schema.returns) != 1 else names[0]
        if saves and draws:  # the dropout's mask is the state its recompute replays
            self.env[node] = [names[1], produced]
        elif saves:
            state = self.fresh(f"{node.name}_state")
            self.lines.append(f"%{state}: u8[0] = aten::zeros([0], dtype=dtype.u8, "
                              f"device=device(\"cpu\")){self.attrs(node)}")
            self.env[node] = [state, produced]
        else:
            self.env[node] = produced

    def replay_dropout(self, node: torch.fx.Node, schema: torch._C.FunctionSchema,
                       args: Sequence[Any], where: str) -> None:
        """The backward's recompute of a checkpointed native_dropout that
        draws (Note [Replaying a checkpointed dropout]): native_dropout_backward
        of the recomputed input with the mask the forward saved as its state."""
        outs = _fake_call(torch.ops.aten.native_dropout.default, args, node.kwargs, where)
        state = self.env[node.args[0]]
        out = self.fresh(f"{node.name}_0")
        scale = _dropout_scale(schema, args, node.kwargs, where)
        self.lines.append(f"%{out}: {_type(outs[0], where, self.aliases)} = "
                          f"aten::native_dropout_backward({self.arg(args[0], where)}, %{state}, "
                          f"{scale!r}){self.attrs(node)}")
        self.env[node] = [out, state]

    def saved_state_type(self, node: torch.fx.Node) -> str:
        """IR type of a backward input that holds a saved RNG state: u8[0]
        for ops that draw nothing, the mask's for a dropout that draws."""
        where = f"placeholder {node.name}"
        for user in node.users:
            op, args = user.args[1], user.args[2:]
            if isinstance(op, torch._ops.OpOverload) and _replays_from_mask(op) \
                    and not _draws_nothing(op._schema, args, user.kwargs):
                x = args[0].meta.get("val") if isinstance(args[0], torch.fx.Node) else None
                if not isinstance(x, torch.Tensor):
                    raise UnsupportedGraph("a dropout replay without a traced input", where)
                return _type(x, where, self.aliases).replace(DTYPE_NAMES[x.dtype], DTYPE_NAMES[torch.bool], 1)
        return "u8[0]"

    def output(self, node: torch.fx.Node) -> None:
        index: dict[str, int] = {}
        for a in node.args[0]:
            if a is None:
                self.output_map.append(-1)
                continue
            ref = self.env.get(a) if isinstance(a, torch.fx.Node) else None
            if not isinstance(ref, str):
                raise UnsupportedGraph(f"graph output {a!r}", "not a single value")
            if ref not in index:
                index[ref] = len(self.outputs)
                self.outputs.append(ref)
            self.output_map.append(index[ref])

    # -- pieces --

    def results(self, node: torch.fx.Node, schema: torch._C.FunctionSchema, where: str) -> str:
        """`%a: f32[4], %b: i64[4]` or `^label`; fills env[node]."""
        returns = schema.returns
        val = node.meta.get("val")
        if not returns:
            label = self.fresh(node.name)
            self.env[node] = label
            return f"^{label}"
        if "val" not in node.meta:
            raise UnsupportedGraph(f"{schema.name} without a traced value", where)
        # getitem users name the outputs they read.
        named: dict[int, str] = {}
        for user in node.users:
            if user.target is operator.getitem and isinstance(user.args[1], int):
                named.setdefault(user.args[1], user.name)
        decls: list[str] = []
        fallback_dtype = self.first_tensor_dtype(node)

        def decl(name: str, v: Any) -> str:
            if v is None:  # an undefined Tensor? result (e.g. an output_mask entry off)
                decls.append(f"%{name}: {fallback_dtype}[]")
            else:
                decls.append(f"%{name}: {_type(v, where, self.aliases)}")
            return name

        def is_list(ret: Any) -> bool:
            return isinstance(ret.type, torch._C.ListType)

        if len(returns) == 1 and not is_list(returns[0]):
            self.env[node] = decl(node.name, val)
        elif len(returns) == 1:  # Tensor[]: one output per element
            self.env[node] = [decl(named.get(j) or self.fresh(f"{node.name}_{j}"), v)
                              for j, v in enumerate(val)]
        else:
            refs: list[_Ref] = []
            for i, (ret, v) in enumerate(zip(returns, val)):
                if is_list(ret):
                    refs.append([decl(self.fresh(f"{node.name}_{i}_{j}"), x) for j, x in enumerate(v)])
                else:
                    refs.append(decl(named.get(i) or self.fresh(f"{node.name}_{i}"), v))
            self.env[node] = refs
        return ", ".join(decls)

    def first_tensor_dtype(self, node: torch.fx.Node) -> str:
        for a in node.args:
            v = a.meta.get("val") if isinstance(a, torch.fx.Node) else None
            if isinstance(v, torch.Tensor) and v.dtype in DTYPE_NAMES:
                return DTYPE_NAMES[v.dtype]
        return "f32"

    def arg(self, a: Any, where: str) -> str:
        if isinstance(a, torch.fx.Node):
            ref = self.env.get(a)
            if ref is None:
                raise UnsupportedGraph(f"use of {a.name} before its definition", where)
            if isinstance(ref, _Opaque):
                raise UnsupportedGraph(f"non-tensor attribute {ref.name}", where)
            return self.ref(ref)
        if a is None:
            return "None"
        if isinstance(a, bool):
            return "true" if a else "false"
        if isinstance(a, int):
            return str(a)
        if isinstance(a, float):
            return _float(a)
        if isinstance(a, str):
            return _string(a)
        if isinstance(a, (list, tuple)):
            return "[" + ", ".join(self.arg(x, where) for x in a) + "]"
        if isinstance(a, torch.dtype):
            if a not in DTYPE_NAMES:
                raise UnsupportedGraph(f"dtype {a}", where)
            return f"dtype.{DTYPE_NAMES[a]}"
        if isinstance(a, torch.layout):
            if a not in LAYOUT_NAMES:
                raise UnsupportedGraph(f"layout {a}", where)
            return f"layout.{LAYOUT_NAMES[a]}"
        if isinstance(a, torch.memory_format):
            return f"memory_format.{MEMORY_FORMAT_NAMES[a]}"
        if isinstance(a, torch.device):
            return f"device({_string(str(a))})"
        raise UnsupportedGraph(f"argument of type {type(a).__name__}", where)

    def ref(self, r: _Ref) -> str:
        return f"%{r}" if isinstance(r, str) else "[" + ", ".join(self.ref(x) for x in r) + "]"

    def attrs(self, node: torch.fx.Node, random: bool = False) -> str:
        meta = node.meta
        phase = "fwd"
        layer = _layer_of(meta, "nn_module_stack")
        if self.kind is GraphKind.BACKWARD:
            # A forward op the min-cut partitioner recomputes in the backward
            # keeps its tag from the joint graph (and its nn_module_stack).
            forward_op = meta.get("partitioner_tag") == "is_forward"
            phase = "recompute" if forward_op else "bwd"
            if not forward_op:
                layer = _layer_of(meta, "fwd_nn_module_stack")
                if layer is None and meta.get("seq_nr") is not None:
                    layer = self.fw_layer_of_seq.get(meta["seq_nr"])
        elif layer is not None and meta.get("seq_nr") is not None:
            self.layer_of_seq.setdefault(meta["seq_nr"], layer)
        parts = [f"layer={_string(layer)}"] if layer else []
        parts.append(f"phase={phase}")
        if random:  # the schema's nondeterministic_seeded tag (ir/random_ops.h)
            parts.append("random=true")
        return " {" + ", ".join(parts) + "}"


def import_graph(gm: torch.fx.GraphModule, kind: GraphKind, name: str,
                 describe: Callable[[torch.fx.Node], tuple[InputRole, str | None]] = (
                     lambda n: (InputRole.INPUT, None)),
                 layer_of_seq: Mapping[int, str] | None = None,
                 aliases: Mapping[Any, Any] | None = None) -> ImportedGraph:
    """Converts an ATen-level FX graph to IR text.

    ``name`` becomes the graph's ``@name`` (an identifier). ``describe`` gives
    the role of each tensor placeholder and a name for it (``fc1.weight``; None
    keeps the FX name). ``layer_of_seq`` (backward graphs) maps a
    forward node's ``seq_nr`` to its layer, for backward nodes whose own
    metadata does not name the module. ``aliases`` renames size symbols
    (batch_symbol_aliases: Note [One batch symbol]).

    Raises:
        UnsupportedGraph: a node the IR or the runtime cannot express.
    """
    return _Importer(gm, kind, name, describe, layer_of_seq or {}, aliases).run()


# Note [One batch symbol]
# ~~~~~~~~~~~~~~~~~~~~~~~
# Dynamo may give each input's batch dimension a symbol of its own: when the
# sequence length changed between calls too, its automatic dynamic shapes
# made x: [s77, s27] and y: [s17, s94] although x and y always share batch
# and length. The micro-batch pass splits every batched input along one
# batch symbol, and refused such a graph ("the inputs disagree on the batch
# symbol"). batch_symbol_aliases() names, for the graph of one call, the
# user inputs whose dim 0 is a plain symbol equal in value to the first
# such input's (the batch), and maps their symbols to the first one's; the
# importer writes every other symbol as that one, as Dynamo's duck shaping
# does for sizes equal when traced, so the graph has one batch symbol. The
# pipeline then checks at every call that those inputs do share the batch
# size (PipelineStep.batch_of), since nothing in the graph does.


def batch_symbol_aliases(gm: torch.fx.GraphModule,
                         describe: Callable[[torch.fx.Node], tuple[InputRole, str | None]]
                         ) -> tuple[dict[Any, Any], list[int]]:
    """(symbol -> the batch's symbol, the placeholder indices of the
    batched user inputs) for ``gm`` at the call being compiled (Note [One
    batch symbol]); ({}, []) when no user input has a symbolic dim 0."""
    batched: list[tuple[int, Any, int]] = []  # (placeholder index, symbol, value)
    placeholders = [n for n in gm.graph.nodes if n.op == "placeholder"]
    for i, node in enumerate(placeholders):
        val = node.meta.get("val")
        if not isinstance(val, torch.Tensor) or val.dim() == 0 or describe(node)[0] is not InputRole.INPUT:
            continue
        d = val.shape[0]
        if not isinstance(d, torch.SymInt) or not d.node.expr.is_Symbol:
            continue
        try:
            value = int(_size_hint(d))
        except Exception:  # unbacked or unhinted: not a batch we can compare
            continue
        batched.append((i, d.node.expr, value))
    if not batched:
        return {}, []
    _, symbol, value = batched[0]
    same = [(i, s) for i, s, v in batched if v == value]
    return {s: symbol for _, s in same if s != symbol}, [i for i, _ in same]
