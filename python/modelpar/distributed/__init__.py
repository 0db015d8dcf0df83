"""Plans over the ranks of a torch.distributed process group: the group
(:mod:`~modelpar.distributed.groups`), the plan check
(:mod:`~modelpar.distributed.plan_check`), a rank's executor
(:mod:`~modelpar.distributed.rank_executor`), homes of parameters
(:mod:`~modelpar.distributed.homes`), naming a failed rank
(:mod:`~modelpar.distributed.faults`), values measured once
(:mod:`~modelpar.distributed.first_rank`), materializing a model too big for
a rank (:mod:`~modelpar.distributed.materialize`,
:mod:`~modelpar.distributed.untouched`), state dicts
(:mod:`~modelpar.distributed.state_dict`), gradient helpers
(:mod:`~modelpar.distributed.gradients`), inputs the ranks must agree on
(:mod:`~modelpar.distributed.input_check`), the ``mesh`` option
(:mod:`~modelpar.distributed.mesh`) and its gradient averaging
(:mod:`~modelpar.distributed.data_parallel`), and DCP checkpoints
(:mod:`~modelpar.distributed.checkpoint`: ``modelpar.distributed.checkpoint.save``
/ ``load``)."""

from . import checkpoint, mesh  # noqa: F401  (modelpar.distributed.checkpoint.save, ...mesh.device_mesh)
