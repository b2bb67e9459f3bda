"""No publish breaks another program, and no replace loses a version another publisher finished.

Issue 34, items 1, 3 (the bucket) and 4 (DESIGN invariant 11):

- A key that another program's manifest names belongs to that program: a
  publish beside it is refused whatever ``replace`` says, naming the owner
  and a prefix of its own (ExecuTorch names ``.ptd`` files by tag, so
  ``a.pte`` and ``b.pte`` both have a ``cpu.ptd``).
- A replace removes the old version's objects the new manifest no longer
  names, once the new manifest is committed, unless another manifest names
  them or they changed since.
- A publish of the same program that finishes between our plan and our
  Complete is never overwritten: ours gets ``ConflictError`` and the winner
  can still be fetched byte for byte. Each state is set up deterministically,
  through the progress callback or a step of the publisher wrapped in place.

Every refusal also shows nothing was lost: the sources are byte-identical,
the objects already there keep their ETags, nothing of ours is left in the
bucket, no upload is open, no journal is left.
"""

from __future__ import annotations

import importlib
import os
from pathlib import Path

import pytest

import trtet_store
from trtet_store.io.units import MiB
from trtet_store.remote import (
    ConflictError,
    FileNameError,
    KeyExistsError,
    Manifest,
    OwnedByOtherProgramError,
    manifest_key,
)

# importlib: the package's lazy ``publish`` attribute is the function, not the module.
publish_module = importlib.import_module("trtet_store.remote.upload.send")

PART = 5 * MiB


def _files(directory: Path, names: list[str], size: int = MiB + 5) -> list[Path]:
    """Random local files, the first the program."""
    directory.mkdir(parents=True, exist_ok=True)
    out = []
    for name in names:
        p = directory / name
        p.write_bytes(os.urandom(size + len(out)))
        out.append(p)
    return out


def _contents(paths: list[Path]) -> dict[Path, bytes]:
    return {p: p.read_bytes() for p in paths}


def _publish(s3env, files: list[Path], key: str, **kw):
    kw.setdefault("endpoint_url", s3env.endpoint.url)
    kw.setdefault("journal_dir", s3env.journal_dir)
    return trtet_store.publish(files, f"s3://{s3env.bucket}/{key}", part_size=PART, **kw)


def _keys(s3env, prefix: str = "") -> list[str]:
    listed = s3env.client.list_objects_v2(Bucket=s3env.bucket, Prefix=prefix)
    return sorted(o["Key"] for o in listed.get("Contents", []))


def _etags(s3env, prefix: str = "") -> dict[str, str]:
    return {k: s3env.client.head_object(Bucket=s3env.bucket, Key=k)["ETag"].strip('"')
            for k in _keys(s3env, prefix)}


def _manifest(s3env, program_key: str) -> Manifest:
    body = s3env.client.get_object(Bucket=s3env.bucket,
                                   Key=manifest_key(program_key))["Body"].read()
    return Manifest.from_json(body)


def _assert_whole(s3env, program_key: str, files: list[Path], into: Path) -> None:
    """The program's manifest names the ETag of every object, and fetch gives ``files``' bytes."""
    manifest = _manifest(s3env, program_key)
    for o in manifest.objects:
        head = s3env.client.head_object(Bucket=s3env.bucket, Key=o.key)
        assert head["ETag"].strip('"') == o.etag, o.key
    into.mkdir(parents=True)
    name = program_key.rsplit("/", 1)[-1]
    trtet_store.fetch(f"s3://{s3env.bucket}/{program_key}", into / name, client=s3env.client)
    assert sorted(p.name for p in into.iterdir()) == sorted([name] + [f.name for f in files[1:]])
    assert (into / name).read_bytes() == files[0].read_bytes()
    for f in files[1:]:
        assert (into / f.name).read_bytes() == f.read_bytes(), f.name


def _assert_no_uploads_no_journal(s3env, *journals: Path) -> None:
    assert s3env.client.list_multipart_uploads(Bucket=s3env.bucket).get("Uploads", []) == []
    for j in (s3env.journal_dir, *journals):
        assert not j.exists() or not any(j.iterdir()), list(j.iterdir())


# --- item 1: another program's object is never replaced ----------------------------------


