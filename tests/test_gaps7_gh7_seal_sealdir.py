"""io.SealedDir (trtet_store/io/sealdir.py): what a seal is, who may have written it, and
what ``sealed``, ``read_seal``, ``write_seal`` and ``remove`` do with it.

A seal, ``<root>/.trtet-seals/<name>``, is read back to decide that a file
need not be read again: so it is written read-only, it is believed only when
it is ours, small and names this file's digest (``sealed_identity``), the file
it vouches for is looked at with one ``lstat`` (a link at the file's name is
never the sealed file), and ``remove`` takes both away.
"""

from __future__ import annotations

import json
import logging
import os
import stat
from pathlib import Path

import pytest
import xxhash
from proclocks import until_waiting

from trtet_store.io import SealedDir, VerificationError
from trtet_store.io.sealdir import SEALS_DIR

CHUNK = 4096
#: A seal is a small JSON object: 64 KiB at most (SEAL_CAP), a bigger one unread.
SEAL_CAP = 64 * 1024


def _store(tmp_path: Path, data: bytes = b"S" * (CHUNK + 7)) -> tuple[SealedDir, str]:
    d = SealedDir(tmp_path / "store", todo="remove it")
    name = xxhash.xxh3_128(data).hexdigest()
    d.path(name).write_bytes(data)
    d.seal(name)
    assert d.sealed(name)
    return d, name


def test_a_seal_is_written_read_only_and_names_its_file(tmp_path: Path) -> None:
    d, name = _store(tmp_path)
    st = os.lstat(d.seal_path(name))
    assert stat.S_IMODE(st.st_mode) == 0o444  # never written in place
    assert stat.S_IMODE(os.lstat(d.root / SEALS_DIR).st_mode) == 0o700
    doc = json.loads(d.seal_path(name).read_bytes())
    assert doc["xxh3"] == name and doc["size"] == CHUNK + 7
    assert d.sealed_identity(name) == doc["identity"]


def test_a_seal_of_another_user_is_ignored_and_said(tmp_path: Path, caplog) -> None:
    d, name = _store(tmp_path)
    os.chown(d.seal_path(name), 65534, 65534)  # its identity still the file's own
    with caplog.at_level(logging.WARNING, logger="trtet_store.sets"):
        assert d.read_seal(name) is None
        assert d.sealed_identity(name) is None
        assert not d.sealed(name)
    said = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    assert said and all("is not ours: owned by uid 65534" in m for m in said), said
    assert "store seal" in said[0] and os.fspath(d.seal_path(name)) in said[0]


def test_a_seal_over_its_size_cap_is_not_believed(tmp_path: Path, caplog) -> None:
    d, name = _store(tmp_path)
    doc = json.loads(d.seal_path(name).read_bytes())
    body = json.dumps(doc).encode()
    padded = body + b" " * (SEAL_CAP + 1 - len(body))  # still the same JSON
    assert len(padded) == SEAL_CAP + 1 and json.loads(padded) == doc
    os.chmod(d.seal_path(name), 0o644)
    d.seal_path(name).write_bytes(padded)
    with caplog.at_level(logging.WARNING, logger="trtet_store.sets"):
        assert d.read_seal(name) is None and not d.sealed(name)
    assert any(f"{SEAL_CAP + 1} bytes, over the {SEAL_CAP}" in r.getMessage()
               for r in caplog.records)
    d.seal_path(name).write_bytes(body + b" " * (SEAL_CAP - len(body)))  # at the cap
    assert d.read_seal(name) == doc and d.sealed(name)


def test_a_link_at_the_files_name_is_never_the_sealed_file(tmp_path: Path) -> None:
    d, name = _store(tmp_path)
    elsewhere = tmp_path / "elsewhere"
    os.rename(d.path(name), elsewhere)
    os.symlink(elsewhere, d.path(name))
    # A seal recording the identity of the link's target, as a seal taken through the
    # link would: the name is a link, so it vouches for nothing.
    d.write_seal(name, os.stat(elsewhere))
    assert d.sealed_identity(name) is not None
    assert not d.sealed(name)
    assert not SealedDir.matches(d.sealed_identity(name), os.lstat(d.path(name)))
    assert SealedDir.matches(d.sealed_identity(name), os.stat(elsewhere))


