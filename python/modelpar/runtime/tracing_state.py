"""What a compiler leaves on while modelpar works inside it: lifting it.

Plans are made inside ``torch.compile``'s compilers, where AOTAutograd has
its fake mode, Python dispatch modes and the Python dispatcher on. Work
that must touch real tensors or other processes from there (measuring
this machine, collectives between ranks) runs under :func:`outside_tracing`.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator

__all__ = ["outside_tracing"]


@contextlib.contextmanager
def outside_tracing() -> Iterator[None]:
    """Lifts what AOTAutograd's tracing leaves on for the compilers: its fake
    mode, Python dispatch modes and the Python dispatcher.

    Note [Collectives outside the tracer's dispatch]: the plans are made,
    and their hashes and measurements exchanged, inside the compilers, where
    AOTAutograd has the Python dispatcher on. A c10d call from there goes
    through it, which takes the GIL, and so holds the GIL while
    ProcessGroupGloo::enqueue waits for the group's work mutex; the group's
    worker thread holds that mutex while it destroys the previous
    collective's work, whose tensors Python made, and that wants the GIL:
    the process hung (1 in 3 runs of two broadcasts in a row, gdb: the main
    thread in enqueue under python_dispatcher, pt_gloo_runloop in
    ~AsyncBroadcastWork -> decref_pyobject -> gil_scoped_acquire).

    Note [Calibrated on real tensors]: the first plan for CPU workers
    calibrates this CPU, also from inside the compiler; under the fake mode
    its micro-benchmarks timed fake tensors (every copy 140 us, whatever its
    size) and the link fit failed."""
    from torch._dispatch.python import no_python_dispatcher
    from torch._subclasses.fake_tensor import unset_fake_temporarily
    from torch.utils._python_dispatch import _disable_current_modes
    with unset_fake_temporarily(), _disable_current_modes(), no_python_dispatcher():
        yield
