"""Planning entry points from Python: the options table
(:mod:`~modelpar.planning.options`, names in
:mod:`~modelpar.planning.option_names`), placement
(:mod:`~modelpar.planning.placement`), pipelines
(:mod:`~modelpar.planning.pipeline`) and the strategy search
(:mod:`~modelpar.planning.strategy`), each over passes/ in C++."""
