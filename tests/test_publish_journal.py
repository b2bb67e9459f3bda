"""One journal per writer, keyed by what names the upload; memory and reads bounded by the part.

Issue 34, items 10, 12, 17, 18 and the ``.trtet.json`` refusal of 19, each
set up deterministically on the real SeaweedFS server:

- a second publisher of one key on one machine (a thread, then a process)
  while the first holds its journal's lock mid-publish;
- a publish interrupted through ``http://127.0.0.1:PORT`` and resumed, or
  aborted, through ``http://localhost:PORT``;
- ``recover DIR`` and the warning about other open uploads, from the CLI;
- a small object with 5 GiB parts (peak RSS of a child process);
- a server-side part copy refused, counted by the kernel's read counter of
  the thread that falls back to sending the part.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
from pathlib import Path
from urllib.parse import urlsplit

import pytest
import xxhash
from tcp_proxy import Fault

import trtet_store
from trtet_store.cli import main
from trtet_store.io import ExternalFile
from trtet_store.io.units import GiB, KiB, MiB
from trtet_store.remote import ChecksumMismatchError, ConflictError, RemoteURLError
from trtet_store.remote.upload.send import publish_sources
from trtet_store.remote.upload.source import ObjectSource
from trtet_store.remote.upload.unfinished import abort

PART = 5 * MiB
ROOT = Path(__file__).resolve().parent.parent


def _part_number(number: int):
    """A proxy predicate: the request that sends part ``number`` (not a copy)."""
    def match(m) -> bool:
        return (f"partNumber={number}&" in m.target or m.target.endswith(f"partNumber={number}")
                ) and "x-amz-copy-source" not in m.headers
    return match


def _uploads(s3env) -> list[str]:
    got = s3env.client.list_multipart_uploads(Bucket=s3env.bucket).get("Uploads", [])
    return [u["UploadId"] for u in got]


def _object_digest(s3env, key: str) -> str:
    body = s3env.client.get_object(Bucket=s3env.bucket, Key=key)["Body"].read()
    return xxhash.xxh3_128_hexdigest(body)


def _file_digest(path: Path) -> str:
    return xxhash.xxh3_128_hexdigest(path.read_bytes())


def _localhost(url: str) -> str:
    """The same server through another URL: ``http://localhost:PORT`` for 127.0.0.1."""
    parts = urlsplit(url)
    assert parts.hostname == "127.0.0.1", url
    return f"{parts.scheme}://localhost:{parts.port}"


def _interrupted(s3env, tcp_proxy, pte: Path, url: str) -> tuple[object, ChecksumMismatchError]:
    """A publish of ``pte`` stopped at its part 3 (every attempt flipped on the wire).

    Returns the proxy (its faults cleared) and the error; the upload is kept
    with parts 1 and 2, and its journal too.
    """
    proxy = tcp_proxy(s3env.endpoint.url)
    proxy.add(Fault("request", "flip", at=7, match=_part_number(3), times=1000))
    with pytest.raises(ChecksumMismatchError) as info:
        trtet_store.publish(pte, url, endpoint_url=proxy.url, part_size=PART, concurrency=1,
                            journal_dir=s3env.journal_dir)
    proxy.clear()
    assert _uploads(s3env) == [info.value.upload_id]
    return proxy, info.value


# --- item 10: one writer per journal --------------------------------------------------------


