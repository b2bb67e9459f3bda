"""The one rule for files we read back (io/owned.py), on its own.

Each caller (journals, set records, seals, references, config and key files)
has its own tests through the API; these pin the rule itself: a link, a FIFO,
a directory, another user's file (a real uid 65534 in a 1777 directory) and an
oversized file are refused in one line without a byte read, and a file of ours
is read from the very descriptor that was checked.
"""

from __future__ import annotations

import os
import threading
from pathlib import Path

import pytest
from attacker import NOBODY, as_nobody, shared_dir

from trtet_store.io import NotOursError, open_ours, ours_problem, read_ours


@pytest.fixture
def shared(make_fs) -> Path:
    return shared_dir(make_fs("tmpfs", 16))


def test_our_own_file_is_read_whole(shared: Path):
    (shared / "j").write_bytes(b"plan\n" * 10)
    assert read_ours(shared / "j", limit=50) == b"plan\n" * 10


def test_another_users_file_is_not_ours(shared: Path):
    def plant() -> None:
        (shared / "j").write_bytes(b"{}\n")
        os.chmod(shared / "j", 0o666)

    as_nobody(plant)
    with pytest.raises(NotOursError) as err:
        read_ours(shared / "j", limit=1024, what="write journal")
    assert str(err.value) == (f"write journal {shared / 'j'} is not ours: owned by uid "
                              f"{NOBODY}, not by uid 0; left alone")


def test_root_may_be_allowed_but_never_another_user(shared: Path):
    (shared / "key").write_bytes(b"k")
    os.chown(shared / "key", 0, 0)
    assert read_ours(shared / "key", limit=10, allow_root=True) == b"k"
    os.chown(shared / "key", NOBODY, NOBODY)
    with pytest.raises(NotOursError, match="owned by uid 65534"):
        read_ours(shared / "key", limit=10, allow_root=True)


def test_a_link_is_refused_not_followed(shared: Path):
    secret = shared.parent / "secret"
    secret.write_bytes(b"root only")
    os.chmod(secret, 0o600)
    as_nobody(lambda: os.symlink(secret, shared / "j"))
    with pytest.raises(NotOursError, match="a symbolic link; left alone"):
        read_ours(shared / "j", limit=1024)


def test_a_fifo_neither_hangs_nor_is_read(shared: Path):
    as_nobody(lambda: os.mkfifo(shared / "j", 0o666))
    result: list[BaseException] = []

    def reader() -> None:
        try:
            read_ours(shared / "j", limit=1024)
        except BaseException as exc:  # noqa: BLE001 - handed to the test's thread
            result.append(exc)

    t = threading.Thread(target=reader, daemon=True)
    t.start()
    t.join(60)  # a hang guard far above the expected microseconds
    assert not t.is_alive(), "reading a FIFO hung"
    assert isinstance(result[0], NotOursError)
    assert "a FIFO, not a regular file" in str(result[0])


def test_a_directory_is_refused(shared: Path):
    (shared / "d").mkdir()
    with pytest.raises(NotOursError, match="a directory, not a regular file"):
        read_ours(shared / "d", limit=10)


def test_an_oversized_file_is_refused_before_a_byte_is_read(shared: Path):
    big = shared / "j"
    with open(big, "wb") as f:
        f.truncate(1 << 30)  # sparse: a GiB that costs nothing to plant
    with pytest.raises(NotOursError, match=r"1073741824 bytes, over the 1048576"):
        read_ours(big, limit=1 << 20)


def test_the_checked_descriptor_is_the_one_read(shared: Path):
    # The name is swapped for another user's file after the open: what is read
    # is still the file that was checked.
    (shared / "j").write_bytes(b"ours")
    with open_ours(shared / "j", limit=10) as fd:
        os.rename(shared / "j", shared / "j.old")
        (shared / "j").write_bytes(b"theirs")
        assert os.pread(fd, 10, 0) == b"ours"
        assert ours_problem(os.fstat(fd), limit=10) is None


def test_open_by_directory_handle(shared: Path):
    (shared / "j").write_bytes(b"x")
    dfd = os.open(shared, os.O_RDONLY | os.O_DIRECTORY)
    try:
        assert read_ours("j", dir_fd=dfd, limit=1) == b"x"
        with pytest.raises(FileNotFoundError):
            read_ours("missing", dir_fd=dfd, limit=1)
    finally:
        os.close(dfd)


def test_a_file_that_grows_after_its_check_is_read_no_further_than_the_cap(shared: Path):
    # The size is checked on fstat; a writer can still append before the read.
    # The read stops at the cap + 1 byte and refuses: never a byte more.
    from trtet_store.io import read_fd_capped

    (shared / "j").write_bytes(b"x" * 10)
    with open_ours(shared / "j", limit=10) as fd:
        with open(shared / "j", "ab") as f:
            f.write(b"y")  # now 11 bytes: one over the cap
        with pytest.raises(NotOursError, match="grew past the 10 bytes"):
            read_fd_capped(fd, 10, shared / "j")
    assert read_ours(shared / "j", limit=11) == b"x" * 10 + b"y"
