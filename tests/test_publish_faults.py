"""Faults on the wire and a server that goes away: retried where safe, never published wrong.

A loopback proxy between the publisher and the server flips a byte in a
request body or resets the connection at chosen moments; the server itself
is stopped and started mid-upload. After each, what is under the key is the
program byte for byte, or nothing is.
"""

from __future__ import annotations

import os
import threading
from pathlib import Path

import pytest
from tcp_proxy import Fault
from test_fetch_support import assert_nothing_under

import trtet_store
from trtet_store.io.units import MiB
from trtet_store.remote import ChecksumMismatchError, UploadKeptError, manifest_key

PART = 5 * MiB


def _files(directory: Path) -> list[Path]:
    a, b = directory / "model.pte", directory / "w.ptd"
    a.write_bytes(os.urandom(27 * MiB + 5))
    b.write_bytes(os.urandom(2 * MiB))
    return [a, b]


def _part(number: int):
    def match(m) -> bool:
        return (f"partNumber={number}&" in m.target or m.target.endswith(f"partNumber={number}")
                ) and "x-amz-copy-source" not in m.headers
    return match


def _publish(s3env, endpoint, files, **kw):
    return trtet_store.publish(files, f"s3://{s3env.bucket}/f/model.pte", endpoint_url=endpoint,
                               part_size=PART, journal_dir=s3env.journal_dir, **kw)


def _check(s3env, files) -> None:
    for p in files:
        got = s3env.client.get_object(Bucket=s3env.bucket, Key=f"f/{p.name}")["Body"].read()
        assert got == p.read_bytes(), p.name
    uploads = s3env.client.list_multipart_uploads(Bucket=s3env.bucket).get("Uploads", [])
    assert uploads == []


def test_a_flipped_byte_in_a_part_is_refused_and_sent_again(s3env, tmp_path, tcp_proxy):
    files = _files(tmp_path)
    proxy = tcp_proxy(s3env.endpoint.url)
    flip = proxy.add(Fault("request", "flip", at=12345, match=_part(2)))
    report = _publish(s3env, proxy.url, files)
    assert flip.fired == 1 and report.retries >= 1
    _check(s3env, files)


def test_connections_reset_mid_part_are_retried(s3env, tmp_path, tcp_proxy):
    files = _files(tmp_path)
    proxy = tcp_proxy(s3env.endpoint.url)
    reset = proxy.add(Fault("request", "reset", at=MiB, match=_part(3), times=2))
    at_start = proxy.add(Fault("request", "reset", at=0, match=_part(1)))
    _publish(s3env, proxy.url, files)
    assert reset.fired == 2 and at_start.fired == 1
    _check(s3env, files)


def test_a_part_refused_every_time_keeps_the_upload_for_a_resume(s3env, tmp_path, tcp_proxy):
    files = _files(tmp_path)
    proxy = tcp_proxy(s3env.endpoint.url)
    proxy.add(Fault("request", "flip", at=7, match=_part(4), times=1000))
    with pytest.raises(ChecksumMismatchError) as info:
        _publish(s3env, proxy.url, files, concurrency=1)
    err = info.value
    assert err.upload_id and Path(err.journal).exists()
    # Nothing visible; the upload kept, with the parts before the refused one.
    listed = s3env.client.list_objects_v2(Bucket=s3env.bucket, Prefix="f/").get("Contents", [])
    assert listed == []
    uploads = s3env.client.list_multipart_uploads(Bucket=s3env.bucket)["Uploads"]
    assert [u["UploadId"] for u in uploads] == [err.upload_id]
    proxy.clear()
    report = _publish(s3env, proxy.url, files)
    assert report.objects[0].resumed_upload and report.bytes_resumed >= 3 * PART
    assert report.bytes_sent <= report.bytes_total - 3 * PART
    _check(s3env, files)
    assert not Path(err.journal).exists()


def test_a_flipped_byte_in_the_manifest_is_refused_and_sent_again(s3env, tmp_path, tcp_proxy):
    files = _files(tmp_path)
    proxy = tcp_proxy(s3env.endpoint.url)
    flip = proxy.add(Fault("request", "flip", at=3,
                           match=lambda m: m.method == "PUT" and ".trtet.json" in m.target))
    _publish(s3env, proxy.url, files)
    assert flip.fired == 1
    _check(s3env, files)
    s3env.client.head_object(Bucket=s3env.bucket, Key=manifest_key("f/model.pte"))


