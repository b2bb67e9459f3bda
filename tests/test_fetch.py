"""fetch against a real S3 server (SeaweedFS): byte identity, delta, preflight, faults, versions.

The objects and manifests here are put with plain boto3 in publish's manifest
format (tests/test_fetch_support.py), so each test says what the server holds;
tests/test_fetch_roundtrip.py goes through the real ``publish`` and the
runtimes.
"""

from __future__ import annotations

import os
import threading
from pathlib import Path

import pytest
from tcp_proxy import Fault
from test_fetch_support import MiB, engine_bytes, engine_program, put_program

from trtet_store import InsufficientSpaceError
from trtet_store.io import free_bytes
from trtet_store.remote import AccessDeniedError
from trtet_store.remote.download.receive import fetch
from trtet_store.remote.errors import (
    FetchVerificationError,
    ObjectChangedError,
    ObjectNotFoundError,
)
from trtet_store.testing.s3server import S3Endpoint

ENGINES = (6 * MiB, 5 * MiB)


def listing(directory: Path) -> list[str]:
    return sorted(n for n in os.listdir(directory) if n != "lost+found")


def staged_nothing(directory: Path) -> bool:
    return not (directory / ".trtet-staging").exists()


def two_versions(seed: int = 1) -> tuple[bytes, bytes, list[int], int]:
    """v1 and v2 of a program whose second engine changed (same sizes); v2's engine offset."""
    v1, sizes = engine_program(seed, ENGINES)
    off = sizes[0] + ENGINES[0]
    v2 = bytearray(v1)
    v2[off:off + ENGINES[1]] = engine_bytes(seed + 1000, ENGINES[1])
    return v1, bytes(v2), sizes, off


def publish_v(s3, data: bytes, sizes: list[int], ptd: bytes, prefix: str = "m") -> str:
    put_program(s3.client, s3.bucket, prefix, {"model.pte": (data, sizes),
                                               "model.ptd": (ptd, [len(ptd)])})
    return f"s3://{s3.bucket}/{prefix}/model.pte"


def test_fetch_writes_every_object_byte_identical_and_leaves_nothing_else(s3, here_fs):
    data, sizes = engine_program(1, ENGINES)
    ptd = engine_bytes(5, 2 * MiB + 123)
    url = publish_v(s3, data, sizes, ptd)
    seen = []
    report = fetch(url, here_fs / "model.pte", client=s3.client, range_size=MiB,
                   progress=seen.append)
    assert (here_fs / "model.pte").read_bytes() == data
    assert (here_fs / "model.ptd").read_bytes() == ptd
    assert listing(here_fs) == ["model.ptd", "model.pte"]  # no staging, journal, lock
    assert report.verified and not report.up_to_date
    assert report.bytes_downloaded == len(data) + len(ptd) and report.bytes_reused == 0
    assert [o.name for o in report.objects] == ["model.pte", "model.ptd"]
    assert seen[-1].done == seen[-1].total == seen[-1].downloaded == len(data) + len(ptd)
    # Again: the destination already holds this version, nothing is downloaded or written.
    before = os.stat(here_fs / "model.pte")
    again = fetch(url, here_fs / "model.pte", client=s3.client)
    assert again.up_to_date and again.bytes_downloaded == 0
    assert os.stat(here_fs / "model.pte").st_ino == before.st_ino


def test_a_plain_object_is_verified_by_its_full_object_checksum(s3, here_fs):
    data = engine_bytes(3, 3 * MiB + 7)
    s3.client.put_object(Bucket=s3.bucket, Key="plain.bin", Body=data,
                         ChecksumAlgorithm="CRC64NVME")
    report = fetch(f"s3://{s3.bucket}/plain.bin", here_fs / "x.bin", client=s3.client,
                   range_size=MiB)
    assert (here_fs / "x.bin").read_bytes() == data
    assert report.verified and report.objects[0].checksum.startswith("crc64nvme:")
    assert listing(here_fs) == ["x.bin"]


