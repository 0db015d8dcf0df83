"""Plans over the ranks of a torch.distributed process group: the group
(:mod:`~modelpar.distributed.groups`), the plan check
(:mod:`~modelpar.distributed.plan_check`), a rank's executor
(:mod:`~modelpar.distributed.rank_executor`), homes of parameters
(:mod:`~modelpar.distributed.homes`), naming a failed rank
(:mod:`~modelpar.distributed.faults`), values measured once
(:mod:`~modelpar.distributed.first_rank`), materializing a model too big for
a rank (:mod:`~modelpar.distributed.materialize`,
:mod:`~modelpar.distributed.untouched`), state dicts
(:mod:`~modelpar.distributed.state_dict`) and gradient helpers
(:mod:`~modelpar.distributed.gradients`)."""
