"""What modelpar reads that others could have written (issue 36): rank 0's
broadcast is JSON, never a pickle (distributed/first_rank.py, Note [JSON
between ranks]); the profile cache directory is made 0700 and refused when
it is a symlink or another user's, and its files are written through a
unique temporary file (profiles/cache.py, Note [A cache directory only we
write])."""

from __future__ import annotations

import os
import pickle
import stat

import pytest
import torch

import modelpar
from modelpar.distributed.first_rank import from_first_rank
from modelpar.profiles.cache import cache_dir, write_profile


@pytest.fixture
def one_rank():
    import torch.distributed as dist
    dist.init_process_group("gloo", store=dist.HashStore(), rank=0, world_size=1)
    try:
        yield dist.group.WORLD
    finally:
        dist.destroy_process_group()


def test_rank_0s_value_comes_back_as_sent_through_json(one_rank) -> None:
    # step_search broadcasts a tuple holding a dict keyed by micro-batch counts.
    value = ([1.5, -1.0], 3.25, {1: 0.5, 4: 2.0}, None, "x", True)
    got = from_first_rank(lambda: value, one_rank, "the step's node times", 5.0)
    assert got == value and isinstance(got, tuple) and list(got[2]) == [1, 4]


def test_a_value_json_cannot_carry_is_a_config_error(one_rank) -> None:
    with pytest.raises(modelpar.ConfigError,
                       match=r"the node times holds a set, which cannot be sent between ranks "
                             r"\(they exchange JSON"):
        from_first_rank(lambda: {"times": {1.0, 2.0}}, one_rank, "the node times", 5.0)


def test_a_pickle_from_a_peer_is_refused_not_run(monkeypatch, tmp_path) -> None:
    # What a peer sends is decoded as JSON: a pickle that would run code on
    # load is an ExecutionError naming rank 0, and nothing runs.
    from modelpar.distributed import first_rank
    marker = tmp_path / "ran"
    evil = pickle.dumps(_Evil(str(marker)))
    decode = getattr(first_rank, "_received", None)
    assert decode is not None, "rank 0's bytes are still unpickled (issue 36)"
    with pytest.raises(modelpar.ExecutionError,
                       match="what rank 0 sent for the machine profile is not modelpar's JSON"):
        decode(evil, "the machine profile")
    assert not marker.exists()


class _Evil:
    def __init__(self, path: str) -> None:
        self.path = path

    def __reduce__(self):
        return (open, (self.path, "w"))


def test_the_cache_directory_is_made_private(monkeypatch, tmp_path) -> None:
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))
    path = cache_dir()
    assert path == tmp_path / "xdg" / "modelpar"
    assert stat.S_IMODE(os.stat(path).st_mode) == 0o700


def test_a_symlinked_cache_directory_is_refused(monkeypatch, tmp_path) -> None:
    planted = tmp_path / "planted"
    planted.mkdir()
    (tmp_path / "xdg").mkdir()
    (tmp_path / "xdg" / "modelpar").symlink_to(planted)
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))
    with pytest.raises(modelpar.ConfigError,
                       match=r"the cache directory .*modelpar is a symlink .*does not follow it"):
        cache_dir()


def test_a_cache_directory_of_another_user_is_refused(monkeypatch, tmp_path) -> None:
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    cache_dir()
    me = os.getuid()
    monkeypatch.setattr(os, "getuid", lambda: me + 1)  # as if another user made it
    with pytest.raises(modelpar.ConfigError, match=r"is owned by user id \d+, not by you"):
        cache_dir()


def test_profiles_are_written_through_a_unique_temporary_file(tmp_path) -> None:
    # Another container sharing the home, whose process has our PID, is
    # writing the same profile: its PID-named temporary file is in the way.
    target = tmp_path / "cpu-x.json"
    (tmp_path / f"cpu-x.{os.getpid()}.tmp").mkdir()
    write_profile(target, '{"a": 1}')
    assert target.read_text() == '{"a": 1}'
    assert sorted(p.name for p in tmp_path.iterdir()) == [f"cpu-x.{os.getpid()}.tmp", "cpu-x.json"]