def test_a_plain_object_without_a_checksum_is_fetched_and_said_unverified(s3, here_fs):
    bare = S3Endpoint(s3.endpoint.url).client(request_checksum_calculation="when_required")
    data = engine_bytes(4, 2 * MiB)
    bare.put_object(Bucket=s3.bucket, Key="bare.bin", Body=data)
    head = s3.client.head_object(Bucket=s3.bucket, Key="bare.bin", ChecksumMode="ENABLED")
    assert not any(k.startswith("ChecksumCRC") for k in head)  # the premise
    report = fetch(f"s3://{s3.bucket}/bare.bin", here_fs / "x.bin", client=s3.client)
    assert (here_fs / "x.bin").read_bytes() == data
    assert not report.verified and "could not be verified" in report.unverified_reason


def test_missing_object_and_bad_credentials_are_clear_errors_and_create_nothing(s3, here_fs):
    with pytest.raises(ObjectNotFoundError, match="no such object"):
        fetch(f"s3://{s3.bucket}/nothing.pte", here_fs / "m.pte", client=s3.client)
    data, sizes = engine_program(2, (MiB,))
    url = publish_v(s3, data, sizes, b"x" * 100)
    wrong = S3Endpoint(s3.endpoint.url, secret_key="not-the-secret").client()
    with pytest.raises(AccessDeniedError, match="access denied"):
        fetch(url, here_fs / "m.pte", client=wrong)
    assert listing(here_fs) == []


@pytest.mark.parametrize("fstype", ["xfs", "ext4"])
def test_delta_downloads_only_the_changed_engine_and_clones_the_other_on_xfs(
        s3, make_fs, fstype):
    mnt = make_fs(fstype, 300)
    v1, v2, sizes, off = two_versions()
    ptd = engine_bytes(6, 2 * MiB)
    url = publish_v(s3, v1, sizes, ptd)
    fetch(url, mnt / "model.pte", client=s3.client, range_size=MiB)
    old = os.stat(mnt / "model.pte")
    publish_v(s3, v2, sizes, ptd)
    report = fetch(url, mnt / "model.pte", client=s3.client, range_size=MiB)
    assert (mnt / "model.pte").read_bytes() == v2 and (mnt / "model.ptd").read_bytes() == ptd
    # Downloaded: the changed engine only (the header and padding pieces are unchanged too).
    assert report.bytes_downloaded <= ENGINES[1] + sizes[0]
    assert report.bytes_downloaded >= ENGINES[1]
    assert report.bytes_reused == len(v1) + len(ptd) - report.bytes_downloaded
    pte = report.writes[0]
    kept = next(p for p in pte.placements if p.offset == sizes[0])  # the unchanged engine
    if fstype == "xfs":
        assert kept.placement == "clone" and kept.bytes_written == 0
        assert report.reused_by.get("copy", 0) < MiB  # only sub-page pieces are copied
    else:
        assert kept.placement == "copy"
    assert os.stat(mnt / "model.pte").st_ino != old.st_ino  # replaced by rename, not in place
    assert listing(mnt) == ["model.ptd", "model.pte"]


def test_reuse_takes_pieces_from_another_file(s3, here_fs):
    v1, v2, sizes, off = two_versions(seed=3)
    old = here_fs / "old" / "model.pte"
    old.parent.mkdir()
    old.write_bytes(v1)
    (old.parent / "model.ptd").write_bytes(b"p" * 5000)
    url = publish_v(s3, v2, sizes, b"p" * 5000)
    out = here_fs / "new"
    out.mkdir()
    report = fetch(url, out / "model.pte", reuse=[old], client=s3.client, range_size=MiB)
    assert (out / "model.pte").read_bytes() == v2
    assert report.bytes_downloaded <= ENGINES[1] + sizes[0]
    assert report.objects[1].reused_from == [os.fspath(old.parent / "model.ptd")]
    assert old.read_bytes() == v1  # a reuse source is only read


def test_a_disk_too_small_is_refused_before_any_byte_and_one_just_big_enough_works(
        s3, make_fs, tcp_proxy):
    data, sizes = engine_program(7, (40 * MiB,))
    url = publish_v(s3, data, sizes, b"d" * 4096)
    proxy = tcp_proxy(s3.endpoint.url)
    client = S3Endpoint(proxy.url).client(read_timeout=5)
    small = make_fs("ext4", 96)
    with pytest.raises(InsufficientSpaceError) as err:
        fetch(url, small / "model.pte", client=client)
    assert "nothing was downloaded or created" in str(err.value)
    assert err.value.needed > err.value.available
    assert listing(small) == []
    assert proxy.body_bytes[("response", "GET")] < 64 * 1024  # the manifest, no range
    # A filesystem where exactly what the preflight asks for is free.
    roomy = make_fs("ext4", 300)
    filler = roomy / "filler"
    fd = os.open(filler, os.O_WRONLY | os.O_CREAT, 0o644)
    try:
        os.posix_fallocate(fd, 0, free_bytes(roomy) - err.value.needed - 256 * 1024)
    finally:
        os.close(fd)
    assert err.value.needed <= free_bytes(roomy) < err.value.needed + MiB
    report = fetch(url, roomy / "model.pte", client=client)
    assert (roomy / "model.pte").read_bytes() == data and report.verified