@pytest.mark.parametrize("replace", [False, True])
def test_a_program_beside_another_cannot_take_its_ptd(s3env, tmp_path, replace):
    """b.pte beside a.pte, both with a cpu.ptd: refused, naming a.pte; a stays fetchable."""
    a = _files(tmp_path / "a", ["a.pte", "cpu.ptd"])
    _publish(s3env, a, "p/a.pte")
    before = _etags(s3env)
    b = _files(tmp_path / "b", ["b.pte", "cpu.ptd"])
    sources = _contents(b)

    with pytest.raises(OwnedByOtherProgramError) as err:
        _publish(s3env, b, "p/b.pte", replace=replace)
    msg = str(err.value)
    assert f"cpu.ptd belongs to s3://{s3env.bucket}/p/a.pte" in msg, msg
    assert f"a prefix of its own, e.g. s3://{s3env.bucket}/p/b/b.pte" in msg, msg
    assert "replace=True" not in msg, msg
    assert isinstance(err.value, KeyExistsError)  # callers catching the old error still do
    assert err.value.key == "p/cpu.ptd" and err.value.owner == f"s3://{s3env.bucket}/p/a.pte"

    # Nothing lost, nothing of b's left: a's objects keep their ETags, b's sources are as
    # they were, no upload open, no journal.
    assert _etags(s3env) == before
    assert _contents(b) == sources
    _assert_no_uploads_no_journal(s3env)
    _assert_whole(s3env, "p/a.pte", a, tmp_path / "got-a")

    # The prefix the error suggests works, and a is still whole.
    _publish(s3env, b, "p/b/b.pte", replace=replace)
    _assert_whole(s3env, "p/b/b.pte", b, tmp_path / "got-b")
    _assert_whole(s3env, "p/a.pte", a, tmp_path / "got-a-again")


def test_an_owner_is_known_from_a_manifest_this_version_cannot_read(s3env, tmp_path):
    """A manifest of a later format still owns what it names (only ``objects[*].key`` read)."""
    later = b'{"format":"trtet-store-manifest","version":99,"objects":[{"key":"p/cpu.ptd"}]}'
    s3env.client.put_object(Bucket=s3env.bucket, Key="p/c.pte.trtet.json", Body=later)
    s3env.client.put_object(Bucket=s3env.bucket, Key="p/cpu.ptd", Body=b"c's weights")
    before = _etags(s3env)
    b = _files(tmp_path / "b", ["b.pte", "cpu.ptd"])
    with pytest.raises(OwnedByOtherProgramError, match=r"cpu.ptd belongs to s3://.*/p/c\.pte"):
        _publish(s3env, b, "p/b.pte", replace=True)
    assert _etags(s3env) == before
    _assert_no_uploads_no_journal(s3env)


def test_another_programs_manifest_is_not_an_object_to_publish(s3env, tmp_path):
    """A file named like a neighbour's manifest would overwrite that program's commit point."""
    a = _files(tmp_path / "a", ["a.pte", "cpu.ptd"])
    _publish(s3env, a, "p/a.pte")
    before = _etags(s3env)
    b = _files(tmp_path / "b", ["b.pte", "a.pte.trtet.json"])
    # The name rule (issue 44) refuses it before any request: a manifest's name is
    # one of trtet_store's own; the owner check behind it would refuse it too.
    with pytest.raises(FileNameError, match=r"'a\.pte\.trtet\.json' is one of trtet_store's"):
        _publish(s3env, b, "p/b.pte", replace=True)
    assert _etags(s3env) == before
    _assert_no_uploads_no_journal(s3env)
    _assert_whole(s3env, "p/a.pte", a, tmp_path / "got-a")


# --- item 3: a replace removes what the new version no longer has -------------------------


def test_a_replace_removes_the_objects_the_new_version_dropped(s3env, tmp_path):
    v1 = _files(tmp_path / "v1", ["a.pte", "cpu.ptd", "gpu.ptd"])
    _publish(s3env, v1, "p/a.pte")
    assert _keys(s3env) == ["p/a.pte", "p/a.pte.trtet.json", "p/cpu.ptd", "p/gpu.ptd"]
    v2 = _files(tmp_path / "v2", ["a.pte", "cpu.ptd"])
    _publish(s3env, v2, "p/a.pte", replace=True)
    assert _keys(s3env) == ["p/a.pte", "p/a.pte.trtet.json", "p/cpu.ptd"]
    _assert_whole(s3env, "p/a.pte", v2, tmp_path / "got")
    _assert_no_uploads_no_journal(s3env)