def test_a_lost_answer_to_complete(s3env, tmp_path, tcp_proxy):
    """The server completed, the answer was reset: the retry finds our object, not a conflict."""
    files = _files(tmp_path)
    proxy = tcp_proxy(s3env.endpoint.url)
    lost = proxy.add(Fault("response", "reset", at=0,
                           match=lambda m: m.method == "POST" and "uploadId=" in m.target
                           and "model.pte" in m.target))
    report = _publish(s3env, proxy.url, files)
    assert lost.fired == 1 and report.objects[0].etag
    _check(s3env, files)


def test_the_server_stopped_and_started_mid_upload(s3env, tmp_path):
    """Parts fail while it is down; the publish retries or is resumed, and the object is whole."""
    files = _files(tmp_path)
    halfway = threading.Event()

    def progress(p) -> None:
        if p.sent >= 2 * PART:
            halfway.set()

    outcome: list = []

    def run() -> None:
        try:
            outcome.append(_publish(s3env, s3env.endpoint.url, files, concurrency=1,
                                    progress=progress))
        except Exception as exc:  # noqa: BLE001 - the test reads it
            outcome.append(exc)

    t = threading.Thread(target=run)
    t.start()
    assert halfway.wait(120)
    s3env.server.stop()
    s3env.server.start()
    t.join(300)
    first = outcome[0]
    if isinstance(first, Exception):
        # Down longer than the retries: the upload was kept, and this resumes it.
        assert isinstance(first, UploadKeptError), first
        report = _publish(s3env, s3env.endpoint.url, files)
        assert report.bytes_resumed >= 2 * PART
    else:
        report = first
        assert report.retries >= 1
    _check(s3env, files)


def test_nothing_is_left_when_a_publish_is_aborted(s3env, tmp_path, tcp_proxy):
    """``abort`` lists and aborts the kept upload and removes its journal."""
    from trtet_store.remote import abort, list_uploads

    files = _files(tmp_path)
    proxy = tcp_proxy(s3env.endpoint.url)
    proxy.add(Fault("request", "flip", at=7, match=_part(2), times=1000))
    with pytest.raises(ChecksumMismatchError) as info:
        _publish(s3env, proxy.url, files, concurrency=1)
    url = f"s3://{s3env.bucket}/f/model.pte"
    open_ = list_uploads(f"s3://{s3env.bucket}/f/", endpoint_url=s3env.endpoint.url)
    assert [u.upload_id for u in open_] == [info.value.upload_id]
    aborted = abort(url, endpoint_url=proxy.url, journal_dir=s3env.journal_dir)
    assert [u.upload_id for u in aborted] == [info.value.upload_id]
    assert not Path(info.value.journal).exists()
    assert_nothing_under(s3env, "f/")


def test_stopped_between_the_objects_and_the_manifest(s3env, tmp_path, monkeypatch):
    """The objects completed, the manifest not written: not published; the next run commits it."""
    from botocore.exceptions import ClientError

    import trtet_store.remote.upload.send as pub

    files = _files(tmp_path)
    commit = pub._put_manifest

    def crash(*args, **kwargs):
        raise KeyboardInterrupt  # the process dies right before its commit point

    monkeypatch.setattr(pub, "_put_manifest", crash)
    with pytest.raises(KeyboardInterrupt):
        _publish(s3env, s3env.endpoint.url, files)
    with pytest.raises(ClientError):
        s3env.client.head_object(Bucket=s3env.bucket, Key=manifest_key("f/model.pte"))
    monkeypatch.setattr(pub, "_put_manifest", commit)
    report = _publish(s3env, s3env.endpoint.url, files)
    total = sum(p.stat().st_size for p in files)
    assert report.bytes_sent == 0 and report.bytes_resumed == total
    _check(s3env, files)
    s3env.client.head_object(Bucket=s3env.bucket, Key=manifest_key("f/model.pte"))
    assert not any(s3env.journal_dir.iterdir())
