"""Issue 12 hardening of the blob store: forks, foreign destinations, orphans, adoption.

Every failure-path test checks that nothing was lost: the sources are
byte-identical (by digest), the destination is untouched, no temp file is left.
"""

from __future__ import annotations

import os
import signal
import stat
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest
from digests import digest, file_digest

from trtet_store import BlobStore, write_file
from trtet_store.io import blobstore


def names(directory: Path) -> list[str]:
    return sorted(p.name for p in directory.iterdir())


def no_temps(directory: Path) -> None:
    left = [n for n in names(directory) if ".trtet-" in n]
    assert left == [], left


# -- 1. fork safety ----------------------------------------------------------------


@pytest.mark.parametrize("how", ["exit", "close", "gc"])
def test_a_forked_child_never_deletes_the_parents_blobs_or_lock(here_fs, how):
    """The child exits normally (atexit and finalizers run) in a real interpreter."""
    script = textwrap.dedent(f"""
        import gc, os, sys
        from pathlib import Path
        from trtet_store import BlobStore
        d = Path({os.fspath(here_fs)!r})
        store = BlobStore(d / "s")
        blob = store.put(b"engine" * 10_000)
        (d / "user.bin").write_bytes(b"adopted" * 1000)
        adopted = store.adopt(d / "user.bin")
        before = sorted(os.listdir(d / "s"))
        pid = os.fork()
        if pid == 0:
            if {how!r} == "close":
                store.close()
            elif {how!r} == "gc":
                del blob, adopted, store
                gc.collect()
            sys.exit(0)
        _, status = os.waitpid(pid, 0)
        assert os.waitstatus_to_exitcode(status) == 0
        assert sorted(os.listdir(d / "s")) == before, (before, os.listdir(d / "s"))
        assert Path(blob.path).read_bytes() == b"engine" * 10_000
        assert Path(adopted.path).read_bytes() == b"adopted" * 1000
        with BlobStore(d / "s") as other:  # the lock is still held: no orphans
            assert other.orphans() == []
        store.close()
        print("ok")
    """)
    proc = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True)
    assert proc.returncode == 0 and proc.stdout.strip() == "ok", proc.stderr


# -- 2. a destination that is a live blob's file -----------------------------------


@pytest.mark.parametrize("which", ["other_store", "same_store_unused", "hard_link"])
def test_a_destination_that_is_another_live_blobs_file_is_refused(here_fs, which):
    a = BlobStore(here_fs / "a")
    b = BlobStore(here_fs / "b")
    victim = (a if which == "same_store_unused" else b).put(b"victim" * 5000)
    src = a.put(b"payload" * 5000)
    dest = Path(victim.path)
    if which == "hard_link":
        dest = here_fs / "link.bin"
        os.link(victim.path, dest)
    d_victim, d_src = file_digest(victim.path), file_digest(src.path)
    with pytest.raises(ValueError, match="live blob"):
        write_file(dest, [b"hdr", src], consume=True)
    assert file_digest(victim.path) == d_victim and file_digest(src.path) == d_src
    assert not src.consumed and victim.size == 30_000
    no_temps(dest.parent)
    a.close()
    b.close()


# -- 3. orphans ---------------------------------------------------------------------


def _die_with_blobs(directory: Path, script_tail: str = "") -> str:
    script = textwrap.dedent(f"""
        import os, signal
        from trtet_store import BlobStore
        store = BlobStore({os.fspath(directory)!r}, chunk_size=65536)
        a = store.put(b"engine-a" * 100_000, metadata={{"fingerprint": "fp-a", "n": 1}})
        b = store.put(b"engine-b" * 50_000)
        {script_tail}
        print(store.token, flush=True)
        os.kill(os.getpid(), signal.SIGKILL)
    """)
    proc = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True)
    assert proc.returncode == -signal.SIGKILL, proc.stderr
    return proc.stdout.strip()