def test_a_second_publisher_of_one_key_is_refused_while_the_first_runs(s3env, tmp_path):
    """A thread publishing other bytes of the same size to the same key, mid-publish of the first.

    Without the lock it found the first one's live journal (same sizes, same
    plan), took it for an interrupted publish and sent its parts into the
    first one's upload. With it: ConflictError at once, no request of its
    own, and the first publish finishes with its own bytes.
    """
    (tmp_path / "a").mkdir()
    (tmp_path / "b").mkdir()
    a, b = tmp_path / "a" / "model.pte", tmp_path / "b" / "model.pte"
    a.write_bytes(os.urandom(3 * PART + 17))
    b.write_bytes(os.urandom(3 * PART + 17))
    b_digest = _file_digest(b)
    url = f"s3://{s3env.bucket}/two/model.pte"
    kw = {"endpoint_url": s3env.endpoint.url, "part_size": PART, "concurrency": 1,
          "journal_dir": s3env.journal_dir}
    first_part, go_on = threading.Event(), threading.Event()

    def hold(p) -> None:  # the first publisher stops after its first part, lock held
        if p.sent >= PART:
            first_part.set()
            assert go_on.wait(120)

    outcome: list = []

    def run() -> None:
        try:
            outcome.append(trtet_store.publish(a, url, progress=hold, **kw))
        except BaseException as exc:  # noqa: BLE001 - the test reads it
            outcome.append(exc)

    t = threading.Thread(target=run)
    t.start()
    try:
        assert first_part.wait(120)
        held = _uploads(s3env)
        assert len(held) == 1
        with pytest.raises(ConflictError, match="another publish of .* is running"):
            trtet_store.publish(b, url, **kw)
        # Nor is a live publish aborted under it (abort takes the same lock).
        with pytest.raises(ConflictError, match="another publish of .* is running"):
            abort(url, endpoint_url=s3env.endpoint.url, journal_dir=s3env.journal_dir)
        # Nothing of the second: the first one's upload alone, with its one part.
        assert _uploads(s3env) == held
        parts = s3env.client.list_parts(Bucket=s3env.bucket, Key="two/model.pte",
                                        UploadId=held[0])["Parts"]
        assert [p["PartNumber"] for p in parts] == [1]
    finally:
        go_on.set()
        t.join(300)
    assert not isinstance(outcome[0], BaseException), outcome[0]
    assert _object_digest(s3env, "two/model.pte") == _file_digest(a)
    assert _file_digest(b) == b_digest  # the refused one's source is untouched
    assert _uploads(s3env) == []
    assert list(s3env.journal_dir.iterdir()) == []


HOLDER = r"""
import sys
import trtet_store

url, endpoint, journal, path = sys.argv[1:]

def hold(p):
    if p.sent >= 5 << 20:
        sys.stdout.write("HOLDING\n")
        sys.stdout.flush()
        sys.stdin.readline()  # until the parent kills it

trtet_store.publish(path, url, endpoint_url=endpoint, part_size=5 << 20, concurrency=1,
                    journal_dir=journal, progress=hold)
"""


def test_the_lock_is_another_process_s_and_dies_with_it(s3env, tmp_path):
    """A second process holds the journal mid-publish: refused; once it is killed, resumed.

    After the SIGKILL its lock is gone with it. Our publish of other bytes
    (same size: the journal's plan matches) then resumes its upload, keeps
    no part whose bytes differ (every CRC is compared with our bytes), and
    publishes our bytes; nothing is left open.
    """
    (tmp_path / "a").mkdir()
    (tmp_path / "b").mkdir()
    a, b = tmp_path / "a" / "model.pte", tmp_path / "b" / "model.pte"
    a.write_bytes(os.urandom(3 * PART + 5))
    b.write_bytes(os.urandom(3 * PART + 5))
    url = f"s3://{s3env.bucket}/proc/model.pte"
    child = subprocess.Popen([sys.executable, "-c", HOLDER, url, s3env.endpoint.url,
                              os.fspath(s3env.journal_dir), os.fspath(a)], cwd=ROOT,
                             stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                             stderr=subprocess.PIPE)
    try:
        line = child.stdout.readline()
        assert line == b"HOLDING\n", child.stderr.read().decode()[-3000:]
        kw = {"endpoint_url": s3env.endpoint.url, "part_size": PART, "concurrency": 1,
              "journal_dir": s3env.journal_dir}
        with pytest.raises(ConflictError, match=rf"process {child.pid}"):
            trtet_store.publish(b, url, **kw)
        assert len(_uploads(s3env)) == 1
    finally:
        os.kill(child.pid, signal.SIGKILL)
        child.wait(30)
        for f in (child.stdin, child.stdout, child.stderr):
            f.close()
    report = trtet_store.publish(b, url, **kw)
    assert report.objects[0].resumed_upload and report.objects[0].parts_resumed == 0
    assert _object_digest(s3env, "proc/model.pte") == _file_digest(b)
    assert _uploads(s3env) == []
    assert list(s3env.journal_dir.iterdir()) == []


