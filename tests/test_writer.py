"""The write transaction on real filesystems: fit, placement choice, faults, atomicity."""

from __future__ import annotations

import errno
import itertools
import os
from pathlib import Path

import pytest
import xxhash
from digests import file_digest
from faults import FaultInjector, count_calls

from trtet_store import BlobStore, ExternalFile, InsufficientSpaceError, write_file, write_files
from trtet_store.bench.measure import PeakDiskMonitor
from trtet_store.io import fs
from trtet_store.io.units import MiB


def snapshot(directory: Path) -> dict[str, str]:
    """Every file in ``directory`` (hidden ones too) with a digest of its content."""
    return {p.name: file_digest(p) for p in sorted(directory.iterdir()) if p.is_file()}


def random_blob(store: BlobStore, size: int, seed: int):
    """A blob of reproducible pseudo-random bytes, written in pieces."""
    with store.writer() as w:
        x = xxhash.xxh3_128(seed=seed)
        left = size
        while left:
            n = min(left, 4 * MiB)
            x.update(b"%d" % left)
            w.write((x.digest() * (n // 16 + 1))[:n])
            left -= n
    return w.blob


def expected_bytes(pieces) -> bytes:
    out = bytearray()
    for p in pieces:
        out += p if isinstance(p, (bytes, bytearray)) else Path(p.path).read_bytes()
    return bytes(out)


# -- issue 2: a move fits where a copy cannot -----------------------------------

def test_move_fits_where_copy_cannot(make_fs):
    mnt = make_fs("ext4", 320)
    store = BlobStore(mnt / "staging")
    blob = random_blob(store, 256 * MiB, seed=1)
    blob_digest = blob.digest
    out = mnt / "model.pte"
    # A header that is not a whole block rules out insert: this test is about the move.
    header, trailer = b"H" * 4000, b"T" * 100
    chunk = 8 * MiB
    want = xxhash.xxh3_128(header + Path(blob.path).read_bytes() + trailer).hexdigest()
    with PeakDiskMonitor(mnt) as mon:
        report = write_file(out, [header, blob, trailer], consume=True, chunk_size=chunk,
                            progress=lambda done, total: mon.sample())
    assert file_digest(out) == want
    assert not Path(blob.path).exists() and blob.consumed
    assert [p.placement for p in report.placements] == ["move"]
    assert mon.peak_extra_bytes <= chunk + MiB, mon.peak_extra_bytes
    assert blob_digest  # recorded before the move; the output holds those bytes
    assert sorted(p.name for p in mnt.iterdir()) == ["lost+found", "model.pte", "staging"]
    store.close()


def test_copy_that_cannot_fit_fails_before_creating_anything(make_fs):
    mnt = make_fs("ext4", 320)
    store = BlobStore(mnt / "staging")
    blob = random_blob(store, 256 * MiB, seed=2)
    before = snapshot(mnt / "staging")
    free = fs.free_bytes(mnt)
    with pytest.raises(InsufficientSpaceError) as info:
        write_file(mnt / "model.pte", [b"H" * 4096, blob], consume=False)
    err = info.value
    assert err.errno == errno.ENOSPC and isinstance(err, OSError)
    assert err.needed > err.available and err.available <= free
    assert err.path == os.fspath(mnt / "model.pte")
    assert not (mnt / "model.pte").exists()
    assert sorted(p.name for p in mnt.iterdir()) == ["lost+found", "staging"]
    assert snapshot(mnt / "staging") == before
    assert file_digest(blob.path) == blob.digest
    store.close()


def test_staging_on_another_filesystem_is_copied_and_says_why(make_fs):
    staging = make_fs("tmpfs", 64)
    out_fs = make_fs("ext4", 128)
    store = BlobStore(staging)
    blob = random_blob(store, 8 * MiB, seed=3)
    report = write_file(out_fs / "m.pte", [b"x" * 10, blob], consume=True)
    (rec,) = report.placements
    assert rec.placement == "copy"
    assert "different filesystems" in rec.reason
    assert file_digest(blob.path) == blob.digest  # copied, so the source is intact
    assert (out_fs / "m.pte").read_bytes() == b"x" * 10 + Path(blob.path).read_bytes()
    store.close()


def test_write_report_tells_placement_bytes_and_progress(here_fs):
    store = BlobStore(here_fs / "s", chunk_size=64 << 10)
    a = random_blob(store, 3 * MiB + 5, seed=4)
    b = random_blob(store, MiB, seed=5)
    seen = []
    pieces = [b"head", a, b"\0" * 123, b]
    want = expected_bytes(pieces)
    report = write_file(here_fs / "o.bin", pieces, consume=True, chunk_size=MiB,
                        progress=lambda d, t: seen.append((d, t)))
    assert (here_fs / "o.bin").read_bytes() == want
    assert [r.placement for r in report.placements] == ["move", "move"]
    assert [r.offset for r in report.placements] == [4, 4 + a.size + 123]
    assert report.size == len(want) and report.bytes_written == len(want)
    assert all(r.verified for r in report.placements)
    assert seen[-1] == (len(want), len(want))
    assert [d for d, _ in seen] == sorted(d for d, _ in seen)


# -- issue 2: failure injection at every call --------------------------------------

def _fault_case(root: Path, *, consume: bool, existing: bool):
    """A fresh store and destination, and a write of it to run under injection."""
    for p in root.iterdir():
        if p.is_dir():
            for q in p.iterdir():
                q.unlink()
            p.rmdir()
        else:
            p.unlink()
    store = BlobStore(root / "store", chunk_size=32 << 10)
    out_dir = root / "out"
    out_dir.mkdir()
    blobs = [random_blob(store, n, seed=n) for n in (200_000, 70_001)]
    ext_path = root / "user.bin"
    ext_path.write_bytes(bytes(range(250)) * 200)
    pieces = [b"hdr" * 10, blobs[0], b"\0" * 77, ExternalFile.of(ext_path), b"m" * 9, blobs[1]]
    dest = out_dir / "model.pte"
    if existing:
        dest.write_bytes(b"old content")

    def run():
        return write_file(dest, pieces, consume=consume, chunk_size=64 << 10)

    return store, blobs, pieces, dest, run


@pytest.mark.parametrize("mode", ["eio", "short", "enospc"])
@pytest.mark.parametrize("consume", [True, False])
@pytest.mark.parametrize("existing", [True, False])
def test_fault_at_every_call_loses_nothing(here_fs, mode, consume, existing):
    store, blobs, pieces, dest, run = _fault_case(here_fs, consume=consume, existing=existing)
    new_content = expected_bytes(pieces)
    assert count_calls(run) > 10
    old = b"old content" if existing else None
    store.close()
    failures = 0
    # At every call, until a write ends before the call to fault: a move's
    # syncs and cuts vary in number from run to run (one sync covers every
    # step copied since the last), so the count varies a little.
    for n in itertools.count(1):
        store, blobs, pieces, dest, run = _fault_case(here_fs, consume=consume,
                                                      existing=existing)
        digests = [b.digest for b in blobs]
        ext_digest = file_digest(here_fs / "user.bin")
        with FaultInjector(fail_at=n, mode=mode) as inj:
            try:
                run()
                raised = None
            except OSError as exc:
                raised = exc
        ended = not inj.fired  # this write made fewer than n calls
        content = dest.read_bytes() if dest.exists() else None
        where = f"fault {mode} at call {n} ({inj.fired}): raised={raised!r}"
        assert content in (old, new_content), where
        if raised is not None and content == old:
            failures += 1
            for b, d in zip(blobs, digests, strict=True):
                assert file_digest(b.path) == d, where
        if content == new_content and consume:
            for b in blobs:
                assert not Path(b.path).exists() or raised is not None, where
                # Published: the output owns the bytes, even if cleanup failed.
                assert b.consumed, where
        if content == old:
            assert not any(b.consumed for b in blobs), where
        assert file_digest(here_fs / "user.bin") == ext_digest, where
        if raised is not None and content == new_content:
            # Failed after the commit point: recovery only has cleanup left.
            from trtet_store import recover

            recover(dest.parent)
        assert sorted(p.name for p in dest.parent.iterdir()) == (["model.pte"] if content
                                                                 else []), where
        assert not [p for p in (here_fs / "store").iterdir() if p.name.startswith(".trtet-pin")]
        store.close()
        if ended:
            assert raised is None and content == new_content, where
            total = n - 1
            break
    if mode != "short":
        assert failures > total // 2


# -- atomicity and bad inputs ---------------------------------------------------------

def test_existing_destination_is_replaced_atomically(here_fs):
    dest = here_fs / "m.pte"
    dest.write_bytes(b"old" * 1000)
    reader = open(dest, "rb")  # noqa: SIM115 - held open across the write on purpose
    old_inode = os.stat(dest).st_ino
    store = BlobStore(here_fs / "s")
    blob = random_blob(store, 2 * MiB, seed=9)
    write_file(dest, [b"new", blob], consume=True)
    assert os.stat(dest).st_ino != old_inode  # a rename, not an overwrite in place
    assert reader.read() == b"old" * 1000
    reader.close()
    assert dest.read_bytes()[:3] == b"new"


@pytest.mark.parametrize("alias", ["same", "hardlink", "symlink"])
def test_destination_that_is_a_source_is_refused(here_fs, alias):
    store = BlobStore(here_fs / "s")
    blob = random_blob(store, MiB, seed=10)
    if alias == "same":
        dest = Path(blob.path)
    elif alias == "hardlink":
        dest = here_fs / "link.pte"
        os.link(blob.path, dest)
    else:
        dest = here_fs / "sym.pte"
        dest.symlink_to(blob.path)
    before = snapshot(here_fs / "s")
    with pytest.raises(ValueError, match="source"):
        write_file(dest, [b"x", blob], consume=True)
    assert snapshot(here_fs / "s") == before
    assert file_digest(blob.path) == blob.digest


def test_bad_destinations_raise_clear_errors_and_write_nothing(here_fs):
    store = BlobStore(here_fs / "s")
    blob = random_blob(store, MiB, seed=11)
    with pytest.raises(IsADirectoryError):
        write_file(here_fs, [blob])
    with pytest.raises(FileNotFoundError, match="directory does not exist"):
        write_file(here_fs / "missing" / "m.pte", [blob])
    ro = here_fs / "ro"
    ro.mkdir()
    ro.chmod(0o555)
    try:
        if os.geteuid() != 0:
            with pytest.raises(PermissionError):
                write_file(ro / "m.pte", [blob])
    finally:
        ro.chmod(0o755)
    with pytest.raises(TypeError, match="expected bytes, Blob or ExternalFile"):
        write_file(here_fs / "m.pte", [blob, 42])
    with pytest.raises(ValueError, match="named twice"):
        write_files([(here_fs / "a", [b"1"]), (here_fs / "a", [b"2"])])
    assert file_digest(blob.path) == blob.digest
    assert sorted(p.name for p in here_fs.iterdir()) == ["ro", "s"]


def test_source_resized_after_staging_is_refused(here_fs):
    store = BlobStore(here_fs / "s")
    blob = random_blob(store, MiB, seed=12)
    with open(blob.path, "ab") as f:
        f.write(b"more")
    with pytest.raises(ValueError, match="changed after it was staged"):
        write_file(here_fs / "m.pte", [blob], consume=True)
    assert not (here_fs / "m.pte").exists()


def test_source_changed_after_staging_rolls_back(here_fs):
    store = BlobStore(here_fs / "s", chunk_size=64 << 10)
    blob = random_blob(store, MiB, seed=13)
    with open(blob.path, "r+b") as f:  # same size, other bytes, at the front
        f.write(b"tampered")
    tampered = file_digest(blob.path)
    (here_fs / "m.pte").write_bytes(b"previous")
    with pytest.raises(OSError, match="does not match the digest"):
        write_file(here_fs / "m.pte", [b"h", blob], consume=True, chunk_size=64 << 10)
    assert file_digest(blob.path) == tampered  # every moved chunk went back
    assert (here_fs / "m.pte").read_bytes() == b"previous"
    assert sorted(p.name for p in here_fs.iterdir()) == ["m.pte", "s"]


def test_several_files_publish_together_or_not_at_all(here_fs):
    store = BlobStore(here_fs / "s", chunk_size=64 << 10)
    a, b = random_blob(store, MiB, seed=14), random_blob(store, MiB, seed=15)
    (here_fs / "m.pte").write_bytes(b"old pte")
    (here_fs / "w.ptd").write_bytes(b"old ptd")
    outputs = [(here_fs / "m.pte", [b"p", a]), (here_fs / "w.ptd", [b"d", b])]
    # Fail the second rename: the first output must be put back.
    with FaultInjector(mode="eio", only=frozenset({"rename"}), fail_at=2), \
            pytest.raises(OSError, match="injected"):
        write_files(outputs, consume=True)
    assert (here_fs / "m.pte").read_bytes() == b"old pte"
    assert (here_fs / "w.ptd").read_bytes() == b"old ptd"
    assert file_digest(a.path) == a.digest and file_digest(b.path) == b.digest
    assert sorted(p.name for p in here_fs.iterdir()) == ["m.pte", "s", "w.ptd"]
    write_files(outputs, consume=True)
    assert (here_fs / "w.ptd").read_bytes()[:1] == b"d"
    assert a.consumed and b.consumed
