"""Every refusal of publish leaves nothing visible under the key and no upload open.

Bad inputs (issue 23, item 7): a missing bucket, refused credentials, a key
that exists without ``replace``, a staged piece changed since staging (before
the publish, and while it runs), a part size that cannot fit; and two
publishers of one key, where one wins and the other gets the conflict error
(on SeaweedFS, which checks a Complete's condition apart from its write, both
may get it, and no reader takes a set that mixes them).
"""

from __future__ import annotations

import importlib
import os
import threading
from pathlib import Path

import pytest
from test_publish import assert_nothing_under, build_program

import trtet_store
from trtet_store.io import SourceChangedError
from trtet_store.io.units import MiB
from trtet_store.remote import (
    AccessDeniedError,
    BucketNotFoundError,
    ConflictError,
    KeyExistsError,
    Manifest,
    PartSizeError,
    RemoteURLError,
    manifest_key,
)


def _files(directory: Path, tag: bytes, sizes=(12 * MiB, 3 * MiB)) -> list[Path]:
    directory.mkdir(parents=True, exist_ok=True)
    out = []
    for i, size in enumerate(sizes):
        p = directory / ("model.pte" if i == 0 else f"w{i}.ptd")
        block = (tag * (MiB // len(tag) + 1))[:MiB]
        p.write_bytes(block * (size // MiB) + os.urandom(size % MiB + 17))
        out.append(p)
    return out


def _digests(paths) -> dict[str, bytes]:
    return {p.name: p.read_bytes() for p in paths}


def _publish(s3env, source, key="p/model.pte", **kw):
    kw.setdefault("endpoint_url", s3env.endpoint.url)
    kw.setdefault("journal_dir", s3env.journal_dir)
    return trtet_store.publish(source, f"s3://{s3env.bucket}/{key}", **kw)


def test_a_missing_bucket(s3env, tmp_path):
    files = _files(tmp_path, b"a")
    before = _digests(files)
    with pytest.raises(BucketNotFoundError, match="does not exist"):
        trtet_store.publish(files, "s3://no-such-bucket-trtet/p/model.pte",
                            endpoint_url=s3env.endpoint.url, journal_dir=s3env.journal_dir)
    names = [b["Name"] for b in s3env.client.list_buckets()["Buckets"]]
    assert "no-such-bucket-trtet" not in names
    assert _digests(files) == before
    assert not s3env.journal_dir.exists() or not any(s3env.journal_dir.iterdir())


def test_refused_credentials(s3env, tmp_path, monkeypatch):
    files = _files(tmp_path, b"a")
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "not-the-secret")
    with pytest.raises(AccessDeniedError, match="refused"):
        _publish(s3env, files)
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", "nobody")
    with pytest.raises(AccessDeniedError):
        _publish(s3env, files)
    assert_nothing_under(s3env, "p/")


@pytest.mark.parametrize("existing", ["program", "ptd", "manifest"])
def test_an_existing_key_without_replace(s3env, tmp_path, existing):
    files = _files(tmp_path, b"a")
    key = {"program": "p/model.pte", "ptd": "p/w1.ptd",
           "manifest": manifest_key("p/model.pte")}[existing]
    s3env.client.put_object(Bucket=s3env.bucket, Key=key, Body=b"theirs")
    etag = s3env.client.head_object(Bucket=s3env.bucket, Key=key)["ETag"]
    with pytest.raises(KeyExistsError, match="replace=True"):
        _publish(s3env, files)
    listed = s3env.client.list_objects_v2(Bucket=s3env.bucket, Prefix="p/")["Contents"]
    assert [o["Key"] for o in listed] == [key]
    assert s3env.client.head_object(Bucket=s3env.bucket, Key=key)["ETag"] == etag
    assert s3env.client.list_multipart_uploads(Bucket=s3env.bucket).get("Uploads", []) == []


def test_part_sizes_that_cannot_fit(s3env, tmp_path):
    files = _files(tmp_path, b"a")
    for size in (4 * MiB, 5 * 1024 * MiB + 1):
        with pytest.raises(PartSizeError, match="outside S3's limits"):
            _publish(s3env, files, part_size=size)
    big = tmp_path / "big.pte"  # sparse: 60 GiB in 5 MiB parts would be 12,288 parts
    with open(big, "wb") as f:
        f.truncate(60 * 1024 * MiB)
    with pytest.raises(PartSizeError, match="10000"):
        _publish(s3env, [big], part_size=5 * MiB)
    assert_nothing_under(s3env, "p/")


def test_bad_arguments_are_refused_before_any_request(s3env, tmp_path):
    files = _files(tmp_path, b"a")
    for url in ("s3://", "s3://b", f"s3://{s3env.bucket}/", "http://x/y",
                f"s3://{s3env.bucket}/a/../b"):
        with pytest.raises(RemoteURLError):
            trtet_store.publish(files, url, endpoint_url=s3env.endpoint.url)
    with pytest.raises(TypeError):
        _publish(s3env, files, no_such_option=1)
    with pytest.raises(ValueError, match="concurrency"):
        _publish(s3env, files, concurrency=0)
    with pytest.raises(FileNotFoundError):
        _publish(s3env, [tmp_path / "missing.pte"])
    with pytest.raises(TypeError, match="ExecutorchProgramManager"):
        _publish(s3env, object())
    assert_nothing_under(s3env, "")


@pytest.fixture(scope="module")
def small_program_parts():
    return (6 * MiB, 6 * MiB)


def test_a_staged_engine_changed_since_staging(s3env, here_fs, small_program_parts):
    """Its sealed identity differs: refused before anything is created."""
    with trtet_store.BlobStore(here_fs / "staging") as store:
        program = build_program(store, small_program_parts, (1, 2), ptd=False)
        blob = next(iter(store.blobs()))
        content = Path(blob.path).read_bytes()
        os.utime(blob.path, ns=(1, 1))  # same bytes, another identity
        with pytest.raises(SourceChangedError, match="changed after it was staged"):
            _publish(s3env, program, part_size=5 * MiB)
        assert Path(blob.path).read_bytes() == content
    assert_nothing_under(s3env, "")


def test_a_staged_engine_changed_while_it_is_published(s3env, here_fs, small_program_parts):
    """Written to after its first part was read: the uploads are aborted, nothing is visible."""
    with trtet_store.BlobStore(here_fs / "staging") as store:
        program = build_program(store, small_program_parts, (1, 2), ptd=False)
        last = sorted(store.blobs(), key=lambda b: str(b.path))[-1]
        changed = threading.Event()

        def tamper(p) -> None:
            if p.done and not changed.is_set():
                changed.set()
                with open(last.path, "r+b") as f:
                    os.pwrite(f.fileno(), b"\xff", last.size - 1)

        with pytest.raises(SourceChangedError):
            _publish(s3env, program, part_size=5 * MiB, concurrency=1, progress=tamper)
        assert changed.is_set()
    assert_nothing_under(s3env, "")
    assert not s3env.journal_dir.exists() or not any(s3env.journal_dir.iterdir())


@pytest.mark.parametrize("replace", [False, True])
def test_two_publishers_of_one_key(s3env, tmp_path, replace):
    """One wins, the other gets the conflict error; the winner's program survives whole.

    Whoever committed the manifest under the key (the winner, or with
    ``replace`` and no winner the old program) must still be fetched byte for
    byte: a loser's Complete never overwrites a version the manifest names
    (mutant 02 of issue 34 dropped its ``If-Match``; the deterministic case is
    tests/test_publish_neighbours.py).
    """
    old = _files(tmp_path / "old", b"O")
    sets = [_files(tmp_path / "a", b"A"), _files(tmp_path / "b", b"B")]
    if replace:
        _publish(s3env, old, part_size=5 * MiB)
    barrier = threading.Barrier(2)
    results: list = [None, None]

    def run(i: int) -> None:
        barrier.wait()
        try:
            results[i] = _publish(s3env, sets[i], part_size=5 * MiB, replace=replace,
                                  journal_dir=tmp_path / f"journal-{i}")
        except Exception as exc:  # noqa: BLE001 - the test reads it
            results[i] = exc

    threads = [threading.Thread(target=run, args=(i,)) for i in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(120)
    errors = [r for r in results if isinstance(r, Exception)]
    assert errors and all(isinstance(e, ConflictError) for e in errors), results
    assert s3env.client.list_multipart_uploads(Bucket=s3env.bucket).get("Uploads", []) == []
    if len(errors) == 1:
        winner = 0 if not isinstance(results[0], Exception) else 1
        head = s3env.client.head_object(Bucket=s3env.bucket, Key=manifest_key("p/model.pte"))
        assert head["ETag"].strip('"') == results[winner].manifest_etag
        _assert_survives(s3env, sets[winner], tmp_path / "got")
        return
    # Both failed. SeaweedFS checks a Complete's condition apart from its write, so both
    # can pass it, interleaved: then each finds the other's object under a key, and
    # neither reports success. A manifest still naming what is there is a whole program
    # (with replace, the old one: nobody committed); one naming versions that are gone
    # is refused by readers.
    if replace and _consistent(s3env):
        _assert_survives(s3env, old, tmp_path / "got")
    else:
        _assert_refused_if_stale(s3env, tmp_path)


def _consistent(s3env) -> bool:
    """A manifest under p/model.pte names the ETag of every object there."""
    try:
        body = s3env.client.get_object(Bucket=s3env.bucket,
                                       Key=manifest_key("p/model.pte"))["Body"].read()
    except s3env.client.exceptions.NoSuchKey:
        return False
    return all(s3env.client.head_object(Bucket=s3env.bucket, Key=o.key)["ETag"].strip('"')
               == o.etag for o in Manifest.from_json(body).objects)


def _assert_survives(s3env, files: list[Path], into: Path) -> None:
    """p/model.pte's manifest names what is there, and fetch gives ``files``' bytes."""
    assert _consistent(s3env)
    into.mkdir()
    trtet_store.fetch(f"s3://{s3env.bucket}/p/model.pte", into / "model.pte",
                      client=s3env.client)
    assert sorted(p.name for p in into.iterdir()) == sorted(p.name for p in files)
    for p in files:
        assert (into / p.name).read_bytes() == p.read_bytes(), p


def _assert_refused_if_stale(s3env, tmp_path: Path) -> None:
    """A manifest under p/model.pte whose ETags are not the objects' is refused by fetch."""
    from trtet_store.remote.errors import ObjectChangedError

    try:
        body = s3env.client.get_object(Bucket=s3env.bucket,
                                       Key=manifest_key("p/model.pte"))["Body"].read()
    except s3env.client.exceptions.NoSuchKey:
        return
    manifest = Manifest.from_json(body)
    if all(s3env.client.head_object(Bucket=s3env.bucket, Key=o.key)["ETag"].strip('"')
           == o.etag for o in manifest.objects):
        return
    got = tmp_path / "fetched"
    got.mkdir()
    with pytest.raises(ObjectChangedError):
        trtet_store.fetch(f"s3://{s3env.bucket}/p/model.pte", got / "model.pte",
                          client=s3env.client)
    assert list(got.iterdir()) == []


def test_a_writer_the_server_let_through_beside_us_is_a_conflict(s3env, tmp_path, monkeypatch):
    """Our Complete succeeds, then another writer's object lands under the key.

    SeaweedFS checks Complete's ``If-Match`` apart from the write, so two replacing
    publishers can both pass it (CI saw it). The loser must get a ConflictError, not
    a checksum error, and write no manifest; the other writer's object stays.
    """
    from trtet_store.remote import s3 as s3_module

    old = _files(tmp_path / "old", b"O")
    _publish(s3env, old, part_size=5 * MiB)
    manifest_before = s3env.client.get_object(
        Bucket=s3env.bucket, Key=manifest_key("p/model.pte"))["Body"].read()
    other = os.urandom(MiB + 3)
    real_complete = s3_module.S3.complete

    def complete_then_lose_the_race(self, bucket, key, *args, **kwargs):
        etag = real_complete(self, bucket, key, *args, **kwargs)
        s3env.client.put_object(Bucket=bucket, Key=key, Body=other)
        return etag

    monkeypatch.setattr(s3_module.S3, "complete", complete_then_lose_the_race)
    new = _files(tmp_path / "new", b"N")
    with pytest.raises(ConflictError, match="replaced by another writer"):
        _publish(s3env, new, part_size=5 * MiB, replace=True,
                 journal_dir=tmp_path / "journal-new")
    monkeypatch.undo()
    got = s3env.client.get_object(Bucket=s3env.bucket, Key="p/model.pte")["Body"].read()
    assert got == other
    assert s3env.client.get_object(Bucket=s3env.bucket, Key=manifest_key("p/model.pte"))[
        "Body"].read() == manifest_before
    assert s3env.client.list_multipart_uploads(Bucket=s3env.bucket).get("Uploads", []) == []
    assert not any((tmp_path / "journal-new").glob("*"))


def test_a_writer_landing_after_our_manifest_makes_the_publish_fail(s3env, tmp_path,
                                                                    monkeypatch):
    """Another writer's object lands after our manifest (its Complete checked beside ours).

    The manifest names a version that is gone: the publish must not report success,
    and a reader refuses that manifest rather than mixing versions.
    """
    from trtet_store.remote.errors import ObjectChangedError
    # importlib: the package's lazy ``publish`` attribute is the function.
    publish_module = importlib.import_module("trtet_store.remote.upload.send")

    _publish(s3env, _files(tmp_path / "old", b"O"), part_size=5 * MiB)
    other = os.urandom(MiB + 3)
    real_put_manifest = publish_module._put_manifest

    def put_manifest_then_lose_the_race(s3, bucket, *args, **kwargs):
        etag = real_put_manifest(s3, bucket, *args, **kwargs)
        s3env.client.put_object(Bucket=bucket, Key="p/w1.ptd", Body=other)
        return etag

    monkeypatch.setattr(publish_module, "_put_manifest", put_manifest_then_lose_the_race)
    new = _files(tmp_path / "new", b"N")
    with pytest.raises(ConflictError, match="w1.ptd was replaced by another writer after our"):
        _publish(s3env, new, part_size=5 * MiB, replace=True,
                 journal_dir=tmp_path / "journal-new")
    monkeypatch.undo()
    assert s3env.client.get_object(Bucket=s3env.bucket, Key="p/w1.ptd")["Body"].read() == other
    assert s3env.client.list_multipart_uploads(Bucket=s3env.bucket).get("Uploads", []) == []
    assert not any((tmp_path / "journal-new").glob("*"))
    (tmp_path / "got").mkdir()
    with pytest.raises(ObjectChangedError):
        trtet_store.fetch(f"s3://{s3env.bucket}/p/model.pte", tmp_path / "got" / "model.pte",
                          client=s3env.client)
    assert list((tmp_path / "got").iterdir()) == []