# --- item 12: the journal names the upload, not the URL ---------------------------------------


def test_a_resume_through_another_url_of_the_same_server_resumes(s3env, tmp_path, tcp_proxy):
    """Stopped through http://127.0.0.1:PORT, run again through http://localhost:PORT.

    Keyed by URL, the second run found no journal, started over at 0 and
    left the first upload open (billed). Keyed by bucket and key it resumes:
    parts 1 and 2 are not sent again, and nothing is left open.
    """
    pte = tmp_path / "model.pte"
    pte.write_bytes(os.urandom(3 * PART + 99))
    url = f"s3://{s3env.bucket}/via/model.pte"
    proxy, err = _interrupted(s3env, tcp_proxy, pte, url)
    report = trtet_store.publish(pte, url, endpoint_url=_localhost(proxy.url), part_size=PART,
                                 concurrency=1, journal_dir=s3env.journal_dir)
    obj = report.objects[0]
    assert obj.resumed_upload and obj.parts_resumed >= 2, obj
    assert report.bytes_resumed >= 2 * PART
    assert _object_digest(s3env, "via/model.pte") == _file_digest(pte)
    assert _uploads(s3env) == []
    assert list(s3env.journal_dir.iterdir()) == []


def test_recover_lists_neither_an_aborted_upload_nor_another_folder_s(s3env, tmp_path, capsys,
                                                                      tcp_proxy, monkeypatch):
    """``recover DIR``: the interrupted publishes of DIR's files, until they are given up.

    Two publishes are stopped, of files in ``one/`` and in ``two/``.
    ``recover one`` names the first only. The first is then aborted through
    another URL of the same server: its journal goes with it, and ``recover
    one`` names nothing (the upload is gone; listing it would send the user
    to abort what is not there).
    """
    monkeypatch.setenv("XDG_STATE_HOME", os.fspath(tmp_path / "state"))
    monkeypatch.setattr(s3env, "journal_dir", tmp_path / "state" / "trtet_store" / "publish")
    one, two = tmp_path / "one", tmp_path / "two"
    one.mkdir()
    two.mkdir()
    (one / "model.pte").write_bytes(os.urandom(3 * PART + 1))
    (two / "model.pte").write_bytes(os.urandom(3 * PART + 2))
    url1 = f"s3://{s3env.bucket}/one/model.pte"
    url2 = f"s3://{s3env.bucket}/two/model.pte"
    proxy, first = _interrupted(s3env, tcp_proxy, one / "model.pte", url1)
    with pytest.raises(ChecksumMismatchError) as info:
        proxy.add(Fault("request", "flip", at=7, match=_part_number(3), times=1000))
        trtet_store.publish(two / "model.pte", url2, endpoint_url=proxy.url, part_size=PART,
                            concurrency=1, journal_dir=s3env.journal_dir)
    proxy.clear()
    capsys.readouterr()

    assert main(["recover", os.fspath(one)]) == 0
    err = capsys.readouterr().err
    assert f"interrupted publish {url1}" in err and url2 not in err, err
    assert main(["recover", os.fspath(two)]) == 0
    err = capsys.readouterr().err
    assert f"interrupted publish {url2}" in err and url1 not in err, err

    assert main(["publish", "--abort", url1, "--endpoint-url", _localhost(proxy.url)]) == 0
    assert first.upload_id in capsys.readouterr().out
    assert _uploads(s3env) == [info.value.upload_id]
    assert main(["recover", os.fspath(one)]) == 0
    assert "interrupted publish" not in capsys.readouterr().err
    assert not Path(first.journal).exists()

    assert main(["publish", "--abort", url2, "--endpoint-url", s3env.endpoint.url]) == 0
    assert _uploads(s3env) == []
    assert list(s3env.journal_dir.iterdir()) == []