def test_a_replace_keeps_a_dropped_object_another_manifest_names(s3env, tmp_path):
    """gpu.ptd is named by b's manifest too (as a publish before issue 34 could leave it)."""
    v1 = _files(tmp_path / "v1", ["a.pte", "cpu.ptd", "gpu.ptd"])
    _publish(s3env, v1, "p/a.pte")
    # b.pte published beside it, then its manifest made to name a's gpu.ptd at its ETag:
    # the set an unchanged gpu.ptd would have given b. b is a whole program.
    b = _files(tmp_path / "b", ["b.pte"])
    _publish(s3env, b, "p/b.pte")
    gpu = _manifest(s3env, "p/a.pte").object("gpu.ptd")
    mine = _manifest(s3env, "p/b.pte")
    shared = Manifest(program="b.pte", chunk_size=mine.chunk_size,
                      objects=(*mine.objects, gpu))
    s3env.client.put_object(Bucket=s3env.bucket, Key=manifest_key("p/b.pte"),
                            Body=shared.to_json())
    _assert_whole(s3env, "p/b.pte", [b[0], v1[2]], tmp_path / "got-b")

    v2 = _files(tmp_path / "v2", ["a.pte", "cpu.ptd"])
    _publish(s3env, v2, "p/a.pte", replace=True)
    assert _keys(s3env) == ["p/a.pte", "p/a.pte.trtet.json", "p/b.pte",
                            "p/b.pte.trtet.json", "p/cpu.ptd", "p/gpu.ptd"]
    _assert_whole(s3env, "p/b.pte", [b[0], v1[2]], tmp_path / "got-b-after")
    _assert_whole(s3env, "p/a.pte", v2, tmp_path / "got-a")


def test_a_replace_keeps_a_dropped_object_written_since(s3env, tmp_path):
    """gpu.ptd was replaced by someone after v1 (not the version v1's manifest names): kept."""
    v1 = _files(tmp_path / "v1", ["a.pte", "cpu.ptd", "gpu.ptd"])
    _publish(s3env, v1, "p/a.pte")
    s3env.client.put_object(Bucket=s3env.bucket, Key="p/gpu.ptd", Body=b"someone else's")
    v2 = _files(tmp_path / "v2", ["a.pte", "cpu.ptd"])
    _publish(s3env, v2, "p/a.pte", replace=True)
    got = s3env.client.get_object(Bucket=s3env.bucket, Key="p/gpu.ptd")["Body"].read()
    assert got == b"someone else's"
    _assert_whole(s3env, "p/a.pte", v2, tmp_path / "got")


# --- item 4: a version another publisher finished is never lost ----------------------------


def _other_publish(s3env, files: list[Path], journal: Path) -> str:
    """Publish ``files`` to p/model.pte as another publisher would; its manifest's ETag."""
    report = _publish(s3env, files, "p/model.pte", replace=True, journal_dir=journal)
    return report.manifest_etag


def _assert_winner_intact(s3env, winner: list[Path], winner_manifest: str, tmp: Path) -> None:
    head = s3env.client.head_object(Bucket=s3env.bucket, Key=manifest_key("p/model.pte"))
    assert head["ETag"].strip('"') == winner_manifest
    _assert_whole(s3env, "p/model.pte", winner, tmp)


