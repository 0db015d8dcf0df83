"""The ``torch.compile`` front end: the ``modelpar`` backend
(:mod:`~modelpar.compile.backend`), the FX -> IR import
(:mod:`~modelpar.compile.fx_import`), how the forward and backward join
(:mod:`~modelpar.compile.joint_links`), graphs bound to their executors
(:mod:`~modelpar.compile.bound_graphs`, over ranks
:mod:`~modelpar.compile.rank_binding`), a graph the pipeline cannot cut
(:mod:`~modelpar.compile.unpipelined`) or the runtime cannot run
(:mod:`~modelpar.compile.eager_fallback`), a pipelined step
(:mod:`~modelpar.compile.pipeline_step`), the searched step
(:mod:`~modelpar.compile.step_search`), and what was compiled
(:mod:`~modelpar.compile.records`, :mod:`~modelpar.compile.step_trace`)."""