def test_the_warning_about_other_open_uploads_is_shown_without_v(s3env, tmp_path, capsys):
    """An upload of the key that is not ours: the CLI says so (it is billed) without ``-v``."""
    pte = tmp_path / "model.pte"
    pte.write_bytes(os.urandom(100 * KiB))
    url = f"s3://{s3env.bucket}/warn/model.pte"
    other = s3env.client.create_multipart_upload(Bucket=s3env.bucket, Key="warn/model.pte")
    try:
        assert main(["publish", os.fspath(pte), url, "--endpoint-url", s3env.endpoint.url,
                     "--journal-dir", os.fspath(s3env.journal_dir), "--no-progress"]) == 0
        err = capsys.readouterr().err
        line = next((ln for ln in err.splitlines() if "other unfinished upload" in ln), None)
        assert line is not None, err
        assert line.startswith("trtet-store publish: warning:") and other["UploadId"] in line
    finally:
        s3env.client.abort_multipart_upload(Bucket=s3env.bucket, Key="warn/model.pte",
                                            UploadId=other["UploadId"])
    assert _object_digest(s3env, "warn/model.pte") == _file_digest(pte)


# --- item 17: part buffers bounded by the object ------------------------------------------------

RSS_CHILD = r"""
import os, sys
import trtet_store
from trtet_store.bench.measure import current_rss_bytes, peak_rss_bytes, reset_peak_rss
from trtet_store.bench.measure import return_freed_buffers

bucket, endpoint, journal, small, warm = sys.argv[1:]
assert return_freed_buffers()
# boto3, botocore's service model and the publish path loaded once: not the object's memory.
trtet_store.publish(warm, f"s3://{bucket}/rss/warm.pte", endpoint_url=endpoint,
                    journal_dir=journal)
base = current_rss_bytes()
assert reset_peak_rss()
report = trtet_store.publish(small, f"s3://{bucket}/rss/small.pte", endpoint_url=endpoint,
                             part_size=5 << 30, journal_dir=journal)
print(peak_rss_bytes() - base, report.objects[0].parts)
"""