def test_a_publish_completing_between_our_plan_and_our_complete(s3env, tmp_path, monkeypatch):
    """Mutant 02: the other publish lands right before our Complete (after every other check).

    Only the Complete's ``If-Match`` of the version read at plan time stands
    between our Complete and the other publisher's finished program.
    """
    _publish(s3env, _files(tmp_path / "v0", ["model.pte", "w.ptd"]), "p/model.pte")
    theirs = _files(tmp_path / "theirs", ["model.pte", "w.ptd"])
    ours = _files(tmp_path / "ours", ["model.pte", "w.ptd"])
    sources = _contents(ours)
    real_check = publish_module._check_manifest_base
    landed: list[str] = []
    started: list[bool] = []

    def check_then_lose_the_race(*args, **kwargs):
        real_check(*args, **kwargs)
        if not started:  # ours: the other publish finishes after our check, before Complete
            started.append(True)
            landed.append(_other_publish(s3env, theirs, tmp_path / "journal-theirs"))

    monkeypatch.setattr(publish_module, "_check_manifest_base", check_then_lose_the_race)
    with pytest.raises(ConflictError) as err:
        _publish(s3env, ours, "p/model.pte", replace=True)
    assert landed
    # Every object keeps the ETag the winner's manifest names; it fetches byte for byte.
    _assert_winner_intact(s3env, theirs, landed[0], tmp_path / "got")
    assert "model.pte changed by another writer while we published" in str(err.value)
    assert _contents(ours) == sources
    assert _keys(s3env) == ["p/model.pte", "p/model.pte.trtet.json", "p/w.ptd"]
    _assert_no_uploads_no_journal(s3env, tmp_path / "journal-theirs")


def test_a_publish_that_kept_our_first_object_finishing_before_our_complete(s3env, tmp_path):
    """The other publish kept model.pte unchanged (same ETag) and changed w.ptd and the manifest.

    model.pte's ``If-Match`` passes (the version planned against is still
    there), but the other's manifest names it: our Complete must not replace
    it. Set up through the progress callback: the other publish runs when our
    last part is in, before any Complete.
    """
    v0 = _files(tmp_path / "v0", ["model.pte", "w.ptd"])
    _publish(s3env, v0, "p/model.pte")
    theirs = [v0[0], _files(tmp_path / "theirs", ["w.ptd"])[0]]  # model.pte as it was
    ours = _files(tmp_path / "ours", ["model.pte", "w.ptd"])
    landed: list[str] = []

    def progress(p) -> None:
        if p.done == p.total and not landed:
            landed.append(_other_publish(s3env, theirs, tmp_path / "journal-theirs"))

    model_etag = _etags(s3env)["p/model.pte"]
    with pytest.raises(ConflictError) as err:
        _publish(s3env, ours, "p/model.pte", replace=True, progress=progress)
    assert landed
    assert _etags(s3env)["p/model.pte"] == model_etag  # kept by the winner, untouched by us
    _assert_winner_intact(s3env, theirs, landed[0], tmp_path / "got")
    assert "changed by another publisher after this publish planned" in str(err.value)
    _assert_no_uploads_no_journal(s3env, tmp_path / "journal-theirs")


def test_a_publish_committing_between_our_last_complete_and_our_manifest(s3env, tmp_path,
                                                                          monkeypatch):
    """Issue 45 item 5: only the manifest PUT's ``If-Match`` is left to guard the winner.

    Every Complete of ours has passed its checks when the other publish runs
    (from a hook right before our manifest PUT): it replaces our completed
    objects and commits its manifest. Ours must get ConflictError without
    writing its manifest, and the other's program stays fetchable.
    """
    _publish(s3env, _files(tmp_path / "v0", ["model.pte", "w.ptd"]), "p/model.pte")
    theirs = _files(tmp_path / "theirs", ["model.pte", "w.ptd"])
    ours = _files(tmp_path / "ours", ["model.pte", "w.ptd"])
    sources = _contents(ours)
    real_put_manifest = publish_module._put_manifest
    landed: list[str] = []

    def lose_the_race_then_put_manifest(*args, **kwargs):
        if not landed:  # ours: every object completed, our manifest is next
            landed.append("running")
            landed[0] = _other_publish(s3env, theirs, tmp_path / "journal-theirs")
        return real_put_manifest(*args, **kwargs)

    monkeypatch.setattr(publish_module, "_put_manifest", lose_the_race_then_put_manifest)
    with pytest.raises(ConflictError) as err:
        _publish(s3env, ours, "p/model.pte", replace=True)
    monkeypatch.undo()
    assert landed and landed[0] != "running"
    _assert_winner_intact(s3env, theirs, landed[0], tmp_path / "got")
    assert "model.pte.trtet.json was changed by another writer while we published" in \
        str(err.value)
    assert _contents(ours) == sources
    assert _keys(s3env) == ["p/model.pte", "p/model.pte.trtet.json", "p/w.ptd"]
    _assert_no_uploads_no_journal(s3env, tmp_path / "journal-theirs")


