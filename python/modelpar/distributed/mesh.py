"""The ``mesh`` option: ``options={"devices": "world", "mesh": {"pp": P, "dp": D}}``
(or a ``torch.distributed.device_mesh.DeviceMesh`` whose dims are named
``"pp"`` and ``"dp"``). Each of the D data-parallel replicas runs the plan
over its P ranks (a ``pp`` group); the gradients of each stage are averaged
over its ``dp`` group (data_parallel.py).

A mesh given as a dict is laid out as torchtitan and Megatron lay theirs,
pipeline outermost: global rank ``r`` is stage ``r // D`` of replica
``r % D``, so a dp group holds D consecutive ranks (the ones a machine
hosts, when D GPUs per machine) and a pp group every D-th rank.

Example (``torchrun --nproc-per-node 4 train.py``)::

    mesh = modelpar.distributed.mesh.device_mesh(pp=2, dp=2)   # or a dict in options
    sampler = DistributedSampler(data, num_replicas=mesh.size(1),
                                 rank=mesh.get_local_rank("dp"))  # one batch per replica
    step = torch.compile(train_step, backend="modelpar",
                         options={"devices": "world", "mesh": mesh})
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from ..errors import ConfigError

__all__ = ["MeshGroups", "device_mesh", "resolve_mesh"]

# (pp, dp, device type, id of the default group) -> the DeviceMesh made for it
_made: dict[tuple[int, int, str, int], Any] = {}


@dataclass(frozen=True)
class MeshGroups:
    """A resolved mesh: the DeviceMesh and this rank's groups along it."""
    mesh: Any
    pp: int
    dp: int
    pp_group: Any
    dp_group: Any


def _device_type() -> str:
    import torch.distributed as dist
    return "cuda" if dist.get_backend() == "nccl" else "cpu"


def device_mesh(pp: int, dp: int) -> Any:
    """The 2-D DeviceMesh (dims ``("pp", "dp")``, pipeline outermost) over
    the default group's ranks, made once per shape: every rank must call it
    (or compile with the dict form of the option) in the same order, since
    making its groups is collective.

    Raises:
        ConfigError: no initialised group, sizes that are not ints >= 1, or
            pp x dp other than the world size.
    """
    import torch.distributed as dist

    from .groups import group_of, outside_tracing
    group_of(None, "modelpar options: mesh")
    for key, value in (("pp", pp), ("dp", dp)):
        if isinstance(value, bool) or not isinstance(value, int) or value < 1:
            raise ConfigError(f"modelpar options: mesh[{key!r}]={value!r} is not valid; "
                              f"{key} takes an int >= 1")
    world = dist.get_world_size()
    if pp * dp != world:
        raise ConfigError(f"modelpar options: mesh pp={pp} x dp={dp} = {pp * dp} ranks, but the "
                          f"world has {world}; the mesh must cover every rank: launch "
                          f"{pp * dp} processes (torchrun --nproc-per-node {pp * dp}) or give "
                          f"sizes whose product is {world}")
    key = (pp, dp, _device_type(), id(dist.distributed_c10d._get_default_group()))
    if key not in _made:
        from torch.distributed.device_mesh import init_device_mesh
        with outside_tracing():  # new_group is collective: Note [Collectives outside the tracer's dispatch]
            _made[key] = init_device_mesh(key[2], (pp, dp), mesh_dim_names=("pp", "dp"))
    return _made[key]


def resolve_mesh(mesh: Any) -> MeshGroups:
    """The ``mesh`` option's DeviceMesh and this rank's pp and dp groups.

    Raises:
        ConfigError: not a dict with exactly ``pp`` and ``dp`` nor a 2-D
            DeviceMesh with dims named so; sizes that do not cover the world.
    """
    from torch.distributed.device_mesh import DeviceMesh
    if isinstance(mesh, dict):
        keys = sorted(map(str, mesh))
        if keys != ["dp", "pp"]:
            raise ConfigError(f"modelpar options: mesh={mesh!r} is not valid; mesh takes a dict "
                              "with the keys 'pp' and 'dp' (ranks per pipeline, data-parallel "
                              "replicas), e.g. {'pp': 2, 'dp': 2}, or a DeviceMesh with dims "
                              "named 'pp' and 'dp'")
        made = device_mesh(mesh["pp"], mesh["dp"])
        return MeshGroups(made, mesh["pp"], mesh["dp"], made.get_group("pp"),
                          made.get_group("dp"))
    if isinstance(mesh, DeviceMesh):
        import torch.distributed as dist
        names = tuple(mesh.mesh_dim_names or ())
        if sorted(names) != ["dp", "pp"]:
            raise ConfigError(f"modelpar options: mesh is a DeviceMesh with dims {names or 'unnamed'}"
                              "; modelpar needs exactly two, named 'pp' and 'dp': "
                              "init_device_mesh(type, (P, D), mesh_dim_names=('pp', 'dp'))")
        world = dist.get_world_size()
        if mesh.size() != world:
            raise ConfigError(f"modelpar options: the mesh has {mesh.size()} ranks "
                              f"(pp={mesh.size(names.index('pp'))} x "
                              f"dp={mesh.size(names.index('dp'))}) but the world has {world}; "
                              "the mesh must cover every rank")
        return MeshGroups(mesh, mesh.size(names.index("pp")), mesh.size(names.index("dp")),
                          mesh.get_group("pp"), mesh.get_group("dp"))
    raise ConfigError(f"modelpar options: mesh={mesh!r} is not valid; mesh takes None, a dict "
                      "{'pp': P, 'dp': D} or a torch.distributed.device_mesh.DeviceMesh with "
                      "dims named 'pp' and 'dp'")
