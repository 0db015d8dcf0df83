"""Builds a model over the ranks of a process group without any rank
holding all of it (issue 13: "memory really splits").

The model is constructed on the meta device (``with torch.device("meta"):
model = MyModel()``), which allocates nothing. :func:`materialize` then

1. gives every meta parameter and buffer CPU memory that is never touched
   (Note [Untouched memory]), so tracing sees real CPU tensors of the right
   shapes while no page of them is resident;
2. plans the compiled step on those tensors without running it (Note
   [Planning without running]), which tells this rank which parameters and
   buffers its instructions read;
3. initialises the model module by module, in ``named_modules()`` order,
   with the same random stream on every rank (Note [Initialising in
   order]), and after each module gives the tensors other ranks own fresh
   untouched memory again.

Afterwards each rank holds, resident, only its own parameters and buffers
(plus, for a moment, the largest module being initialised), and the next
call of the step runs the plan already compiled.

Example (``torchrun --nproc-per-node 2 train.py``)::

    dist.init_process_group("gloo")
    with torch.device("meta"):
        model = MyModel()
    step = torch.compile(lambda x, y: loss_fn(model(x), y), backend="modelpar",
                         options={"devices": "world"})
    torch.manual_seed(0)                     # the same initial values everywhere
    print(modelpar.materialize(model, step, x0, y0))
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    for x, y in data: ...                    # as usual
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any

import torch

from ..errors import ConfigError
from . import homes
from .untouched import untouched_like

__all__ = ["Materialized", "materialize", "materialize_all", "default_init"]

def default_init(name: str, module: torch.nn.Module) -> None:
    """Calls ``module.reset_parameters()`` (or ``_reset_parameters()``, as
    nn.MultiheadAttention names it): what PyTorch's layers call in their
    constructors, so a model of them built in order gets the values its
    eager construction would draw."""
    reset = getattr(module, "reset_parameters", None) or getattr(module, "_reset_parameters", None)
    reset()


@dataclass
class Materialized:
    """What :func:`materialize` did on this rank."""
    rank: int
    world: int
    total_bytes: int                  # every parameter and buffer it built
    resident_bytes: int               # those this rank owns, initialised here
    owned: list[str] = field(default_factory=list)     # their names
    elsewhere: list[str] = field(default_factory=list)  # left untouched: other ranks own them

    def __str__(self) -> str:
        mb = 1 << 20
        return (f"modelpar.materialize: rank {self.rank} of {self.world} holds "
                f"{self.resident_bytes / mb:.1f} MiB of the model's {self.total_bytes / mb:.1f} "
                f"MiB ({len(self.owned)} tensors; {len(self.elsewhere)} others left to "
                "their ranks)")


def _meta_tensors(model: torch.nn.Module) -> Iterator[tuple[str, torch.nn.Module, str, bool]]:
    """(module name, module, tensor name, is a parameter) of each meta tensor
    held directly by a module (a tied tensor once per holder)."""
    for mname, module in model.named_modules(remove_duplicate=False):
        for pname, p in module._parameters.items():
            if p is not None and p.device.type == "meta":
                yield mname, module, pname, True
        for bname, b in module._buffers.items():
            if b is not None and b.device.type == "meta":
                yield mname, module, bname, False


def _check_init(model: torch.nn.Module, init: Callable[[str, torch.nn.Module], None] | None) -> None:
    """Raises ConfigError where the default init cannot initialise a module."""
    if init is not None:
        return
    for mname, module in model.named_modules():
        direct = [n for n, t in [*module._parameters.items(), *module._buffers.items()]
                  if t is not None and t.device.type == "meta"]
        if direct and not (hasattr(module, "reset_parameters")
                           or hasattr(module, "_reset_parameters")):
            raise ConfigError(
                f"modelpar.materialize: module {mname or '(the model)'} "
                f"({type(module).__name__}) holds {', '.join(direct)} on the meta device but has "
                "no reset_parameters(), so the default initialisation cannot fill them; pass "
                "init=fn, called as fn(name, module) for each module that holds tensors (in "
                "named_modules() order), that initialises that module's own parameters and "
                "buffers")


def _allocate(model: torch.nn.Module) -> dict[int, torch.Tensor]:
    """Replaces each meta parameter and buffer with untouched CPU memory,
    keeping tied tensors tied; returns new tensor id -> the meta original."""
    made: dict[int, torch.Tensor] = {}   # meta tensor id -> its replacement
    origin: dict[int, torch.Tensor] = {}
    for _mname, module, name, is_param in list(_meta_tensors(model)):
        table = module._parameters if is_param else module._buffers
        meta = table[name]
        new = made.get(id(meta))
        if new is None:
            data = untouched_like(meta, "cpu")
            new = torch.nn.Parameter(data, requires_grad=meta.requires_grad) if is_param else data
            made[id(meta)] = new
            origin[id(new)] = meta
        table[name] = new
    return origin


def _back_to_meta(model: torch.nn.Module, origin: dict[int, torch.Tensor]) -> None:
    """Undoes _allocate (nothing half-applied when planning fails)."""
    for module in model.modules():
        for table in (module._parameters, module._buffers):
            for name, t in table.items():
                if t is not None and id(t) in origin:
                    table[name] = origin[id(t)]


# Note [Planning without running]: the plan says which rank reads which
# parameter, and the plan comes from compiling the step, which torch.compile
# does at its first call. materialize() makes that call with
# homes.plan_only set: everything compiles and plans as usual (every
# rank takes part in the plan check), and the first RankExecutor.run notes
# its inputs and raises _Planned instead of running. Dynamo keeps the
# compiled code, so the next call (same shapes) runs it without tracing
# again. The model's values are never read, so they need not exist yet.

@contextmanager
def _plan_only() -> Iterator[None]:
    old = homes.plan_only
    homes.plan_only = True
    try:
        yield
    finally:
        homes.plan_only = old


def _plan(step: Callable[..., Any], args: tuple[Any, ...], kwargs: dict[str, Any]) -> None:
    with _plan_only():
        try:
            step(*args, **kwargs)
        except homes.Planned:
            return
    raise ConfigError(
        "modelpar.materialize: calling the step ran it without a rank executor, so nothing says "
        "which rank owns which parameter; compile it with torch.compile(..., backend='modelpar', "
        "options={'devices': 'world'}) (or 'process_group': g) and make sure it does not fall "
        "back to eager (options 'strict': True says why)")


# Note [Initialising in order]: every rank runs the whole initialisation,
# module by module in named_modules() order, drawing from the same random
# stream; a rank keeps the values of the tensors it owns and drops the
# others after each module. So each rank's values are those a single
# process would compute with the same seed, and no rank ever holds more than
# its own tensors plus one module's. A tensor tied between modules (an
# embedding shared with an output layer) keeps the value its first holder
# gave it: in eager PyTorch the later holder's own tensor, initialised in
# its constructor, is the one thrown away when the tie is made, while the
# random numbers it drew are drawn here too.

def _initialise(model: torch.nn.Module, init: Callable[[str, torch.nn.Module], None],
                origin: dict[int, torch.Tensor], owns: Callable[[torch.Tensor], bool]) -> None:
    done: dict[int, torch.Tensor | None] = {}  # tied tensor id -> its first value (owned only)
    holders = Counter(id(x) for m in model.modules()
                      for x in [*m._parameters.values(), *m._buffers.values()] if x is not None)
    with torch.no_grad():
        for mname, module in model.named_modules():
            direct = [t for t in [*module._parameters.values(), *module._buffers.values()]
                      if t is not None and id(t) in origin]
            if not direct:
                continue
            init(mname, module)
            for t in direct:
                if id(t) in done:
                    first = done[id(t)]
                    if first is not None:
                        t.copy_(first)
                else:
                    tied = holders[id(t)] > 1
                    done[id(t)] = t.detach().clone() if tied and owns(t) else None
            for t in [*module.parameters(), *module.buffers()]:
                if id(t) in origin and not owns(t):
                    t.data = untouched_like(t)


def materialize(model: torch.nn.Module, step: Callable[..., Any], *args: Any,
                init: Callable[[str, torch.nn.Module], None] | None = None,
                **kwargs: Any) -> Materialized:
    """Gives ``model``'s meta-device parameters and buffers real values on
    the ranks that own them, and untouched memory elsewhere (see the module
    docstring). Call it on every rank, with the same seed and the first
    batch: ``step(*args, **kwargs)`` is the compiled step (``devices="world"``)
    it plans, without running it.

    ``init(name, module)`` initialises one module's own tensors; the default
    calls its ``reset_parameters()``. Tensors not on the meta device are kept
    as they are.

    Raises:
        ConfigError: nothing of ``model`` is on the meta device; a module
            has tensors the default init cannot fill; the step does not run
            over a process group. The model is left on the meta device.
    """
    import torch.distributed as dist
    if not any(True for _ in _meta_tensors(model)):
        raise ConfigError("modelpar.materialize: no parameter or buffer of the model is on the "
                          "meta device; build it under `with torch.device('meta'):` so that no "
                          "rank allocates all of it")
    _check_init(model, init)
    origin = _allocate(model)
    try:
        _plan(step, args, kwargs)
    except BaseException:
        _back_to_meta(model, origin)
        raise
    owns = homes.read_here
    _initialise(model, init or default_init, origin, owns)
    unique = {id(t): (n, t) for n, t in [*model.named_parameters(), *model.named_buffers()]
              if id(t) in origin}.values()
    owned = [n for n, t in unique if owns(t)]
    return Materialized(
        rank=dist.get_rank() if dist.is_initialized() else 0,
        world=dist.get_world_size() if dist.is_initialized() else 1,
        total_bytes=sum(t.numel() * t.element_size() for _, t in unique),
        resident_bytes=sum(t.numel() * t.element_size() for _, t in unique if owns(t)),
        owned=owned, elsewhere=[n for n, t in unique if not owns(t)])


def materialize_all(model: torch.nn.Module,
                    init: Callable[[str, torch.nn.Module], None] | None = None) -> None:
    """Gives every meta-device parameter and buffer of ``model`` the value
    :func:`materialize` gives it on its owner, all in this process: the
    one-process reference a distributed run is compared with, or a way to
    evaluate the model on one machine.

    Raises:
        ConfigError: as materialize (before anything is allocated).
    """
    if not any(True for _ in _meta_tensors(model)):
        raise ConfigError("modelpar.distributed.materialize.materialize_all: no parameter or buffer of the model is on "
                          "the meta device")
    _check_init(model, init)
    origin = _allocate(model)
    _initialise(model, init or default_init, origin, lambda t: True)