def test_an_engine_indexed_in_a_removed_object_is_sent_again(s3env, here_fs):
    """The engine-digest index still points at gpu.ptd after a replace removed it.

    A later publish of the same engine elsewhere must not plan a server-side
    copy from the removed object (its copy source is checked at plan time):
    it sends the bytes, and the program is whole.
    """
    from trtet_store.remote.upload.send import publish_sources
    from trtet_store.remote.upload.source import ObjectSource

    def publish(objects, key, **kw):
        return publish_sources(objects, f"s3://{s3env.bucket}/{key}",
                               endpoint_url=s3env.endpoint.url, part_size=PART,
                               journal_dir=s3env.journal_dir, **kw)

    with trtet_store.BlobStore(here_fs / "staging") as store:
        with store.writer() as w:
            w.write(os.urandom(6 * MiB + 1))
        engine = w.blob
        publish([ObjectSource("a.pte", [b"a" * 100]), ObjectSource("gpu.ptd", [engine])],
                "p/a.pte")
        publish([ObjectSource("a.pte", [b"b" * 100])], "p/a.pte", replace=True)
        assert _keys(s3env, "p/") == ["p/a.pte", "p/a.pte.trtet.json"]
        report = publish([ObjectSource("c.pte", [b"c" * 100, engine])], "q/c.pte")
        expected = b"c" * 100 + Path(engine.path).read_bytes()
    assert report.bytes_copied == 0 and report.bytes_sent == len(expected)
    got = s3env.client.get_object(Bucket=s3env.bucket, Key="q/c.pte")["Body"].read()
    assert got == expected
    _assert_no_uploads_no_journal(s3env)


def test_a_copy_source_removed_after_the_plan_is_sent_instead(s3env, here_fs, monkeypatch):
    """The indexed object is removed between our plan and our UploadPartCopy (a replace's
    cleanup elsewhere): the part is sent from the local bytes, nothing fails."""
    from trtet_store.remote.upload.send import publish_sources
    from trtet_store.remote.upload.source import ObjectSource

    def publish(objects, key, **kw):
        return publish_sources(objects, f"s3://{s3env.bucket}/{key}",
                               endpoint_url=s3env.endpoint.url, part_size=PART,
                               journal_dir=s3env.journal_dir, **kw)

    real_plan = publish_module._plan_copies

    def plan_then_remove_the_source(s3, bucket, objs, *args, **kwargs):
        previous = real_plan(s3, bucket, objs, *args, **kwargs)
        assert any(c.key == "p/x.pte" for o in objs for c in o.copies.values())
        s3env.client.delete_object(Bucket=bucket, Key="p/x.pte")
        return previous

    with trtet_store.BlobStore(here_fs / "staging") as store:
        with store.writer() as w:
            w.write(os.urandom(11 * MiB + 1))
        engine = w.blob
        publish([ObjectSource("x.pte", [engine])], "p/x.pte")
        monkeypatch.setattr(publish_module, "_plan_copies", plan_then_remove_the_source)
        report = publish([ObjectSource("c.pte", [engine])], "q/c.pte")
        expected = Path(engine.path).read_bytes()
    assert report.bytes_copied == 0 and report.bytes_sent == len(expected)
    got = s3env.client.get_object(Bucket=s3env.bucket, Key="q/c.pte")["Body"].read()
    assert got == expected
    _assert_no_uploads_no_journal(s3env)


class _Stop(Exception):
    """Raised from a progress callback: the publish stops with its upload and journal kept."""


