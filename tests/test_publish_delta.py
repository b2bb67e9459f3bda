"""A re-publish sends only what changed; the rest is copied server-side (UploadPartCopy).

Bytes sent are counted twice: by the publish's report and, independently, by
a loopback proxy between client and server that counts PUT body bytes (parts,
the manifest, index entries; a part copy's PUT has no body).
"""

from __future__ import annotations

from pathlib import Path

from test_publish import build_program, file_xxh3, object_xxh3, saved_digests

import trtet_store
from trtet_store.io.units import MiB
from trtet_store.remote import Manifest, manifest_key
from trtet_store.remote.manifest import MIN_PART_SIZE

ENGINE = 24 * MiB
PART = 5 * MiB


def _publish(s3env, proxy, program, key, **kw):
    return trtet_store.publish(program, f"s3://{s3env.bucket}/{key}", endpoint_url=proxy.url,
                               part_size=PART, journal_dir=s3env.journal_dir, **kw)


def _inline_bytes(s3env, key: str) -> int:
    body = s3env.client.get_object(Bucket=s3env.bucket, Key=manifest_key(key))["Body"].read()
    return sum(p.size for o in Manifest.from_json(body).objects for p in o.pieces
               if p.kind == "inline")


def _put_bytes(proxy) -> int:
    return proxy.body_bytes[("request", "PUT")]


def _check_equal(s3env, program, directory: Path, prefix: str) -> None:
    for name, path in saved_digests(program, directory).items():
        digest, _ = object_xxh3(s3env.client, s3env.bucket, prefix + name)
        assert digest == file_xxh3(path), name


def test_republish_sends_only_the_changed_engine(s3env, here_fs, tcp_proxy):
    proxy = tcp_proxy(s3env.endpoint.url)
    key = "m/model.pte"
    with trtet_store.BlobStore(here_fs / "staging") as store:
        a = build_program(store, (ENGINE, ENGINE), (1, 2))
        first = _publish(s3env, proxy, a, key)
        assert first.bytes_copied == 0
        total = first.bytes_total
        inline = _inline_bytes(s3env, key)

        # Nothing changed: every object is the version already there, byte for byte
        # (pieces, digests and ETag as the manifest says): nothing sent, nothing copied.
        etags = {o.key: o.etag for o in first.objects}
        before = _put_bytes(proxy)
        same = _publish(s3env, proxy, a, key, replace=True)
        assert same.bytes_sent <= inline and same.bytes_sent < total // 100
        assert same.bytes_unchanged == total and same.bytes_copied == 0
        assert {o.key: o.etag for o in same.objects} == etags
        assert all(o.unchanged for o in same.objects)
        assert _put_bytes(proxy) - before <= inline + 64 * 1024  # + manifest and index
        _check_equal(s3env, a, here_fs / "a", "m/")

        # One engine of two changed (same size): that engine, the headers, and at each of
        # its two boundaries at most two part minimums.
        b = build_program(store, (ENGINE, ENGINE), (1, 3))
        before = _put_bytes(proxy)
        changed = _publish(s3env, proxy, b, key, replace=True)
        bound = ENGINE + inline + 2 * 2 * MIN_PART_SIZE
        assert changed.bytes_sent <= bound, (changed.bytes_sent, bound)
        assert changed.bytes_copied >= ENGINE - 2 * PART
        assert _put_bytes(proxy) - before <= bound + 64 * 1024
        _check_equal(s3env, b, here_fs / "b", "m/")
        heads = {o.name: o for o in changed.objects}
        for name, o in heads.items():
            head = s3env.client.head_object(Bucket=s3env.bucket, Key="m/" + name,
                                            ChecksumMode="ENABLED")
            assert head["ChecksumCRC64NVME"] == o.crc64nvme


def test_an_engine_published_in_another_program_is_copied_from_there(s3env, here_fs,
                                                                     tcp_proxy):
    """The engine-digest index: a program at another key reuses what is in the bucket."""
    proxy = tcp_proxy(s3env.endpoint.url)
    with trtet_store.BlobStore(here_fs / "staging") as store:
        a = build_program(store, (ENGINE, ENGINE), (1, 2), ptd=False)
        _publish(s3env, proxy, a, "one/model.pte")
        c = build_program(store, (ENGINE, ENGINE), (2, 4), ptd=False)
        other = _publish(s3env, proxy, c, "two/model.pte")
        assert other.bytes_copied >= ENGINE - 2 * PART
        assert other.bytes_sent <= other.bytes_total - ENGINE + 2 * PART
        _check_equal(s3env, c, here_fs / "c", "two/")

        # The first program replaced: its index entries name a version that is gone, so
        # the copy is refused (CopySourceIfMatch) and the bytes are sent instead.
        _publish(s3env, proxy, build_program(store, (ENGINE, ENGINE), (5, 6), ptd=False),
                 "one/model.pte", replace=True)
        d = build_program(store, (ENGINE, ENGINE), (1, 7), ptd=False)
        third = _publish(s3env, proxy, d, "three/model.pte")
        assert third.bytes_sent == third.bytes_total
        _check_equal(s3env, d, here_fs / "d", "three/")


def test_an_object_overwritten_behind_the_manifest_is_not_taken_as_unchanged(s3env, tmp_path,
                                                                          tcp_proxy):
    """Same size, other bytes, put by someone else: the re-publish writes ours again."""
    import os

    proxy = tcp_proxy(s3env.endpoint.url)
    pte = tmp_path / "model.pte"
    pte.write_bytes(os.urandom(12 * MiB + 5))
    _publish(s3env, proxy, pte, "x/model.pte")
    s3env.client.put_object(Bucket=s3env.bucket, Key="x/model.pte",
                            Body=os.urandom(12 * MiB + 5))
    again = _publish(s3env, proxy, pte, "x/model.pte", replace=True)
    assert not again.objects[0].unchanged and again.bytes_sent == pte.stat().st_size
    got = s3env.client.get_object(Bucket=s3env.bucket, Key="x/model.pte")["Body"].read()
    assert got == pte.read_bytes()


def test_a_republish_interrupted_after_its_copies_resumes_them(s3env, here_fs, tcp_proxy):
    """Copied parts already on the server are kept by the resume, with their own ETags."""
    import re

    import pytest
    from tcp_proxy import Fault

    from trtet_store.remote import ChecksumMismatchError

    def late_upload(m) -> bool:  # an uploaded (not copied) part of the changed engine
        number = re.search(r"partNumber=(\d+)", m.target)
        return (m.method == "PUT" and "model.pte" in m.target and number is not None
                and int(number.group(1)) >= 7 and "x-amz-copy-source" not in m.headers)

    proxy = tcp_proxy(s3env.endpoint.url)
    key = "r/model.pte"
    with trtet_store.BlobStore(here_fs / "staging") as store:
        _publish(s3env, proxy, build_program(store, (ENGINE, ENGINE), (1, 2)), key)
        b = build_program(store, (ENGINE, ENGINE), (1, 3))
        proxy.add(Fault("request", "flip", at=7, match=late_upload, times=1000))
        with pytest.raises(ChecksumMismatchError):
            _publish(s3env, proxy, b, key, replace=True, concurrency=1)
        proxy.clear()
        resumed = _publish(s3env, proxy, b, key, replace=True)
        pte = next(o for o in resumed.objects if o.name == "model.pte")
        assert pte.parts_resumed >= 3, pte
        _check_equal(s3env, b, here_fs / "b", "r/")
