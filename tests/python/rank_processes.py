"""Starts the ranks of a distributed test: N processes on localhost, each
running one worker script's main() with its own RANK / WORLD_SIZE / MASTER_*
environment and argv, its output captured, every wait bounded.

Note [Ranks forked from a warm process]
~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~
A fresh interpreter spends 4-7 s of a 2-core machine importing torch,
torch.distributed, modelpar and transformers before a rank does anything,
about a quarter of a two-rank test (profiled in issue 36), and CI starts
about 70 ranks. So the ranks are forked from a forkserver (multiprocessing's
"forkserver" context, one per test process) that imported those modules once,
with OMP_NUM_THREADS=1 as the ranks want it (libgomp reads it when it
loads). A forked rank is a new process like a started one: its own pid,
Gloo group, Dynamo caches and exit code, killed on a timeout; it gets the
caller's whole environment (os.environ at the call: monkeypatched variables
included) and argv before the worker's main() runs, and its stdout and
stderr go to a file read back as the rank's output. What it shares with the
server is only what importing did, before any process group, thread pool or
compile existed: the imports modelpar and torch do read no variable the
tests change (modelpar reads its MODELPAR_* variables when used). Users'
launches (torchrun, plain `python`) are still tested by the tests that run
torchrun and the README's example; MODELPAR_TEST_SPAWN_RANKS=1 starts every
rank as a fresh interpreter instead, as before.
"""

from __future__ import annotations

import multiprocessing
import os
import runpy
import socket
import subprocess
import sys
import tempfile
from pathlib import Path

#: The modules the forkserver imports before forking ranks.
PRELOAD = ["torch", "torch.distributed", "torch._dynamo", "modelpar", "transformers",
           "rank_preload"]

_context: multiprocessing.context.BaseContext | None = None


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _forkserver() -> multiprocessing.context.BaseContext:
    """The warm forkserver context, started on first use (Note [Ranks forked
    from a warm process])."""
    global _context
    if _context is None:
        ctx = multiprocessing.get_context("forkserver")
        ctx.set_forkserver_preload(PRELOAD)
        saved = os.environ.get("OMP_NUM_THREADS")
        os.environ["OMP_NUM_THREADS"] = "1"  # the server and so every rank load libgomp with it
        try:
            from multiprocessing import forkserver
            forkserver.ensure_running()
        finally:
            if saved is None:
                del os.environ["OMP_NUM_THREADS"]
            else:
                os.environ["OMP_NUM_THREADS"] = saved
        _context = ctx
    return _context


def _run_rank(script: str, argv: list[str], env: dict[str, str], output: str) -> None:
    """In the forked rank: the caller's environment and argv, output to a file,
    then the worker script as `python script argv...` runs it."""
    os.environ.clear()
    os.environ.update(env)
    fd = os.open(output, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    os.dup2(fd, 1)
    os.dup2(fd, 2)
    os.close(fd)
    sys.argv = [script, *argv]
    try:
        runpy.run_path(script, run_name="__main__")
    finally:
        sys.stdout.flush()
        sys.stderr.flush()


class _Forked:
    """A forked rank with Popen's part the tests use."""

    def __init__(self, ctx, script: Path, argv: list[str], env: dict[str, str]) -> None:
        fd, self._output = tempfile.mkstemp(prefix="modelpar-rank-", suffix=".txt")
        os.close(fd)
        self._proc = ctx.Process(target=_run_rank, args=(str(script), argv, env, self._output))
        self._proc.start()
        self.pid = self._proc.pid

    def communicate(self, timeout: float) -> tuple[str, None]:
        self._proc.join(timeout)
        if self._proc.exitcode is None:
            raise subprocess.TimeoutExpired("rank", timeout)
        return self._read(), None

    def _read(self) -> str:
        try:
            return Path(self._output).read_text(errors="replace")
        finally:
            os.unlink(self._output)

    @property
    def returncode(self) -> int | None:
        return self._proc.exitcode

    def poll(self) -> int | None:
        return self._proc.exitcode

    def kill(self) -> None:
        self._proc.kill()

    def wait(self, timeout: float) -> None:
        self._proc.join(timeout)


def start_ranks(world: int, script: Path, argv: list[str], env: dict[str, str]) -> list:
    """`world` ranks of `script` with `argv`, rank r with `env` plus RANK=r,
    WORLD_SIZE and LOCAL_RANK; each has communicate(timeout) -> (output,
    None), returncode, poll(), kill(), wait(timeout), as Popen."""
    spawn = os.environ.get("MODELPAR_TEST_SPAWN_RANKS") == "1"
    ctx = None if spawn else _forkserver()
    procs = []
    for rank in range(world):
        rank_env = {**env, "RANK": str(rank), "WORLD_SIZE": str(world), "LOCAL_RANK": str(rank),
                    "OMP_NUM_THREADS": "1",
                    "PYTHONPATH": os.pathsep.join(p for p in sys.path if p)}
        if spawn:
            procs.append(subprocess.Popen([sys.executable, str(script), *argv], env=rank_env,
                                          stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                                          text=True))
        else:
            procs.append(_Forked(ctx, script, argv, rank_env))
    return procs
