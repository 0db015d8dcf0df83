"""Starts N copies of a program as the ranks of one group on this machine, the
way torchrun would (RANK, WORLD_SIZE, LOCAL_RANK, MASTER_ADDR, MASTER_PORT),
on a free port, and waits for them under a time limit: when one rank fails,
the others are killed at once instead of waiting out their peer timeouts.
Each rank's output is printed afterwards, prefixed with its rank.

    python launch_ranks.py --nproc 2 [--timeout 25] [--extra 1='--steps 0']
        [--expect-fail TEXT] -- PROGRAM ARGS...

Exit status: 0 when every rank exits 0 (with --expect-fail: when some rank
fails and some rank's output contains TEXT, within the time limit), 124 on
the time limit, else 1. Standard library only (ctest runs it for
examples/rank_train.cpp).
"""
from __future__ import annotations

import argparse
import os
import shlex
import signal
import socket
import subprocess
import sys
import tempfile
import time


def free_port() -> int:
    """A port nobody listens on now; rank 0's store binds it right after
    (another process taking it in between makes the run fail; main retries)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def kill(p: subprocess.Popen) -> None:
    """Ends p's whole process group: SIGTERM, then SIGKILL after 2 s."""
    if p.poll() is not None:
        return
    try:
        os.killpg(p.pid, signal.SIGTERM)
        p.wait(timeout=2)
    except subprocess.TimeoutExpired:
        os.killpg(p.pid, signal.SIGKILL)
        p.wait()
    except ProcessLookupError:
        pass


def launch(cmd: list[str], nproc: int, timeout: float, extra: dict[int, list[str]],
           logdir: str) -> tuple[list[int | None], list[str], bool]:
    """Runs the ranks; returns their exit codes (None: killed by us), their
    output, and whether the time limit ran out."""
    port = free_port()
    procs, logs = [], []
    for r in range(nproc):
        env = dict(os.environ, RANK=str(r), LOCAL_RANK=str(r), WORLD_SIZE=str(nproc),
                   MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
        # N ranks share the cores: one intra-op thread each, as torchrun sets.
        env.setdefault("OMP_NUM_THREADS", "1")
        log = open(os.path.join(logdir, f"rank{r}.log"), "w+")
        logs.append(log)
        procs.append(subprocess.Popen(cmd + extra.get(r, []), env=env, stdout=log,
                                      stderr=subprocess.STDOUT, start_new_session=True))
    deadline = time.monotonic() + timeout
    codes: list[int | None] = [None] * nproc
    timed_out = False
    try:
        while any(c is None for c in codes):
            for r, p in enumerate(procs):
                if codes[r] is None and p.poll() is not None:
                    codes[r] = p.returncode
            if any(c not in (None, 0) for c in codes):
                break  # a rank failed: the others would only wait for it
            if time.monotonic() > deadline:
                timed_out = True
                break
            time.sleep(0.05)
    finally:
        for p in procs:
            kill(p)
    out = []
    for log in logs:
        log.seek(0)
        out.append(log.read())
        log.close()
    return codes, out, timed_out


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--nproc", type=int, required=True)
    ap.add_argument("--timeout", type=float, default=25.0, help="seconds for the whole run")
    ap.add_argument("--extra", action="append", default=[], metavar="R=ARGS",
                    help="arguments added for rank R only")
    ap.add_argument("--expect-fail", metavar="TEXT",
                    help="pass when a rank fails with TEXT in some rank's output")
    ap.add_argument("cmd", nargs=argparse.REMAINDER)
    a = ap.parse_args()
    cmd = a.cmd[1:] if a.cmd[:1] == ["--"] else a.cmd
    if not cmd or a.nproc < 1:
        ap.error("give --nproc >= 1 and a program after --")
    extra = {}
    for e in a.extra:
        r, _, args = e.partition("=")
        extra[int(r)] = shlex.split(args)
    start = time.monotonic()
    with tempfile.TemporaryDirectory() as logdir:
        for attempt in range(3):
            codes, out, timed_out = launch(cmd, a.nproc, a.timeout - (time.monotonic() - start),
                                           extra, logdir)
            # Another process took the free port before rank 0 bound it: retry.
            if not timed_out and "address already in use" in out[0].lower() and attempt < 2:
                continue
            break
    for r, text in enumerate(out):
        for line in text.splitlines():
            print(f"[rank {r}] {line}")
    shown = ", ".join(f"rank {r}: {'killed' if c is None else f'exit {c}'}" for r, c in enumerate(codes))
    print(f"launch_ranks: {shown} after {time.monotonic() - start:.1f} s")
    if timed_out:
        print(f"launch_ranks: the ranks did not finish within {a.timeout} s")
        return 124
    failed = any(c not in (None, 0) for c in codes)
    if a.expect_fail is not None:
        if failed and any(a.expect_fail in text for text in out):
            print(f"launch_ranks: failed as expected ({a.expect_fail!r})")
            return 0
        print(f"launch_ranks: expected a rank to fail with {a.expect_fail!r}")
        return 1
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