def test_orphans_of_a_dead_process_are_kept_listed_adopted_and_removed_only_on_request(here_fs):
    staging = here_fs / "s"
    token = _die_with_blobs(staging)
    dead = sorted(p for p in staging.glob(f"{token}-*.blob"))
    assert len(dead) == 2
    digests = {p.name: file_digest(p) for p in dead}
    with BlobStore(staging) as store:
        assert store.collected == []
        assert all(p.exists() for p in dead)  # kept
        orphans = {o.path.name: o for o in store.orphans()}
        assert set(orphans) == set(digests)
        a = next(o for o in orphans.values() if o.metadata.get("fingerprint") == "fp-a")
        assert a.metadata == {"fingerprint": "fp-a", "n": 1}
        assert a.size == 800_000 and a.age >= 0 and not a.pinned
        assert a.pid is not None and a.pid != os.getpid()
        # take it over without copying: same inode, digests from the sidecar
        ino = a.path.stat().st_ino
        blob = store.adopt_orphan(a)
        assert os.stat(blob.path).st_ino == ino
        assert blob.metadata == {"fingerprint": "fp-a", "n": 1}
        assert blob.digest == digest(b"engine-a" * 100_000)
        assert [o.path.name for o in store.orphans()] != [a.path.name]
        # a second store does not remove the other orphan either
        with BlobStore(staging) as again:
            assert len(again.orphans()) == 1
        # removal only by an explicit call, and an age filter is honoured
        assert store.remove_orphans(older_than=3600) == []
        removed = store.remove_orphans()
        assert len(removed) == 1 and not removed[0].exists()
        assert store.orphans() == []
        left = [n for n in names(staging) if n.endswith(".meta") and token in n]
        assert left == []


def test_orphan_max_age_removes_only_old_orphans(here_fs):
    staging = here_fs / "s"
    _die_with_blobs(staging)
    old = sorted(staging.glob("*.blob"))[0]
    past = time.time() - 7200
    os.utime(old, (past, past))
    with BlobStore(staging, orphan_max_age=3600) as store:
        assert store.collected == [old]
        assert len(store.orphans()) == 1


def test_recover_reports_orphans(here_fs):
    from trtet_store import recover

    staging = here_fs / "s"
    _die_with_blobs(staging)
    outcomes = recover(staging)
    orphans = [o for o in outcomes if o.action == "orphan"]
    assert len(orphans) == 2
    assert any("fp-a" in o.detail for o in orphans)
    assert len(list(staging.glob("*.blob"))) == 2
    proc = subprocess.run([sys.executable, "-m", "trtet_store.cli", "recover", os.fspath(staging)],
                          capture_output=True, text=True)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.count("orphan") >= 2 and "fp-a" in proc.stdout
    assert len(list(staging.glob("*.blob"))) == 2


def test_a_part_file_of_a_dead_writer_is_not_an_orphan(here_fs):
    staging = here_fs / "s"
    _die_with_blobs(staging, "cm = store.writer(); w = cm.__enter__(); w.write(b'x' * 1000)")
    assert len(list(staging.glob("*.blob.part"))) == 1
    with BlobStore(staging) as store:
        assert len(store.orphans()) == 2
        assert list(staging.glob("*.blob.part")) == []


# -- 4. adopt then a failed write ------------------------------------------------------


def test_an_adopted_file_survives_a_failed_write_and_the_store_closing(here_fs):
    user = here_fs / "user"
    user.mkdir()
    src = user / "weights.bin"
    data = os.urandom(300_000)
    src.write_bytes(data)
    (here_fs / "out").mkdir()
    dest = here_fs / "out" / "m.pte"
    dest.write_bytes(b"old")
    store = BlobStore(here_fs / "s")
    blob = store.adopt(src)
    with pytest.raises(FileNotFoundError):  # the write fails: its directory is missing
        write_file(here_fs / "missing" / "m.pte", [b"h", blob], consume=True)
    store.close()
    # given back where the user put it
    assert src.read_bytes() == data
    assert dest.read_bytes() == b"old"
    assert [n for n in names(here_fs / "s") if not n.startswith(".store-")] == []


