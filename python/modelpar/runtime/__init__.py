"""Running IR: the multi-device :class:`~modelpar.runtime.executor.Executor`
(CPU workers, GPUs, logical devices of one GPU) and the reference
interpreters (:mod:`modelpar.runtime.interpreter`)."""