def test_a_small_object_with_5_gib_parts_takes_its_size_not_the_part_size(s3env, tmp_path):
    """160 KiB with ``part_size=5 GiB``: memory is min(part, object) per buffer, not 5 GiB."""
    small, warm = tmp_path / "small.pte", tmp_path / "warm.pte"
    small.write_bytes(os.urandom(160 * KiB))
    warm.write_bytes(os.urandom(10 * KiB))
    out = subprocess.run([sys.executable, "-c", RSS_CHILD, s3env.bucket, s3env.endpoint.url,
                          os.fspath(s3env.journal_dir), os.fspath(small), os.fspath(warm)],
                         cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr[-3000:]
    growth, parts = (int(v) for v in out.stdout.split())
    assert parts == 1
    # One part in a 160 KiB buffer, plus what a request's life takes (a few MiB).
    assert growth < 64 * MiB, f"peak RSS grew by {growth / MiB:.1f} MiB"
    assert growth < GiB  # (the bug: 5 GiB, one buffer of the part size)
    assert _object_digest(s3env, "rss/small.pte") == _file_digest(small)


# --- item 18: a refused part copy re-reads that part only ---------------------------------------


def _thread_rchar() -> int:
    """Bytes this thread has read with read(2)-family calls (``/proc/thread-self/io``)."""
    with open("/proc/thread-self/io") as f:
        for line in f:
            if line.startswith("rchar:"):
                return int(line.split()[1])
    raise AssertionError("no rchar in /proc/thread-self/io")


def test_a_refused_part_copy_reads_that_part_only(s3env, tmp_path, monkeypatch):
    """Part 4 of 5 is to be copied server-side; the copy is refused (the source changed).

    The fallback sends the part's bytes, read by the worker thread that
    tried the copy. The kernel counts what that thread reads between the
    refusal and the upload of the part: one part, not the three before it.
    """
    from trtet_store.remote.s3 import S3, PreconditionFailed

    big = tmp_path / "weights.bin"
    big.write_bytes(os.urandom(4 * PART))
    url = f"s3://{s3env.bucket}/copy/model.pte"

    def source(tail: bytes) -> list[ObjectSource]:
        return [ObjectSource("model.pte", [ExternalFile.range(big, 0, 4 * PART), tail])]

    kw = {"endpoint_url": s3env.endpoint.url, "part_size": PART, "concurrency": 2,
          "journal_dir": s3env.journal_dir, "index": False}
    publish_sources(source(b"version one"), url, **kw)

    refused: dict[int, int] = {}  # thread id -> rchar when its copy was refused
    read: list[int] = []
    copy_part, upload_part = S3.copy_part, S3.upload_part

    def refuse_part_4(self, bucket, key, upload_id, number, *args, **kwargs):
        if number == 4:
            refused[threading.get_ident()] = _thread_rchar()
            raise PreconditionFailed(f"UploadPartCopy {number}: precondition failed")
        return copy_part(self, bucket, key, upload_id, number, *args, **kwargs)

    def count_reads(self, bucket, key, upload_id, number, *args, **kwargs):
        before = refused.pop(threading.get_ident(), None)
        if before is not None:
            read.append(_thread_rchar() - before)
        return upload_part(self, bucket, key, upload_id, number, *args, **kwargs)

    monkeypatch.setattr(S3, "copy_part", refuse_part_4)
    monkeypatch.setattr(S3, "upload_part", count_reads)
    report = publish_sources(source(b"version two!"), url, replace=True, **kw)
    obj = report.objects[0]
    assert (obj.parts_copied, obj.parts_sent) == (3, 2), obj  # part 4 and the tail sent
    assert len(read) == 1, read
    # The part, and the few hundred bytes of /proc/thread-self/io itself.
    assert PART <= read[0] <= PART + 64 * KiB, f"the fallback read {read[0]} bytes"
    expected = big.read_bytes() + b"version two!"
    got = s3env.client.get_object(Bucket=s3env.bucket, Key="copy/model.pte")["Body"].read()
    assert xxhash.xxh3_128_hexdigest(got) == xxhash.xxh3_128_hexdigest(expected)
    assert _uploads(s3env) == []


# --- item 19: a manifest's key is not a program's ---------------------------------------------


def test_publishing_to_a_manifest_key_is_refused_before_anything_is_sent(s3env, tmp_path,
                                                                        capsys):
    pte = tmp_path / "model.pte"
    pte.write_bytes(os.urandom(1000))
    url = f"s3://{s3env.bucket}/m/model.pte.trtet.json"
    with pytest.raises(RemoteURLError, match=r"\.trtet\.json are the manifests.*"
                                             r"s3://[^ ]+/m/model\.pte$"):
        trtet_store.publish(pte, url, endpoint_url=s3env.endpoint.url,
                            journal_dir=s3env.journal_dir)
    assert main(["publish", os.fspath(pte), url, "--endpoint-url", s3env.endpoint.url,
                 "--journal-dir", os.fspath(s3env.journal_dir), "--no-progress"]) == 1
    err = capsys.readouterr().err.strip()
    assert err.startswith("trtet-store publish:") and "\n" not in err and ".trtet.json" in err
    listed = s3env.client.list_objects_v2(Bucket=s3env.bucket).get("Contents", [])
    assert listed == [] and _uploads(s3env) == []
    assert not s3env.journal_dir.exists()