def test_an_adopted_file_is_given_back_after_a_rolled_back_write(here_fs):
    from faults import FaultInjector

    src = here_fs / "w.bin"
    data = os.urandom(2 << 20)
    src.write_bytes(data)
    dest = here_fs / "m.pte"
    dest.write_bytes(b"old")
    with BlobStore(here_fs / "s", chunk_size=65536) as store:
        blob = store.adopt(src)
        with FaultInjector(fail_at=12, mode="eio", only=frozenset({"pwrite", "fdatasync"})), \
                pytest.raises(OSError):
            write_file(dest, [b"h" * 4096, blob], consume=True, chunk_size=65536,
                       placements=["move"])
        assert file_digest(blob.path) == digest(data)
    assert src.read_bytes() == data
    assert dest.read_bytes() == b"old"
    no_temps(here_fs)


def test_a_consumed_adopted_file_is_not_given_back(here_fs):
    src = here_fs / "w.bin"
    src.write_bytes(b"w" * 100_000)
    with BlobStore(here_fs / "s") as store:
        blob = store.adopt(src)
        write_file(here_fs / "m.pte", [b"h", blob], consume=True)
    assert not src.exists()
    assert (here_fs / "m.pte").read_bytes() == b"h" + b"w" * 100_000


# -- 9. default store ------------------------------------------------------------------


def test_default_store_is_per_user_and_private(tmp_path, monkeypatch):
    monkeypatch.delenv("TRTET_STORE_DIR", raising=False)
    monkeypatch.setattr("tempfile.tempdir", os.fspath(tmp_path))
    with BlobStore() as store:
        st = os.stat(store.directory)
        assert st.st_uid == os.getuid()
        assert stat.S_IMODE(st.st_mode) == 0o700
        assert os.fspath(os.getuid()) if False else str(os.getuid()) in store.directory.name


@pytest.mark.parametrize("bad", ["other_owner", "world_writable", "symlink"])
def test_default_store_refuses_a_directory_someone_else_could_control(tmp_path, monkeypatch,
                                                                      bad):
    monkeypatch.delenv("TRTET_STORE_DIR", raising=False)
    monkeypatch.setattr("tempfile.tempdir", os.fspath(tmp_path))
    path = blobstore.default_directory()
    if bad == "symlink":
        target = tmp_path / "elsewhere"
        target.mkdir(mode=0o700)
        path.symlink_to(target)
    else:
        path.mkdir(mode=0o700)
        if bad == "other_owner":
            os.chown(path, 12345, 12345)
        else:
            os.chmod(path, 0o777)
    with pytest.raises(PermissionError, match=os.fspath(path)):
        BlobStore()


def test_adopting_a_live_blobs_file_is_refused(here_fs):
    with BlobStore(here_fs / "a") as a, BlobStore(here_fs / "b") as b:
        blob = a.put(b"mine" * 1000)
        with pytest.raises(ValueError, match="already a live blob"):
            b.adopt(blob.path)
        assert Path(blob.path).read_bytes() == b"mine" * 1000
        assert b.blobs() == []


@pytest.mark.parametrize("obstacle", ["name_taken", "directory_gone"])
def test_an_adopted_file_that_cannot_go_back_is_kept(here_fs, obstacle):
    user = here_fs / "user"
    user.mkdir()
    src = user / "w.bin"
    data = os.urandom(100_000)
    src.write_bytes(data)
    store = BlobStore(here_fs / "s")
    blob = store.adopt(src)
    if obstacle == "name_taken":
        src.write_bytes(b"the user's new file")
    else:
        user.rmdir()
    store.close()
    kept = [p for p in (here_fs / "s").glob("*.blob")]
    assert len(kept) == 1 and file_digest(kept[0]) == digest(data), blob
    if obstacle == "name_taken":
        assert src.read_bytes() == b"the user's new file"
