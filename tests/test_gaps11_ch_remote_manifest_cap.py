"""A program manifest over MANIFEST_MAX_BYTES is refused before its body is read.

remote/download/describe.py ``describe`` reads the manifest with
``Reader.get_small`` -> ``S3.get`` (remote/s3.py), whose ``limit`` is
MANIFEST_MAX_BYTES (16 MiB): a bucket writer's manifest one byte over it is a
ManifestError naming its size, raised on the GetObject's ContentLength, so the bytes
that cross the wire are the headers and at most a little of the body (counted on a
real proxy in front of SeaweedFS), not 16 MiB. One exactly at the cap is read (and
then refused as not JSON): the cap is ``>``, not ``>=``. The destination is untouched.
"""

from __future__ import annotations

import botocore.response
import pytest
from attacker import listing

from trtet_store.remote.download.receive import fetch
from trtet_store.remote.errors import ManifestError
from trtet_store.remote.jsondoc import MANIFEST_MAX_BYTES
from trtet_store.remote.manifest import manifest_key

KEY = "big/model.pte"


def _setup(s3env, size: int, tmp_path):
    s3env.client.put_object(Bucket=s3env.bucket, Key=KEY, Body=b"a program")
    s3env.client.put_object(Bucket=s3env.bucket, Key=manifest_key(KEY), Body=b" " * size)
    out = tmp_path / "out"
    out.mkdir()
    (out / "model.pte").write_bytes(b"the version that runs")
    return out, listing(out)


def _counting_body_reads(monkeypatch) -> list[int]:
    """The bytes the client reads from response bodies (botocore's StreamingBody.read).

    Counted at the client, not on the wire: how much of a body the kernel's socket
    buffers take in before the client closes the connection depends on the machine (a
    CI run saw 5 MiB cross the proxy for a body the client never read).
    """
    got: list[int] = []
    real = botocore.response.StreamingBody.read

    def read(self, *args, **kwargs):
        data = real(self, *args, **kwargs)
        got.append(len(data))
        return data

    monkeypatch.setattr(botocore.response.StreamingBody, "read", read)
    return got


def test_describe_refuses_a_manifest_one_byte_over_the_cap_unread(s3env, proxy, tmp_path,
                                                                   monkeypatch):
    assert MANIFEST_MAX_BYTES == 16 << 20
    out, before = _setup(s3env, MANIFEST_MAX_BYTES + 1, tmp_path)
    down = proxy.downstream
    reads = _counting_body_reads(monkeypatch)
    with pytest.raises(ManifestError, match=rf"is {MANIFEST_MAX_BYTES + 1} bytes, more than "
                                            rf"the {MANIFEST_MAX_BYTES} a manifest"):
        fetch(f"s3://{s3env.bucket}/{KEY}", out / "model.pte", endpoint_url=proxy.endpoint_url)
    # The body was not read by the client (the program's own small GETs aside), and
    # less than the manifest crossed the wire.
    assert sum(reads) < 64 << 10, sum(reads)
    assert proxy.downstream - down < MANIFEST_MAX_BYTES, proxy.downstream - down
    assert listing(out) == before


def test_describe_reads_a_manifest_exactly_at_the_cap(s3env, proxy, tmp_path):
    out, before = _setup(s3env, MANIFEST_MAX_BYTES, tmp_path)
    with pytest.raises(ManifestError) as caught:
        fetch(f"s3://{s3env.bucket}/{KEY}", out / "model.pte", endpoint_url=proxy.endpoint_url)
    assert "more than the" not in str(caught.value)  # at the cap: read, then not JSON
    assert listing(out) == before