def test_resets_are_retried_and_a_flipped_byte_is_fetched_again(s3, here_fs, tcp_proxy):
    data, sizes = engine_program(8, ENGINES)
    url = publish_v(s3, data, sizes, b"q" * 3000)
    ranged = lambda m: "range" in (m.request.headers if m.request else {})  # noqa: E731
    proxy = tcp_proxy(s3.endpoint.url, [
        Fault("response", "reset", at=300_000, match=ranged, times=2),
        Fault("response", "flip", at=123_457, match=ranged, skip=3, times=1)])
    client = S3Endpoint(proxy.url).client(read_timeout=5)
    # One range at a time: the two resets, then an intact range, then the flip.
    report = fetch(url, here_fs / "model.pte", client=client, range_size=MiB, concurrency=1)
    assert [f.action for f, _ in proxy.fired].count("reset") == 2
    assert [f.action for f, _ in proxy.fired].count("flip") == 1
    assert (here_fs / "model.pte").read_bytes() == data
    assert report.retries >= 3 and report.verified
    assert listing(here_fs) == ["model.ptd", "model.pte"]


def test_a_byte_flipped_every_time_fails_and_the_old_file_stays(s3, here_fs, tcp_proxy):
    v1, v2, sizes, off = two_versions(seed=9)
    url = publish_v(s3, v1, sizes, b"r" * 3000)
    fetch(url, here_fs / "model.pte", client=s3.client)
    publish_v(s3, v2, sizes, b"r" * 3000)
    ranged = lambda m: "range" in (m.request.headers if m.request else {})  # noqa: E731
    proxy = tcp_proxy(s3.endpoint.url, [Fault("response", "flip", at=1000, match=ranged,
                                              times=1000)])
    with pytest.raises(FetchVerificationError, match="did not match"):
        fetch(url, here_fs / "model.pte", client=S3Endpoint(proxy.url).client(read_timeout=5),
              range_size=MiB, attempts=3)
    assert (here_fs / "model.pte").read_bytes() == v1
    assert (here_fs / "model.ptd").read_bytes() == b"r" * 3000
    # The next fetch, on a good link, completes it and leaves nothing behind.
    fetch(url, here_fs / "model.pte", client=s3.client)
    assert (here_fs / "model.pte").read_bytes() == v2
    assert listing(here_fs) == ["model.ptd", "model.pte"]


def test_a_publish_during_a_fetch_gives_the_old_or_the_new_set_never_a_mix(s3, here_fs):
    v1, v2, sizes, off = two_versions(seed=11)
    ptd1, ptd2 = engine_bytes(12, 2 * MiB), engine_bytes(13, 2 * MiB)
    url = publish_v(s3, v1, sizes, ptd1)
    started = threading.Event()
    go_on = threading.Event()

    def slow(p):
        if p.downloaded >= 2 * MiB and not started.is_set():
            started.set()
            go_on.wait(30)  # hold the fetch while the new version is published

    result = {}
    t = threading.Thread(target=lambda: result.setdefault("r", fetch(
        url, here_fs / "model.pte", client=s3.client, range_size=MiB, concurrency=1,
        progress=slow)))
    t.start()
    assert started.wait(30)
    publish_v(s3, v2, sizes, ptd2)
    go_on.set()
    t.join(60)
    report = result["r"]
    assert report.restarts == 1
    # What the first attempt received counts too.
    assert report.bytes_downloaded > len(v2) + 2 * MiB
    assert (here_fs / "model.pte").read_bytes() == v2
    assert (here_fs / "model.ptd").read_bytes() == ptd2
    assert listing(here_fs) == ["model.ptd", "model.pte"]