def test_a_resumed_publish_whose_ptd_another_program_took_meanwhile(s3env, tmp_path):
    """b is interrupted; a publishes its own cpu.ptd beside it; b's resume is refused.

    The refusal gives up b's journal and aborts its upload: nothing of b's is
    left open or billed, and a is whole.
    """
    b = _files(tmp_path / "b", ["b.pte", "cpu.ptd"], size=6 * MiB)
    sources = _contents(b)

    def stop(p) -> None:
        raise _Stop

    with pytest.raises(_Stop):
        _publish(s3env, b, "p/b.pte", progress=stop)
    assert s3env.client.list_multipart_uploads(Bucket=s3env.bucket).get("Uploads", [])
    assert any(s3env.journal_dir.iterdir())

    a = _files(tmp_path / "a", ["a.pte", "cpu.ptd"])
    _publish(s3env, a, "p/a.pte", journal_dir=tmp_path / "journal-a")
    before = _etags(s3env)
    with pytest.raises(OwnedByOtherProgramError, match="cpu.ptd belongs to"):
        _publish(s3env, b, "p/b.pte", replace=True)
    assert _etags(s3env) == before
    assert _contents(b) == sources
    _assert_no_uploads_no_journal(s3env, tmp_path / "journal-a")
    _assert_whole(s3env, "p/a.pte", a, tmp_path / "got-a")


def test_a_replace_stopped_after_its_commit_cleans_up_when_resumed(s3env, tmp_path,
                                                                   monkeypatch):
    """Stopped between the commit and the cleanup: the resume removes gpu.ptd.

    What the replaced version had is journaled with the plan, so the
    resumed run (which reads no old manifest: ours is there now) still knows.
    """
    v1 = _files(tmp_path / "v1", ["a.pte", "cpu.ptd", "gpu.ptd"])
    _publish(s3env, v1, "p/a.pte")
    v2 = _files(tmp_path / "v2", ["a.pte", "cpu.ptd"])

    real_remove = publish_module._remove_replaced
    stopped: list[bool] = []

    def stop_once(*args, **kwargs):
        if not stopped:
            stopped.append(True)
            raise _Stop
        return real_remove(*args, **kwargs)

    # (not monkeypatch.undo(): that would also undo s3env's credentials)
    monkeypatch.setattr(publish_module, "_remove_replaced", stop_once)
    with pytest.raises(_Stop):
        _publish(s3env, v2, "p/a.pte", replace=True)
    assert "p/gpu.ptd" in _keys(s3env) and any(s3env.journal_dir.iterdir())
    report = _publish(s3env, v2, "p/a.pte", replace=True)
    assert report.bytes_sent == 0
    assert _keys(s3env) == ["p/a.pte", "p/a.pte.trtet.json", "p/cpu.ptd"]
    _assert_whole(s3env, "p/a.pte", v2, tmp_path / "got")
    _assert_no_uploads_no_journal(s3env)


def test_a_program_claiming_a_key_while_we_send_is_not_overwritten(s3env, tmp_path):
    """a claims cpu.ptd while b sends, at the very ETag b planned against.

    cpu.ptd was an object no manifest named (b may replace it), holding the
    bytes a then publishes as its own cpu.ptd: same bytes and parts, same
    ETag, so b's If-Match still passes. The owners are read again before b's
    first Complete: b is refused, nothing of b's is visible, a is whole.
    """
    a = _files(tmp_path / "a", ["a.pte", "cpu.ptd"])
    # The unowned cpu.ptd: a program published and then removed, all but its cpu.ptd.
    _publish(s3env, [_files(tmp_path / "o", ["o.pte"])[0], a[1]], "p/o.pte")
    for key in ("p/o.pte", "p/o.pte.trtet.json"):
        s3env.client.delete_object(Bucket=s3env.bucket, Key=key)
    planned = _etags(s3env)["p/cpu.ptd"]
    b = _files(tmp_path / "b", ["b.pte", "cpu.ptd"])
    landed: list[str] = []

    def progress(p) -> None:
        if p.done == p.total and not landed:
            landed.append(_publish(s3env, a, "p/a.pte", replace=True,
                                   journal_dir=tmp_path / "journal-a").manifest_etag)

    with pytest.raises(OwnedByOtherProgramError, match=r"cpu.ptd belongs to s3://.*/p/a\.pte"):
        _publish(s3env, b, "p/b.pte", replace=True, progress=progress)
    assert landed and _etags(s3env)["p/cpu.ptd"] == planned
    assert _keys(s3env) == ["p/a.pte", "p/a.pte.trtet.json", "p/cpu.ptd"]
    _assert_whole(s3env, "p/a.pte", a, tmp_path / "got-a")
    _assert_no_uploads_no_journal(s3env, tmp_path / "journal-a")
