"""One S3 vocabulary, translated once (issue 35, item 2).

Every botocore call of publish and fetch goes through
:class:`trtet_store.remote.s3.S3`, and every error botocore (or the
connection under a body) raises goes through :func:`trtet_store.remote.s3.translate`:
the union of what the publisher and the fetcher each knew. The table below is
built from real botocore exception objects; each row goes through the
translator itself, then through one publish call (:meth:`S3.put`) and one
fetch call (:meth:`Reader.get_range`) of a client whose call raises it, and
must give the same class three times. Codes are tried without an HTTP status
(and statuses without a code), so each member of each set is tested on its
own, not hidden behind ``status == 403``.

Then the real thing, against SeaweedFS: wrong credentials and a missing
bucket, through ``fetch`` and ``publish``; a body cut short is
:class:`ReadInterrupted`; a request-level failure is not retried by hand;
importing the fetch loads no boto3, botocore or awscrt; a missing extra says
how to install it.
"""

from __future__ import annotations

import http.client
import subprocess
import sys
from pathlib import Path

import pytest
from botocore.exceptions import (
    ClientError,
    ConnectionClosedError,
    ConnectTimeoutError,
    EndpointConnectionError,
    IncompleteReadError,
    NoCredentialsError,
    ReadTimeoutError,
    ResponseStreamingError,
)
from tcp_proxy import Fault
from test_fetch_support import MiB, engine_bytes
from urllib3.exceptions import ProtocolError

import trtet_store
from trtet_store.remote.download.reader import Reader
from trtet_store.remote.download.receive import fetch
from trtet_store.remote.errors import (
    AccessDeniedError,
    BucketNotFoundError,
    EndpointUnreachableError,
    FetchInterruptedError,
    ObjectChangedError,
    ObjectNotFoundError,
    RemoteError,
)
from trtet_store.remote.s3 import (
    S3,
    BadDigest,
    NoSuchUpload,
    PreconditionFailed,
    ReadInterrupted,
    Transient,
    Unreachable,
    translate,
)
from trtet_store.testing.s3server import S3Endpoint


def client_error(code: str, status: int = 0, op: str = "GetObject") -> ClientError:
    """botocore's own ClientError, as its parser builds it (no status: a code-only answer)."""
    response: dict = {"Error": {"Code": code, "Message": "test"} if code else {},
                      "ResponseMetadata": {"HTTPStatusCode": status} if status else {}}
    return ClientError(response, op)


# (what botocore raised, the one class it means). Codes of both old sets, each alone.
CASES = [
    *[(client_error(code), AccessDeniedError) for code in (
        "AccessDenied", "Forbidden", "403", "SignatureDoesNotMatch", "InvalidAccessKeyId",
        "InvalidToken", "ExpiredToken", "AllAccessDisabled")],
    (client_error("", 403), AccessDeniedError),
    (client_error("NoSuchBucket", 404), BucketNotFoundError),
    (client_error("NoSuchBucket"), BucketNotFoundError),
    *[(client_error(code), ObjectNotFoundError) for code in ("NoSuchKey", "404", "NotFound")],
    (client_error("", 404), ObjectNotFoundError),
    (client_error("NoSuchUpload", 404), NoSuchUpload),
    *[(client_error(code), PreconditionFailed) for code in ("PreconditionFailed", "412")],
    (client_error("", 412), PreconditionFailed),
    *[(client_error(code), BadDigest) for code in (
        "BadDigest", "InvalidDigest", "XAmzContentChecksumMismatch",
        "XAmzContentSHA256Mismatch")],
    *[(client_error(code), Transient) for code in (
        "500", "502", "503", "504", "InternalError", "ServiceUnavailable", "SlowDown",
        "RequestTimeout", "RequestTimeTooSkewed", "OperationAborted")],
    (client_error("", 503), Transient),
    (client_error("SomethingNew", 501), Transient),
    (client_error("NotImplemented", 501), RemoteError),  # the same on every retry
    (client_error("InvalidRange", 416), RemoteError),
    (NoCredentialsError(), AccessDeniedError),
    (EndpointConnectionError(endpoint_url="http://127.0.0.1:1/b/k"), Unreachable),
    (ConnectTimeoutError(endpoint_url="http://127.0.0.1:1/b/k"), Transient),
    (ConnectionClosedError(endpoint_url="http://127.0.0.1:1/b/k"), Transient),
    (ReadTimeoutError(endpoint_url="http://127.0.0.1:1/b/k"), Transient),
    (ConnectionResetError(104, "reset"), Transient),
]


class Raising:
    """A botocore client stand-in whose every call raises ``exc`` (nothing else is faked)."""

    class meta:  # noqa: N801 - botocore's attribute name
        endpoint_url = "http://127.0.0.1:1"

    def __init__(self, exc: BaseException) -> None:
        self.exc = exc

    def put_object(self, **kwargs):
        raise self.exc

    def get_object(self, **kwargs):
        raise self.exc