def test_if_replaced_error_raises_and_changes_nothing(s3, here_fs):
    v1, v2, sizes, off = two_versions(seed=14)
    url = publish_v(s3, v1, sizes, b"a" * 10)
    fetch(url, here_fs / "model.pte", client=s3.client)
    publish_v(s3, v2, sizes, b"b" * 10)
    gate = threading.Event()

    def replace_once(p):
        if p.downloaded and not gate.is_set():
            gate.set()
            publish_v(s3, v1, sizes, b"c" * 10)  # replaced again, mid-fetch

    with pytest.raises(ObjectChangedError, match="replaced"):
        fetch(url, here_fs / "model.pte", client=s3.client, range_size=MiB, concurrency=1,
              if_replaced="error", progress=replace_once)
    assert (here_fs / "model.pte").read_bytes() == v1
    assert (here_fs / "model.ptd").read_bytes() == b"a" * 10


def test_an_object_published_as_one_piece_is_reused_chunk_by_chunk(s3, here_fs):
    v1 = engine_bytes(40, 9 * MiB + 100)
    v2 = bytearray(v1)
    v2[4 * MiB + 10: 4 * MiB + 20] = b"0123456789"  # one chunk of nine changed
    url = f"s3://{s3.bucket}/one/file.bin"
    put_program(s3.client, s3.bucket, "one", {"file.bin": (v1, [len(v1)])})
    fetch(url, here_fs / "file.bin", client=s3.client)
    put_program(s3.client, s3.bucket, "one", {"file.bin": (bytes(v2), [len(v2)])})
    report = fetch(url, here_fs / "file.bin", client=s3.client)
    assert (here_fs / "file.bin").read_bytes() == bytes(v2)
    assert report.bytes_downloaded == MiB and report.bytes_reused == len(v1) - MiB


def test_a_plain_object_with_a_flipped_byte_fails_its_checksum_and_keeps_nothing(
        s3, here_fs, tcp_proxy):
    old, new = engine_bytes(50, 2 * MiB), engine_bytes(51, 3 * MiB + 5)
    (here_fs / "x.bin").write_bytes(old)
    s3.client.put_object(Bucket=s3.bucket, Key="p.bin", Body=new, ChecksumAlgorithm="CRC64NVME")
    ranged = lambda m: "range" in (m.request.headers if m.request else {})  # noqa: E731
    proxy = tcp_proxy(s3.endpoint.url, [Fault("response", "flip", at=777, match=ranged)])
    url = f"s3://{s3.bucket}/p.bin"
    with pytest.raises(FetchVerificationError, match="crc64nvme of the bytes fetched"):
        fetch(url, here_fs / "x.bin", client=S3Endpoint(proxy.url).client(read_timeout=5),
              range_size=MiB)
    assert (here_fs / "x.bin").read_bytes() == old
    # No digest says which range was wrong: nothing staged is kept for a resume.
    assert listing(here_fs) == ["x.bin"]
    report = fetch(url, here_fs / "x.bin", client=s3.client, range_size=MiB)
    assert (here_fs / "x.bin").read_bytes() == new and report.bytes_resumed == 0


def test_bad_calls_are_refused_before_any_request(here_fs):
    from trtet_store.remote import RemoteURLError

    with pytest.raises(RemoteURLError):
        fetch("http://bucket/key", here_fs / "m.pte", client=object())
    with pytest.raises(TypeError, match="list of paths"):
        fetch("s3://bucket/m.pte", here_fs / "m.pte", reuse=here_fs / "old.pte", client=object())
    with pytest.raises(TypeError):
        fetch("s3://bucket/m.pte", here_fs / "m.pte", client=object(), overwrite=True)
    with pytest.raises(FileNotFoundError, match="must exist"):
        fetch("s3://bucket/m.pte", here_fs / "missing" / "m.pte", client=object())
    with pytest.raises(ValueError, match="if_replaced"):
        fetch("s3://bucket/m.pte", here_fs / "m.pte", client=object(), if_replaced="ignore")
    assert listing(here_fs) == []


