"""The ``torch.compile`` front end: the ``modelpar`` backend
(:mod:`~modelpar.compile.backend`), the FX -> IR import
(:mod:`~modelpar.compile.fx_import`), a pipelined step
(:mod:`~modelpar.compile.pipeline_step`), the searched step
(:mod:`~modelpar.compile.step_search`), and what was compiled
(:mod:`~modelpar.compile.records`, :mod:`~modelpar.compile.step_trace`)."""