def _name(case) -> str:
    exc, _ = case
    response = getattr(exc, "response", None) or {}
    code = response.get("Error", {}).get("Code", "")
    status = response.get("ResponseMetadata", {}).get("HTTPStatusCode", "")
    return f"{type(exc).__name__}-{code}-{status}"


@pytest.mark.parametrize("case", CASES, ids=[_name(c) for c in CASES])
def test_one_translator_maps_each_code_to_one_class_for_both_halves(case):
    exc, expected = case
    got = translate(exc, "GetObject", "b", "k", etag="e1", endpoint="http://127.0.0.1:1")
    assert type(got) is expected, (exc, got)
    publish_half = S3(client=Raising(exc))
    with pytest.raises(RemoteError) as by_publish:
        publish_half.put("b", "k", b"{}", "AAAAAAAAAAA=")
    fetch_half = Reader(S3(client=Raising(exc)), "b")
    with pytest.raises(RemoteError) as by_fetch:
        fetch_half.get_range("k", "e1", 0, 10, memoryview(bytearray(10)))
    assert type(by_publish.value) is expected, by_publish.value
    assert type(by_fetch.value) is expected, by_fetch.value


def test_what_each_class_is_to_the_callers():
    denied = translate(client_error("Forbidden"), "HeadObject", "b", "k")
    assert isinstance(denied, PermissionError) and "access denied (Forbidden)" in str(denied)
    changed = translate(client_error("", 412), "GetObject", "b", "k", etag="e1")
    # A fetch catches ObjectChangedError (and restarts); a publish PreconditionFailed.
    assert isinstance(changed, ObjectChangedError) and changed.key == "k"
    assert "ETag e1" in str(changed)
    gone = translate(client_error("NoSuchKey", 404), "GetObject", "b", "k")
    assert isinstance(gone, FileNotFoundError) and "s3://b/k: no such object" in str(gone)
    unreachable = translate(EndpointConnectionError(endpoint_url="http://127.0.0.1:1/b/k"),
                            "HeadObject", "b", "k")
    assert isinstance(unreachable, EndpointUnreachableError)
    assert isinstance(unreachable, Transient)  # a publish keeps its upload for a resume
    assert "could not connect to 127.0.0.1:1" in str(unreachable)
    assert unreachable.address == "127.0.0.1:1"
    bug = ValueError("not the network's")
    assert translate(bug, "GetObject", "b", "k") is bug  # a bug is never dressed up


@pytest.mark.parametrize("exc", [
    ResponseStreamingError(error=ProtocolError("Connection broken")),
    IncompleteReadError(actual_bytes=3, expected_bytes=10),
    ReadTimeoutError(endpoint_url="http://127.0.0.1:1/b/k"),
    ProtocolError("Connection broken: reset"),
    http.client.IncompleteRead(b"abc", 7),
    ConnectionResetError(104, "reset"),
    client_error("SlowDown", 503),
], ids=lambda e: type(e).__name__)
def test_a_failure_while_a_body_is_read_is_read_interrupted(exc):
    """The one failure the fetch retries by hand; request-level ones are botocore's."""
    assert type(translate(exc, "GetObject", "b", "k", reading=True)) is ReadInterrupted
    assert type(translate(exc, "GetObject", "b", "k")) is Transient


# --- the real server -----------------------------------------------------------------------


def _program(directory: Path) -> list[Path]:
    directory.mkdir(parents=True, exist_ok=True)
    pte, ptd = directory / "model.pte", directory / "w1.ptd"
    pte.write_bytes(engine_bytes(1, MiB + 17))
    ptd.write_bytes(engine_bytes(2, 3000))
    return [pte, ptd]


def test_wrong_credentials_say_access_denied_in_both_halves(s3env, tmp_path, monkeypatch):
    files = _program(tmp_path / "src")
    before = {p: p.read_bytes() for p in files}
    s3env.client.put_object(Bucket=s3env.bucket, Key="w/model.pte", Body=b"x" * 100)
    wrong = S3Endpoint(s3env.endpoint.url, secret_key="not-the-secret").client()
    out = tmp_path / "out"
    out.mkdir()
    with pytest.raises(AccessDeniedError) as by_fetch:
        fetch(f"s3://{s3env.bucket}/w/model.pte", out / "model.pte", client=wrong)
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "not-the-secret")
    with pytest.raises(AccessDeniedError) as by_publish:
        trtet_store.publish(files, f"s3://{s3env.bucket}/p/model.pte",
                            endpoint_url=s3env.endpoint.url, journal_dir=s3env.journal_dir)
    for err in (by_fetch.value, by_publish.value):
        assert "was refused: access denied (" in str(err), err
        assert "check the credentials" in str(err), err
    assert list(out.iterdir()) == []
    assert {p: p.read_bytes() for p in files} == before
    listed = s3env.client.list_objects_v2(Bucket=s3env.bucket).get("Contents", [])
    assert [o["Key"] for o in listed] == ["w/model.pte"]
    assert s3env.client.list_multipart_uploads(Bucket=s3env.bucket).get("Uploads", []) == []