def test_remove_takes_the_file_and_its_seal_and_unseal_only_the_seal(tmp_path: Path) -> None:
    d, name = _store(tmp_path)
    d.unseal(name)
    assert d.path(name).exists() and not d.seal_path(name).exists()
    d.seal(name)
    d.remove(name)
    assert not d.path(name).exists() and not os.path.lexists(d.seal_path(name))
    assert sorted(os.listdir(d.root / SEALS_DIR)) == []
    d.remove(name)  # neither there: nothing to do
    d.unseal(name)


def test_check_refuses_the_right_digest_under_another_size_or_other_chunks(
        tmp_path: Path) -> None:
    data = b"C" * (2 * CHUNK + 5)
    d, name = _store(tmp_path, data)
    chunks = tuple(xxhash.xxh3_64_intdigest(data[i:i + CHUNK])
                   for i in range(0, len(data), CHUNK))
    d.unseal(name)  # read at its next check
    for size, said in ((len(data) + 1, chunks), (len(data), chunks[:-1] + (chunks[-1] ^ 1,))):
        with pytest.raises(VerificationError, match="changed since it was checked"):
            d.check(name, size, CHUNK, said)  # what a set says of the blob is not its bytes
        assert not d.sealed(name) and not d.seal_path(name).exists()
    assert d.check(name, len(data), CHUNK, chunks) is False and d.sealed(name)


def test_locked_makes_a_second_holder_wait_and_leaves_no_lock_file(tmp_path: Path) -> None:
    import threading

    d, name = _store(tmp_path)
    order: list[str] = []
    inside = threading.Event()

    def second() -> None:
        inside.wait(10)
        with d.locked(name):
            order.append("second in")

    t = threading.Thread(target=second)
    t.start()
    with d.locked(name):
        assert d.seal_path(name + ".lock").exists()
        inside.set()
        until_waiting(os.getpid(), t.is_alive)  # the second holder waits on the lock
        order.append("first out")
    t.join(10)
    assert order == ["first out", "second in"]
    assert not os.path.lexists(d.seal_path(name + ".lock"))  # its holder removed it
    assert sorted(os.listdir(d.root / SEALS_DIR)) == [name]


def test_sealed_is_false_for_a_missing_file_and_digest_reads_the_whole_file(
        tmp_path: Path) -> None:
    data = b"D" * (3 * 1024 * 1024 + 17)  # more than one read step
    d, name = _store(tmp_path, data)
    assert SealedDir.digest(d.path(name)) == name == xxhash.xxh3_128(data).hexdigest()
    os.unlink(d.path(name))
    assert not d.sealed(name)  # its seal stays, vouching for nothing
    assert d.seal_path(name).exists()


def test_the_directory_is_made_0700_and_a_link_or_a_shared_one_refused(tmp_path: Path) -> None:
    from trtet_store.io import UnsafeDirectoryError

    d = SealedDir(tmp_path / "new", todo="remove it")
    assert stat.S_IMODE(os.lstat(d.root).st_mode) == 0o700
    real = tmp_path / "real"
    real.mkdir(mode=0o700)
    os.symlink(real, tmp_path / "link")
    with pytest.raises(UnsafeDirectoryError, match="symbolic link.*remove the link please"):
        SealedDir(tmp_path / "link", todo="remove the link please")
    shared = tmp_path / "shared"
    shared.mkdir()
    os.chmod(shared, 0o1777)
    with pytest.raises(UnsafeDirectoryError):
        SealedDir(shared, todo="remove it")
    theirs = tmp_path / "theirs"
    theirs.mkdir(mode=0o700)
    os.chown(theirs, 65534, 65534)
    with pytest.raises(UnsafeDirectoryError):
        SealedDir(theirs, todo="remove it")
    assert os.listdir(real) == [] and os.listdir(shared) == [] and os.listdir(theirs) == []
