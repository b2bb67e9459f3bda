"""The read-back rule's refusals that no test set up (a gap audit): a socket, and the message.

A Unix socket planted (by uid 65534, in a 1777 directory) where a file we read back
goes: ``open`` of a socket fails with ENXIO, which the rule turns into a one-line
"not ours" refusal (never a raw OSError a caller may not expect); a journal name
holding one is reported by ``recover`` and never blocks a write. And a refusal's
``str`` is its one line, without errno's ``[Errno 1]``.
"""

from __future__ import annotations

import os
import socket
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest
from attacker import NOBODY, as_nobody, shared_dir
from test_journal_plants import PROGRAM, T1, state

from trtet_store import recover, write_file
from trtet_store.io import NotOursError, open_ours, read_ours
from trtet_store.io.names import journal_path


@pytest.fixture
def top() -> Iterator[Path]:
    path = Path(tempfile.mkdtemp(prefix="gaps-owned-", dir="/tmp"))
    os.chmod(path, 0o755)
    yield path
    import shutil

    shutil.rmtree(path)


def plant_socket(path: Path) -> None:
    """A bound Unix socket at ``path``, made by uid 65534 (left bound after the child exits)."""
    def make() -> None:
        s = socket.socket(socket.AF_UNIX)
        s.bind(os.fspath(path))
        s.close()
    as_nobody(make)
    assert os.lstat(path).st_uid == NOBODY


def test_a_socket_is_not_ours_in_one_line(top: Path) -> None:
    """owned.py open_ours: ``if exc.errno == errno.ENXIO`` (a socket cannot be opened; the
    refusal is NotOursError, not the open's raw error)."""
    shared = shared_dir(top)
    plant_socket(shared / "j")
    for read in (lambda: read_ours(shared / "j", limit=1 << 20, what="write journal"),
                 lambda: open_ours(shared / "j", what="write journal").__enter__()):
        with pytest.raises(NotOursError) as caught:
            read()
        said = str(caught.value)
        assert said == f"write journal {shared / 'j'} is not ours: not a regular file; " \
            "left alone", said
        assert caught.value.errno == 1 and caught.value.reason == "not a regular file"


def test_a_socket_at_a_journal_name_is_reported_and_never_blocks_a_write(top: Path) -> None:
    """The same refusal through recovery: a socket planted at the destination's journal name
    is said as not ours, left alone, and the write goes ahead."""
    shared = shared_dir(top)
    dest = shared / "model.pte"
    path = journal_path(dest, T1)
    plant_socket(path)
    before = state(shared)
    outcomes = recover(shared)
    assert [(o.journal, o.action, o.detail) for o in outcomes] == [
        (path, "not ours", "not a regular file; left alone")], outcomes
    assert state(shared) == before
    write_file(dest, [PROGRAM])
    assert dest.read_bytes() == PROGRAM
    assert os.lstat(path).st_uid == NOBODY


def test_a_refusal_reads_as_its_one_line(top: Path) -> None:
    """owned.py NotOursError.__str__: the message alone (OSError's str would prefix
    ``[Errno 1]`` and repeat the path)."""
    shared = shared_dir(top)

    def write() -> None:
        (shared / "j").write_bytes(b"x")
    as_nobody(write)
    with pytest.raises(NotOursError) as caught:
        read_ours(shared / "j", limit=10)
    assert str(caught.value) == (f"file {shared / 'j'} is not ours: owned by uid {NOBODY}, "
                                 f"not by uid {os.geteuid()}; left alone")


def test_a_root_owned_file_is_not_ours_for_another_user_unless_root_is_allowed(top):
    """owned.py ours_problem: root's file is ours only to root, or where ``allow_root`` says
    an administrator's file is trusted (key and config files). Final audit V6: accepting
    uid 0 for every reader passed every test, all of which read as root."""
    d = shared_dir(top)
    roots = d / "roots.json"
    roots.write_bytes(b'{"root": "wrote this"}')
    os.chmod(roots, 0o644)
    assert roots.stat().st_uid == 0

    def read_as_nobody() -> None:
        with pytest.raises(NotOursError, match="owned by uid 0, not by uid 65534"):
            read_ours(roots, limit=4096, what="record")
        assert read_ours(roots, limit=4096, allow_root=True, what="key file") == \
            b'{"root": "wrote this"}'

    as_nobody(read_as_nobody)
    assert roots.read_bytes() == b'{"root": "wrote this"}' and roots.stat().st_uid == 0