def test_the_cli_says_disk_too_small_and_interrupted_with_the_resume_command(
        s3env, make_fs, here_fs, tcp_proxy, capsys):
    from trtet_store import cli

    data, sizes = engine_program(60, (40 * MiB,))
    url = publish_v(s3env, data, sizes, b"z" * 100)
    small = make_fs("ext4", 96)
    assert cli.main(["fetch", url, os.fspath(small / "model.pte"), "--endpoint-url",
                     s3env.endpoint.url, "--no-progress"]) == 1
    err = capsys.readouterr().err
    assert "disk too small" in err and "MiB available" in err
    assert listing(small) == []
    ranged = lambda m: "range" in (m.request.headers if m.request else {})  # noqa: E731
    proxy = tcp_proxy(s3env.endpoint.url, [Fault("response", "reset", at=1000, match=ranged,
                                                 times=10_000)])
    out = here_fs
    assert cli.main(["fetch", url, os.fspath(out / "model.pte"), "--endpoint-url", proxy.url,
                     "--no-progress"]) == 1
    err = capsys.readouterr().err
    assert "interrupted" in err
    assert f"trtet-store fetch {url} {out / 'model.pte'}" in err
    assert not (out / "model.pte").exists()


# A child that takes a fetch's locks as a fetch does (the fetch lock, then the staging
# store's), then dies by SIGKILL: the state of a fetch killed between removing its
# journal and removing its lock files.
_DIE_HOLDING_LOCKS = """
import os, signal, sys
from pathlib import Path
from trtet_store.io import STAGING_DIR, BlobStore, try_lock
from trtet_store.remote.download.staging import fetch_id
dest = Path(sys.argv[1])
staging = dest.parent / STAGING_DIR
assert try_lock(staging / f"fetch-{fetch_id(dest)}.lock", create=True) is not None
store = BlobStore(staging)  # held (a collected store lets its lock go)
os.kill(os.getpid(), signal.SIGKILL)
"""


def test_an_up_to_date_fetch_removes_the_lock_files_a_killed_fetch_left(s3, here_fs):
    import subprocess
    import sys

    data, sizes = engine_program(3, ENGINES)
    url = publish_v(s3, data, sizes, b"p" * 100)
    fetch(url, here_fs / "model.pte", client=s3.client)
    files = {n: (here_fs / n).read_bytes() for n in ("model.pte", "model.ptd")}
    (here_fs / ".trtet-staging").mkdir(mode=0o700)
    child = subprocess.run([sys.executable, "-c", _DIE_HOLDING_LOCKS, str(here_fs / "model.pte")],
                           capture_output=True, text=True, timeout=120)
    assert child.returncode == -9, child.stderr
    left = sorted(os.listdir(here_fs / ".trtet-staging"))
    assert [n.split("-")[0] for n in left] == [".store", "fetch"], left
    report = fetch(url, here_fs / "model.pte", client=s3.client)
    assert report.up_to_date
    assert listing(here_fs) == ["model.ptd", "model.pte"]
    assert {n: (here_fs / n).read_bytes() for n in files} == files


_HOLD_THE_FETCH_LOCK = """
import sys
from pathlib import Path
from trtet_store.io import STAGING_DIR, try_lock
from trtet_store.remote.download.staging import fetch_id
dest = Path(sys.argv[1])
assert try_lock(dest.parent / STAGING_DIR / f"fetch-{fetch_id(dest)}.lock", create=True)
print("held", flush=True)
sys.stdin.read()
"""


def test_an_up_to_date_fetch_is_not_failed_by_a_lock_a_live_fetch_holds(s3, here_fs):
    """The tidy of a dead fetch's locks meets a live one's: the up-to-date fetch still
    succeeds and leaves them; once that fetch is gone, the next one tidies."""
    import subprocess
    import sys

    data, sizes = engine_program(4, ENGINES)
    url = publish_v(s3, data, sizes, b"q" * 100)
    fetch(url, here_fs / "model.pte", client=s3.client)
    (here_fs / ".trtet-staging").mkdir(mode=0o700)
    holder = subprocess.Popen([sys.executable, "-c", _HOLD_THE_FETCH_LOCK,
                               str(here_fs / "model.pte")], stdin=subprocess.PIPE,
                              stdout=subprocess.PIPE, text=True)
    try:
        assert holder.stdout.readline().strip() == "held"
        assert fetch(url, here_fs / "model.pte", client=s3.client).up_to_date
        assert os.listdir(here_fs / ".trtet-staging") != []
    finally:
        holder.stdin.close()
        holder.wait(30)
    assert fetch(url, here_fs / "model.pte", client=s3.client).up_to_date
    assert listing(here_fs) == ["model.ptd", "model.pte"]
