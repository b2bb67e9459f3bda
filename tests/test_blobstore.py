"""BlobStore and Blob: owned files, digests, adoption, release, stale collection."""

from __future__ import annotations

import gc
import os
import signal
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
import xxhash

from trtet_store import BlobStore
from trtet_store.io.digests import chunk_digest


def files(directory: Path) -> list[str]:
    return sorted(p.name for p in directory.iterdir())


def test_put_records_size_digest_and_chunk_digests(here_fs):
    data = os.urandom(300_001)
    with BlobStore(here_fs, chunk_size=65536) as store:
        blob = store.put(data)
        assert blob.size == len(data) == len(blob)
        assert Path(blob.path).read_bytes() == data
        assert blob.digest == xxhash.xxh3_128_hexdigest(data)
        assert blob.chunk_digests == tuple(
            chunk_digest(data[i:i + 65536]) for i in range(0, len(data), 65536))
        assert store.find(blob.path) is blob


def test_writer_streams_and_a_failed_writer_leaves_no_file(here_fs):
    with BlobStore(here_fs, chunk_size=4096) as store:
        with store.writer() as w:
            for i in range(10):
                w.write(bytes([i]) * 1000)
        assert w.blob.size == 10_000
        assert w.blob.chunk_digests[0] == chunk_digest(Path(w.blob.path).read_bytes()[:4096])
        before = files(here_fs)
        with pytest.raises(RuntimeError), store.writer() as w2:
            w2.write(b"partial")
            raise RuntimeError("builder failed")
        assert w2.blob is None
        assert files(here_fs) == before


def test_blob_is_released_by_close_context_gc_and_store_close(here_fs):
    store = BlobStore(here_fs)
    a, b, c, d = (store.put(b"x" * n) for n in (1, 2, 3, 4))
    paths = [Path(x.path) for x in (a, b, c, d)]
    a.close()
    assert not paths[0].exists() and a.closed
    with b:
        pass
    assert not paths[1].exists()
    del c
    gc.collect()
    assert not paths[2].exists()
    store.close()
    assert not paths[3].exists() and d.closed
    assert files(here_fs) == []
    with pytest.raises(ValueError, match="closed"):
        store.put(b"late")


def test_blobs_are_released_at_interpreter_exit(here_fs):
    script = textwrap.dedent(f"""
        from trtet_store import BlobStore
        store = BlobStore({os.fspath(here_fs)!r})
        blob = store.put(b"kept until exit")
        print(blob.path)
    """)
    out = subprocess.run([sys.executable, "-c", script], check=True, capture_output=True,
                         text=True)
    assert not Path(out.stdout.strip()).exists()
    assert files(here_fs) == []


def test_adopt_renames_on_the_same_filesystem(here_fs):
    src = here_fs / "engine.bin"
    src.write_bytes(b"e" * 5000)
    with BlobStore(here_fs / "store") as store:
        blob = store.adopt(src)
        assert not src.exists()
        assert Path(blob.path).parent == here_fs / "store"
        assert blob.digest == xxhash.xxh3_128_hexdigest(b"e" * 5000)


def test_adopt_copies_across_filesystems_and_leaves_the_original(make_fs, here_fs):
    other = make_fs("tmpfs", 16)
    src = here_fs / "engine.bin"
    src.write_bytes(b"f" * 70_000)
    with BlobStore(other) as store:
        blob = store.adopt(src)
        assert src.read_bytes() == b"f" * 70_000
        assert Path(blob.path).read_bytes() == b"f" * 70_000
        assert blob.size == 70_000


def test_adopt_refuses_what_is_not_a_regular_file(here_fs):
    with BlobStore(here_fs / "s") as store, pytest.raises(ValueError, match="regular file"):
        store.adopt(here_fs)


def test_a_dead_stores_blobs_are_kept_as_orphans_until_removed(here_fs):
    """Issue 12 item 3: a dead store's blobs may be hours of build; the next store keeps them."""
    script = textwrap.dedent(f"""
        import os, signal
        from trtet_store import BlobStore
        store = BlobStore({os.fspath(here_fs)!r})
        blobs = [store.put(b"orphan" * 1000) for _ in range(3)]
        print(store.token, flush=True)
        os.kill(os.getpid(), signal.SIGKILL)
    """)
    proc = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True)
    assert proc.returncode == -signal.SIGKILL
    token = proc.stdout.strip()
    left = [n for n in files(here_fs) if token in n]
    assert len(left) == 7  # three blobs, their sidecars and the lock file survive a SIGKILL
    blobs = sorted(n for n in left if n.endswith(".blob"))
    with BlobStore(here_fs) as store:
        assert store.collected == []
        assert sorted(o.path.name for o in store.orphans()) == blobs
        assert sorted(p.name for p in store.remove_orphans()) == blobs
    assert files(here_fs) == []


def test_a_live_stores_files_are_never_collected(here_fs):
    with BlobStore(here_fs) as first:
        blob = first.put(b"alive")
        with BlobStore(here_fs) as second:
            assert second.collected == []
        assert Path(blob.path).read_bytes() == b"alive"


def test_files_pinned_by_a_journal_survive_collection(here_fs):
    """A dead writer's journal still needs its sources: they must not be collected."""
    out = here_fs / "out"
    out.mkdir()
    script = textwrap.dedent(f"""
        import os, signal
        from trtet_store import BlobStore, write_file
        from trtet_store.io import fs
        store = BlobStore({os.fspath(here_fs / "s")!r}, chunk_size=65536)
        blob = store.put(os.urandom(1 << 20))
        print(blob.path, blob.digest, flush=True)
        real = fs.calls.ftruncate
        def die_after_first_truncate(fd, length):
            real(fd, length)
            os.kill(os.getpid(), signal.SIGKILL)
        fs.calls.ftruncate = lambda fd, n: (die_after_first_truncate(fd, n)
                                            if os.fstat(fd).st_size > n else real(fd, n))
        write_file({os.fspath(out / "m.pte")!r}, [b"h", blob], consume=True, chunk_size=65536)
    """)
    proc = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True)
    assert proc.returncode == -signal.SIGKILL, proc.stderr
    path, digest = proc.stdout.split()
    assert os.path.getsize(path) < 1 << 20  # the move had started
    with BlobStore(here_fs / "s") as store:
        assert store.collected == []
        assert Path(path).exists()
    from trtet_store import recover

    outcomes = recover(out)
    assert [o.action for o in outcomes if o.action != "removed stray"] == ["rolled forward"]
    assert {Path(o.journal).name for o in outcomes if o.action == "removed stray"} <= {
        ".m.pte.trtet-lock"}
    content = (out / "m.pte").read_bytes()
    assert xxhash.xxh3_128_hexdigest(content[1:]) == digest
    assert not Path(path).exists()
    assert files(out) == ["m.pte"]


def test_a_kept_blob_outlives_its_store_as_an_orphan(here_fs):
    """Blob.keep: what a failed export does with engines it built (issue 22)."""
    with BlobStore(here_fs) as store:
        kept = store.put(b"engine" * 1000)
        dropped = store.put(b"scratch" * 1000)
        kept.keep()
        assert kept.closed and not dropped.closed
        kept_path = Path(kept.path)
    assert kept_path.read_bytes() == b"engine" * 1000
    assert not Path(dropped.path).exists()
    with BlobStore(here_fs) as store:
        (orphan,) = store.orphans()
        assert orphan.path.name == kept_path.name
        blob = store.adopt_orphan(orphan)
        assert Path(blob.path).read_bytes() == b"engine" * 1000