def test_a_missing_bucket_in_both_halves(s3env, tmp_path):
    files = _program(tmp_path / "src")
    out = tmp_path / "out"
    out.mkdir()
    with pytest.raises(BucketNotFoundError, match="does not exist") as by_fetch:
        fetch("s3://no-such-bucket-trtet/p/model.pte", out / "model.pte", client=s3env.client)
    with pytest.raises(BucketNotFoundError, match="does not exist"):
        trtet_store.publish(files, "s3://no-such-bucket-trtet/p/model.pte",
                            endpoint_url=s3env.endpoint.url, journal_dir=s3env.journal_dir)
    assert "'no-such-bucket-trtet'" in str(by_fetch.value)
    assert list(out.iterdir()) == []
    names = [b["Name"] for b in s3env.client.list_buckets()["Buckets"]]
    assert "no-such-bucket-trtet" not in names


def test_a_body_cut_short_is_read_interrupted_and_a_412_is_object_changed(s3, tcp_proxy):
    data = engine_bytes(3, 2 * MiB)
    etag = s3.client.put_object(Bucket=s3.bucket, Key="b.bin", Body=data)["ETag"].strip('"')
    proxy = tcp_proxy(s3.endpoint.url, [Fault("response", "reset", at=5000, times=1)])
    s3p = S3(client=S3Endpoint(proxy.url).client(retries={"max_attempts": 1}, read_timeout=5))
    buf = memoryview(bytearray(MiB))
    with (pytest.raises(ReadInterrupted, match="GetObject s3://"),
          s3p.get_range(s3.bucket, "b.bin", 0, MiB, etag) as body):
        body.read_into(buf)
    with s3p.get_range(s3.bucket, "b.bin", MiB, 2 * MiB, etag) as body:  # the link is back
        body.read_into(buf)
    assert bytes(buf) == data[MiB:]
    with pytest.raises(PreconditionFailed, match="ETag not-it"):
        s3p.get_range(s3.bucket, "b.bin", 0, 10, "not-it")
    assert s3p.answered


def test_a_request_that_fails_through_botocores_retries_is_not_retried_by_hand(s3, here_fs):
    """503 on every ranged GET: one call per range (botocore's retries are the client's)."""
    data = engine_bytes(4, 2 * MiB)
    s3.client.put_object(Bucket=s3.bucket, Key="r.bin", Body=data,
                         ChecksumAlgorithm="CRC64NVME")
    client = s3.endpoint.client(retries={"max_attempts": 1})
    ranged: list[str] = []

    class SlowingDown:
        """The real client, whose ranged GetObject calls are answered 503 SlowDown."""

        meta = client.meta

        def __getattr__(self, name):
            return getattr(client, name)

        def get_object(self, **kwargs):
            if "Range" not in kwargs:
                return client.get_object(**kwargs)
            ranged.append(kwargs["Range"])
            raise client_error("SlowDown", 503)

    with pytest.raises(FetchInterruptedError, match="SlowDown") as info:
        fetch(f"s3://{s3.bucket}/r.bin", here_fs / "r.bin", client=SlowingDown(),
              range_size=MiB, concurrency=1, attempts=3)
    assert len(ranged) == 1, ranged
    assert info.value.resume.startswith("trtet-store fetch ")
    assert not (here_fs / "r.bin").exists()


def test_importing_the_fetch_loads_no_boto3_botocore_or_awscrt():
    code = ("import sys, trtet_store.remote, trtet_store.remote.download.receive, "
            "trtet_store.remote.download.reuse, trtet_store.remote.upload.send;"
            "print([m for m in ('boto3', 'botocore', 'awscrt', 'urllib3') if m in sys.modules])")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         check=True).stdout
    assert out.strip() == "[]"


@pytest.mark.parametrize(("blocked", "call"), [
    ("boto3", "from trtet_store.remote.s3 import S3; S3('http://127.0.0.1:1')"),
    ("awscrt", "from trtet_store.remote.checksum import crc64nvme; crc64nvme(b'x')"),
    ("awscrt", "from trtet_store.remote.checksum import crc_functions; crc_functions('crc32c')"),
])
def test_a_missing_extra_says_install_trtet_store_s3(blocked, call):
    # sys.modules[name] = None is Python's own way to make an import fail (no files touched).
    code = (f"import sys; sys.modules[{blocked!r}] = None\n"
            f"try:\n    {call}\nexcept ImportError as e:\n    print(e)\n")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         check=True).stdout
    assert "install trtet-store[s3]" in out, out
