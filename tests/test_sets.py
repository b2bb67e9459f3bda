"""Artifact sets (issue 47, first slice) against the real SeaweedFS server and real filesystems.

A set of four members (``model.pte`` of its own each, one shared
``foundation.ptd``) is published with ``publish_set`` and fetched with
``fetch_set``. Bytes on the wire are counted by the counting proxy (never the
client's own report); bytes in the bucket are the sizes the server lists.
"""

from __future__ import annotations

import json
import os
import stat
from pathlib import Path

import pytest
from sets_helpers import write, xxh

import trtet_store
from trtet_store.io.units import MiB
from trtet_store.remote import ConflictError, FetchVerificationError, KeyExistsError
from trtet_store.remote.upload.config import PublishConfig
from trtet_store.remote.upload.send import publish_sources
from trtet_store.remote.upload.source import ObjectSource
from trtet_store.remote.url import RemoteURL
from trtet_store.sets import (
    SET_KEY,
    Machine,
    Member,
    NoMemberFitsError,
    blob_key,
    fetch_set,
    pick_member,
    publish_set,
    read_set,
)

SHARED = 6 * MiB  # foundation.ptd, the same in every member
OWN = 2 * MiB + 4321  # each member's model.pte
NAMES = ("a", "b", "c", "d")


def four_members(root: Path) -> dict[str, list[Path]]:
    """Four members: a model.pte of their own each, one foundation.ptd shared by all."""
    shared = write(root / "src" / "foundation.ptd", SHARED, 1000)
    return {n: [write(root / "src" / n / "model.pte", OWN, i), shared]
            for i, n in enumerate(NAMES)}


def bucket_bytes(s3, prefix: str) -> int:
    """What the bucket holds under ``prefix``: the sum of its objects' sizes."""
    total = 0
    for page in s3.client.get_paginator("list_objects_v2").paginate(Bucket=s3.bucket,
                                                                    Prefix=prefix):
        total += sum(o["Size"] for o in page.get("Contents", []))
    return total


def keys_under(s3, prefix: str) -> list[str]:
    listed = s3.client.list_objects_v2(Bucket=s3.bucket, Prefix=prefix).get("Contents", [])
    return sorted(o["Key"] for o in listed)


def url_of(s3, prefix: str = "llm/v3/") -> str:
    return f"s3://{s3.bucket}/{prefix}"


def publish(members, s3env, proxy=None, **kw):
    from trtet_store.remote.upload.config import PublishConfig

    endpoint = proxy.endpoint_url if proxy is not None else s3env.endpoint.url
    return publish_set(members, url_of(s3env), endpoint_url=endpoint,
                       config=PublishConfig(journal_dir=s3env.journal_dir), **kw)


# --- the bucket -----------------------------------------------------------------------------


def test_four_members_sharing_a_ptd_store_it_once_in_the_bucket(s3env, here_fs):
    members = four_members(here_fs)
    report = publish(members, s3env)
    held = bucket_bytes(s3env, "llm/v3/")
    assert held <= SHARED + 4 * OWN + MiB, held
    assert held >= SHARED + 4 * OWN
    # What a publish per program would have stored: the foundation four times.
    assert report.bytes_files == 4 * (SHARED + OWN)
    assert report.bytes_distinct == SHARED + 4 * OWN
    assert report.bytes_uploaded >= SHARED + 4 * OWN and report.bytes_present == 0
    shared = xxh(members["a"][1])
    assert keys_under(s3env, "llm/v3/blobs/").count(f"llm/v3/blobs/{shared}") == 1
    manifest, _ = read_set(_s3(s3env), s3env.bucket, "llm/v3/")
    assert sorted(manifest.members) == list(NAMES)
    for name in NAMES:
        files = manifest.members[name].files
        assert [f.name for f in files] == ["model.pte", "foundation.ptd"]
        assert files[1].blob == shared and files[0].blob == xxh(members[name][0])
    # Published again unchanged: nothing sent, all present, nothing removed.
    again = publish(members, s3env, if_exists="replace")
    assert again.bytes_uploaded == 0 and again.bytes_present == SHARED + 4 * OWN
    assert again.removed == [] and bucket_bytes(s3env, "llm/v3/") == held


def _settled_used(path: Path) -> int:
    """statvfs used bytes once XFS has finished its background frees (three equal reads)."""
    import time

    os.sync()
    last, same = None, 0
    while same < 3:
        st = os.statvfs(path)
        now = (st.f_blocks - st.f_bfree) * st.f_frsize
        same, last = (same + 1, now) if now == last else (0, now)
        time.sleep(0.05)
    return last


def test_four_members_fetched_onto_xfs_hold_the_foundation_once(s3env, here_fs, make_fs):
    # Target (a) on disk: fetched side by side, the four members and the store take one
    # foundation and four own files (clones share the store's extents), where four
    # programs fetched apart take the foundation four times.
    members = four_members(here_fs)
    publish(members, s3env)
    mnt = make_fs("xfs", 300)
    before = _settled_used(mnt)
    for name in NAMES:
        got = fetch_set(url_of(s3env), mnt / name, name, endpoint_url=s3env.endpoint.url)
        assert got.placed == {"clone": SHARED + OWN}, got.placed
    grew = _settled_used(mnt) - before
    assert SHARED + 4 * OWN <= grew <= SHARED + 4 * OWN + MiB, grew
    for name in NAMES:
        assert (mnt / name / "foundation.ptd").read_bytes() == members[name][1].read_bytes()


def _s3(s3env):
    from trtet_store.remote.s3 import S3

    return S3(s3env.endpoint.url)


def test_a_new_set_is_not_overwritten_without_replace(s3env, here_fs):
    members = four_members(here_fs)
    publish(members, s3env)
    before = s3env.client.get_object(Bucket=s3env.bucket, Key=f"llm/v3/{SET_KEY}")["ETag"]
    with pytest.raises(KeyExistsError, match="if_exists='replace'"):
        publish(members, s3env)
    assert s3env.client.get_object(Bucket=s3env.bucket,
                                   Key=f"llm/v3/{SET_KEY}")["ETag"] == before


def test_a_republish_after_one_engine_changes_sends_that_file_and_removes_the_old(
        s3env, here_fs, proxy):
    members = four_members(here_fs)
    publish(members, s3env)
    old = xxh(members["c"][0])
    write(members["c"][0], OWN, 777)  # member c's engine was rebuilt
    proxy.reset()
    report = publish(members, s3env, proxy, if_exists="replace")
    sent = proxy.upstream
    assert sent <= OWN + MiB, sent
    assert report.bytes_uploaded == OWN and report.bytes_present == SHARED + 3 * OWN
    assert report.blobs_uploaded == [xxh(members["c"][0])]
    # The old engine's blob (and its blob manifest) went after the new manifest committed.
    assert report.removed == [old]
    assert not [k for k in keys_under(s3env, "llm/v3/blobs/") if old in k]
    assert bucket_bytes(s3env, "llm/v3/") <= SHARED + 4 * OWN + MiB


# --- the machine ----------------------------------------------------------------------------


def test_fetching_member_b_where_a_is_held_downloads_only_b_s_own_bytes(s3env, here_fs,
                                                                       proxy):
    members = four_members(here_fs / "pub")
    publish(members, s3env)
    root = here_fs / "machine"
    root.mkdir()
    first = fetch_set(url_of(s3env), root / "a", "a", endpoint_url=proxy.endpoint_url)
    assert first.bytes_downloaded == SHARED + OWN and first.bytes_in_store == 0
    proxy.reset()
    report = fetch_set(url_of(s3env), root / "b", "b", endpoint_url=proxy.endpoint_url)
    got = proxy.downstream
    assert got <= OWN + MiB, got
    assert report.bytes_downloaded == OWN and report.bytes_in_store == SHARED
    assert not report.picked and report.member == "b"
    for name in ("a", "b"):
        assert (root / name / "model.pte").read_bytes() == members[name][0].read_bytes()
        assert (root / name / "foundation.ptd").read_bytes() == members[name][1].read_bytes()
        assert sorted(os.listdir(root / name)) == [".trtet-set.json", "foundation.ptd",
                                                   "model.pte"]
    assert sum(report.placed.values()) == SHARED + OWN
    # On ext4 the store holds no blob's bytes: each blob was moved into a member's file,
    # and the store keeps a reference to it (the foundation's: b's, copied from a's).
    store = root / ".trtet-blobs"
    assert [p.name for p in store.iterdir() if not p.name.startswith(".")] == []
    refs = {b: json.loads((store / ".trtet-seals" / b).read_text())["ref"]
            for b in os.listdir(store / ".trtet-seals")}
    assert refs == {xxh(members["a"][0]): str(root / "a" / "model.pte"),
                    xxh(members["b"][0]): str(root / "b" / "model.pte"),
                    xxh(members["a"][1]): str(root / "b" / "foundation.ptd")}
    assert report.placed == {"move": SHARED + OWN}
    # Fetched again: nothing downloaded.
    proxy.reset()
    again = fetch_set(url_of(s3env), root / "b", "b", endpoint_url=proxy.endpoint_url)
    assert again.bytes_downloaded == 0 and proxy.downstream < MiB


GPU_MEMBERS = {
    "sm80": {"compute_capability": "8.0", "tensorrt": "10.3.0"},
    "sm89": {"compute_capability": "8.9", "tensorrt": "10.3.0"},
    "sm90": {"compute_capability": "9.0", "tensorrt": "10.3.0"},
}


def test_the_member_for_this_machine_is_picked(s3env, here_fs):
    members = {n: Member([write(here_fs / "src" / n / "model.pte", OWN, i),
                          write(here_fs / "src" / "cpu.ptd", MiB, 99)], **meta)
               for i, (n, meta) in enumerate(GPU_MEMBERS.items())}
    publish(members, s3env)
    report = fetch_set(url_of(s3env), here_fs / "out", machine=Machine("8.9", "10.3.0"),
                       endpoint_url=s3env.endpoint.url)
    assert report.member == "sm89" and report.picked
    assert (here_fs / "out" / "model.pte").read_bytes() == \
        (here_fs / "src" / "sm89" / "model.pte").read_bytes()
    manifest, _ = read_set(_s3(s3env), s3env.bucket, "llm/v3/")
    assert manifest.members["sm89"].metadata == GPU_MEMBERS["sm89"]


def test_no_fitting_member_is_refused_listing_them_and_an_explicit_member_wins(s3env,
                                                                            here_fs):
    members = {n: Member([write(here_fs / "src" / n / "model.pte", OWN, i)], **meta)
               for i, (n, meta) in enumerate(GPU_MEMBERS.items())}
    publish(members, s3env)
    turing = Machine("7.5", "10.3.0")
    with pytest.raises(NoMemberFitsError) as caught:
        fetch_set(url_of(s3env), here_fs / "out", machine=turing,
                  endpoint_url=s3env.endpoint.url)
    message = str(caught.value)
    for name, meta in GPU_MEMBERS.items():
        assert f"{name}: needs a GPU of compute capability {meta['compute_capability']}, " \
               "TensorRT 10.3.0" in message
    assert "compute capability 7.5" in message and "member=" in message
    assert sorted(caught.value.members) == sorted(GPU_MEMBERS)
    assert not (here_fs / "out").exists() and not (here_fs / ".trtet-blobs").exists()
    # An explicit member wins, whatever the machine.
    report = fetch_set(url_of(s3env), here_fs / "out", "sm90", machine=turing,
                       endpoint_url=s3env.endpoint.url)
    assert report.member == "sm90" and not report.picked
    assert (here_fs / "out" / "model.pte").read_bytes() == \
        (here_fs / "src" / "sm90" / "model.pte").read_bytes()
    with pytest.raises(KeyError, match="no member 'sm75'.*'sm80', 'sm89', 'sm90'"):
        fetch_set(url_of(s3env), here_fs / "out", "sm75", endpoint_url=s3env.endpoint.url)


def test_the_pick_prefers_the_exact_gpu_then_the_hardware_level_then_no_gpu():
    members = {
        "cpu": {},
        "ampere_plus": {"compute_capability": "8.0", "hardware_compatibility": "ampere_plus",
                        "tensorrt": "10.3.0", "version_compatible": True},
        "sm89": {"compute_capability": "8.9", "tensorrt": "10.3.0"},
    }
    assert pick_member(members, Machine("8.9", "10.3.0"), "s") == "sm89"
    assert pick_member(members, Machine("8.6", "10.3.0"), "s") == "ampere_plus"
    # A version-compatible engine runs on a later TensorRT, a plain one does not.
    assert pick_member(members, Machine("8.9", "10.7.0"), "s") == "ampere_plus"
    assert pick_member(members, Machine("7.5", "10.3.0"), "s") == "cpu"
    assert pick_member(members, Machine(None, None), "s") == "cpu"
    with pytest.raises(NoMemberFitsError, match="equally"):
        pick_member({"x": {}, "y": {}}, Machine(), "s")
    with pytest.raises(NoMemberFitsError, match="no member fits"):
        pick_member({"sm89": members["sm89"]}, Machine("8.9", "10.4.0"), "s")


# --- never a torn set -----------------------------------------------------------------------


@pytest.mark.parametrize("existing", [False, True], ids=["new", "replace"])
def test_two_publishers_one_wins_the_other_conflicts_and_the_winner_is_fetchable(
        s3env, here_fs, monkeypatch, existing):
    import trtet_store.sets.publish as room

    ours = four_members(here_fs / "ours")
    theirs = {n: [write(here_fs / "theirs" / n / "model.pte", OWN, 50 + i),
                  write(here_fs / "theirs" / "foundation.ptd", SHARED, 2000)]
              for i, n in enumerate(NAMES)}
    mode = {"if_exists": "replace"} if existing else {}
    if existing:
        publish(ours, s3env)
    real = room._send_blobs
    done = []

    def rival_commits_first(*args, **kwargs):
        blobs = real(*args, **kwargs)
        if not done:  # the rival read, sent and committed while we sent
            done.append(True)
            publish(theirs, s3env, **mode)
        return blobs

    monkeypatch.setattr(room, "_send_blobs", rival_commits_first)
    write(ours["a"][0], OWN, 4242)  # ours is a new version too
    with pytest.raises(ConflictError, match="another publisher"):
        publish(ours, s3env, **mode)
    monkeypatch.setattr(room, "_send_blobs", real)
    (here_fs / "fetched").mkdir()
    for name in NAMES:
        fetch_set(url_of(s3env), here_fs / "fetched" / name, name,
                  endpoint_url=s3env.endpoint.url)
        for f in theirs[name]:
            assert (here_fs / "fetched" / name / f.name).read_bytes() == f.read_bytes()


@pytest.mark.parametrize("how", ["publish", "put", "no-server-checksum"])
def test_a_blob_rewritten_with_the_same_size_is_refused_by_its_digest(s3env, here_fs, how,
                                                                     monkeypatch):
    members = four_members(here_fs / "pub")
    publish(members, s3env)
    shared = xxh(members["a"][1])
    key = blob_key("llm/v3/", shared)
    bad = write(here_fs / "bad.bin", SHARED, 31337)
    if how != "put":  # the blob and its own manifest rewritten together, consistently
        publish_sources([ObjectSource.of_file(bad, shared)], RemoteURL(s3env.bucket, key),
                        endpoint_url=s3env.endpoint.url, replace=True,
                        journal_dir=s3env.journal_dir)
    else:  # only the object, with a plain PUT
        s3env.client.put_object(Bucket=s3env.bucket, Key=key, Body=bad.read_bytes(),
                                ChecksumAlgorithm="CRC64NVME")
    if how == "no-server-checksum":
        # A server that keeps no CRC64NVME: HeadObject cannot tell, the xxh3-128 must.
        import dataclasses

        from trtet_store.remote.s3 import S3

        head = S3.head
        monkeypatch.setattr(S3, "head", lambda self, *a, **k: None if (h := head(
            self, *a, **k)) is None else dataclasses.replace(h, crc64nvme=None))
    out = here_fs / "machine" / "a"
    out.parent.mkdir()
    out.mkdir()
    (out / "model.pte").write_bytes(b"the old version")
    with pytest.raises(FetchVerificationError) as caught:
        fetch_set(url_of(s3env), out, "a", endpoint_url=s3env.endpoint.url)
    assert shared in str(caught.value)
    if how == "no-server-checksum":
        assert "xxh3-128" in str(caught.value)
    # Nothing placed, nothing of the bad bytes kept in the store.
    assert sorted(os.listdir(out)) == ["model.pte"]
    assert (out / "model.pte").read_bytes() == b"the old version"
    # The store keeps only what checked (model.pte's blob, fetched first): no bad bytes,
    # no staging left behind.
    store = here_fs / "machine" / ".trtet-blobs"
    assert set(os.listdir(store)) <= {xxh(members["a"][0]), ".trtet-seals"}, os.listdir(store)
    assert os.listdir(store / ".trtet-seals") == [xxh(members["a"][0])]  # a seal per blob


def test_a_damaged_store_blob_is_refused_when_placed(s3env, here_fs):
    members = four_members(here_fs / "pub")
    publish(members, s3env)
    root = here_fs / "machine"
    root.mkdir()
    # A copy from the store (no move, as on XFS) leaves the blob there, for this test to damage.
    fetch_set(url_of(s3env), root / "a", "a", endpoint_url=s3env.endpoint.url,
              placements=["copy"])
    blob = root / ".trtet-blobs" / xxh(members["a"][1])
    os.chmod(blob, 0o644)
    with open(blob, "r+b") as f:  # same size, other bytes
        f.seek(SHARED // 2)
        f.write(b"\xff" * 16)
    with pytest.raises(OSError, match="does not match|do not match"):
        fetch_set(url_of(s3env), root / "b", "b", endpoint_url=s3env.endpoint.url)
    assert not (root / "b" / "foundation.ptd").exists()
    assert not (root / "b" / "model.pte").exists()


# --- a blob never breaks two members ----------------------------------------------------------


@pytest.mark.parametrize("fstype,mib,how", [("xfs", 300, "clone"), ("btrfs", 256, "clone"),
                                            ("ext4", 128, "move")])
def test_a_member_s_file_changed_in_place_never_changes_another_s(s3env, here_fs, make_fs,
                                                                 fstype, mib, how):
    members = four_members(here_fs)
    publish(members, s3env)
    mnt = make_fs(fstype, mib)
    a = fetch_set(url_of(s3env), mnt / "a", "a", endpoint_url=s3env.endpoint.url)
    b = fetch_set(url_of(s3env), mnt / "b", "b", endpoint_url=s3env.endpoint.url)
    shared = members["a"][1].read_bytes()
    with open(mnt / "a" / "foundation.ptd", "r+b") as f:  # as a program writing in place
        f.seek(SHARED // 3)
        f.write(b"\0" * 8192)
    assert (mnt / "b" / "foundation.ptd").read_bytes() == shared
    blob = mnt / ".trtet-blobs" / xxh(members["a"][1])
    if how == "move":  # ext4: the store keeps a reference (to b's file), not the bytes
        assert not blob.exists()
    else:
        assert blob.read_bytes() == shared
    assert (mnt / "a" / "foundation.ptd").read_bytes() != shared
    assert set(a.placed) == set(b.placed) == {how}
    # A member fetched after the write gets the set's bytes, whichever file it came from.
    with open(mnt / "b" / "foundation.ptd", "r+b") as f:
        f.seek(SHARED // 2)
        f.write(b"\1" * 8192)
    fetch_set(url_of(s3env), mnt / "c", "c", endpoint_url=s3env.endpoint.url)
    assert (mnt / "c" / "foundation.ptd").read_bytes() == shared


def test_hard_links_are_opt_in_and_read_only(s3env, here_fs):
    members = four_members(here_fs / "pub")
    publish(members, s3env)
    root = here_fs / "machine"
    root.mkdir()
    report = fetch_set(url_of(s3env), root / "a", "a", link=True,
                       endpoint_url=s3env.endpoint.url)
    fetch_set(url_of(s3env), root / "b", "b", link=True, endpoint_url=s3env.endpoint.url)
    assert report.placed == {"link": SHARED + OWN}
    blob = root / ".trtet-blobs" / xxh(members["a"][1])
    for name in ("a", "b"):
        st = os.stat(root / name / "foundation.ptd")
        assert st.st_ino == os.stat(blob).st_ino and stat.S_IMODE(st.st_mode) == 0o444
    assert os.stat(blob).st_nlink == 3
    assert sorted(os.listdir(root / "a")) == [".trtet-set.json", "foundation.ptd",
                                              "model.pte"]
    # The default places no link: its own inode.
    plain = fetch_set(url_of(s3env), root / "c", "c", endpoint_url=s3env.endpoint.url)
    assert "link" not in plain.placed
    assert os.stat(root / "c" / "foundation.ptd").st_ino != os.stat(blob).st_ino


# --- arguments and the face ---------------------------------------------------------------------


def test_bad_arguments_are_refused_before_anything_is_sent(s3env, here_fs):
    files = [write(here_fs / "model.pte", MiB, 1)]
    with pytest.raises(ValueError, match="member name '../x'"):
        publish({"../x": files}, s3env)
    with pytest.raises(ValueError, match="compute_capability must be like"):
        publish({"x": Member(files, compute_capability="sm89")}, s3env)
    with pytest.raises(TypeError, match="non-empty mapping"):
        publish({}, s3env)
    with pytest.raises(TypeError, match="unexpected keyword"):
        publish_set({"x": files}, url_of(s3env), replace=True)  # type: ignore[call-arg]
    assert keys_under(s3env, "") == []


def test_the_face_exports_the_set_functions():
    assert trtet_store.publish_set is publish_set and trtet_store.fetch_set is fetch_set
    assert trtet_store.SetMember is Member
    assert trtet_store.NoMemberFitsError is NoMemberFitsError


def test_the_set_manifest_is_canonical_json(s3env, here_fs):
    publish(four_members(here_fs), s3env)
    body = s3env.client.get_object(Bucket=s3env.bucket, Key=f"llm/v3/{SET_KEY}")["Body"].read()
    doc = json.loads(body)
    assert doc["format"] == "trtet-store-set" and doc["version"] == 1
    assert body == (json.dumps(doc, sort_keys=True, separators=(",", ":")) + "\n").encode()


def test_programs_of_the_export_share_their_ptd_in_the_bucket(s3env, here_fs, capsys):
    """Members given as programs (stub TensorRT engines, XNNPACK weights in cpu.ptd)."""
    from test_publish import build_program

    with trtet_store.BlobStore(here_fs / "staging") as store:
        members = {f"sm{n}": Member(build_program(store, (MiB, MiB), (n, n + 1)),
                                    compute_capability=f"{n // 10}.{n % 10}")
                   for n in (80, 89)}
        report = publish(members, s3env)
        assert report.members == {"sm80": ["sm80.pte", "cpu.ptd"],
                                  "sm89": ["sm89.pte", "cpu.ptd"]}
        saved = {}
        for name, m in members.items():
            saved[name] = here_fs / "saved" / name
            saved[name].mkdir(parents=True)
            trtet_store.save_program(m.source, saved[name] / f"{name}.pte")
    ptd = (saved["sm80"] / "cpu.ptd").read_bytes()
    assert ptd == (saved["sm89"] / "cpu.ptd").read_bytes()
    assert report.bytes_distinct == report.bytes_files - len(ptd)
    manifest, _ = read_set(_s3(s3env), s3env.bucket, "llm/v3/")
    assert manifest.members["sm89"].metadata["executorch"]  # the installed one
    got = fetch_set(url_of(s3env), here_fs / "out", machine=Machine("8.9"),
                    endpoint_url=s3env.endpoint.url)
    assert got.member == "sm89"
    for f in ("sm89.pte", "cpu.ptd"):
        assert (here_fs / "out" / f).read_bytes() == (saved["sm89"] / f).read_bytes()
    from trtet_store.cli import main

    assert main(["verify", str(here_fs / "out" / "sm89.pte"), "--data",
                 str(here_fs / "out" / "cpu.ptd")]) == 0
    assert "sm89.pte, cpu.ptd are the files it was released with" in capsys.readouterr().out


def test_a_fetched_member_s_ptd_is_bound_to_its_pte_by_digest(s3env, here_fs, capsys):
    """``verify`` names a .ptd beside a fetched member that is not the one it was released with."""
    from trtet_store.cli import main
    from trtet_store.sets import verify_member

    members = four_members(here_fs / "pub")
    publish(members, s3env)
    out = here_fs / "machine" / "a"
    out.parent.mkdir()
    fetch_set(url_of(s3env), out, "a", endpoint_url=s3env.endpoint.url)
    check = verify_member(out)
    assert check.ok and check.member == "a" and check.files == ["model.pte", "foundation.ptd"]
    # A foundation.ptd of the same size and other bytes (another release's, say).
    write(out / "foundation.ptd", SHARED, 4040)
    check = verify_member(out)
    assert not check.ok and len(check.problems) == 1
    assert check.problems[0].startswith("foundation.ptd: not the file member 'a' was released "
                                        "with") and "from byte 0" in check.problems[0]
    assert main(["verify", str(out / "model.pte")]) == 1
    assert "foundation.ptd: not the file member 'a'" in capsys.readouterr().out
    (out / "foundation.ptd").unlink()
    assert verify_member(out).problems == ["foundation.ptd: missing (the member was released "
                                           "with it)"]


def test_another_member_fetched_into_the_directory_removes_only_the_previous_one_s_files(
        s3env, here_fs):
    src = here_fs / "src"
    shared = write(src / "shared.ptd", MiB, 1)
    members = {"x": [write(src / "x.pte", MiB, 2), shared],
               "y": [write(src / "y.pte", MiB, 3), shared, write(src / "extra.ptd", MiB, 4)]}
    publish(members, s3env)
    out = here_fs / "out"
    fetch_set(url_of(s3env), out, "y", endpoint_url=s3env.endpoint.url)
    (out / "notes.txt").write_text("the user's own")
    report = fetch_set(url_of(s3env), out, "x", endpoint_url=s3env.endpoint.url)
    assert sorted(report.removed) == [str(out / "extra.ptd"), str(out / "y.pte")]
    assert sorted(os.listdir(out)) == [".trtet-set.json", "notes.txt", "shared.ptd", "x.pte"]
    # A file of the previous member changed since it was placed is someone's: kept.
    fetch_set(url_of(s3env), out, "y", endpoint_url=s3env.endpoint.url)
    with open(out / "extra.ptd", "r+b") as f:
        f.write(b"edited")
    report = fetch_set(url_of(s3env), out, "x", endpoint_url=s3env.endpoint.url)
    assert report.removed == [str(out / "y.pte")]
    assert (out / "extra.ptd").read_bytes().startswith(b"edited")


def test_a_member_that_cannot_fit_is_refused_before_any_download(s3env, here_fs, make_fs,
                                                                  proxy):
    from trtet_store.io import free_bytes

    mnt = make_fs("ext4", 128)
    free = free_bytes(mnt)
    # Each blob alone fits a fetch (its bytes + 33 MiB of placement room), both do not.
    first, second = free - 40 * MiB, 45 * MiB
    src = here_fs / "src"
    members = {"big": [write(src / "big.pte", first, 1), write(src / "w.ptd", second, 2)]}
    publish(members, s3env)
    (mnt / "old").mkdir()
    (mnt / "old" / "big.pte").write_bytes(b"the old version")
    proxy.reset()
    with pytest.raises(trtet_store.InsufficientSpaceError,
                       match="blobs the store lacks; nothing was downloaded"):
        fetch_set(url_of(s3env), mnt / "old", "big", endpoint_url=proxy.endpoint_url)
    assert proxy.downstream < MiB
    assert sorted(os.listdir(mnt / "old")) == ["big.pte"]
    assert (mnt / "old" / "big.pte").read_bytes() == b"the old version"
    assert os.listdir(mnt / ".trtet-blobs") == []


def test_importing_the_set_room_loads_neither_boto3_nor_torch():
    import subprocess
    import sys

    code = ("import sys, trtet_store.sets; print(sorted(m for m in ('torch', 'boto3', "
            "'botocore', 'executorch', 'awscrt') if m in sys.modules))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         check=True, cwd=Path(__file__).resolve().parents[1])
    assert out.stdout.strip() == "[]"


def test_two_publishers_at_once_one_wins_and_readers_get_the_winner_s_set(s3env, here_fs):
    """Two threads publish two different sets to one new prefix at the same instant."""
    import threading

    sets = [{n: [write(here_fs / f"s{k}" / n / "model.pte", MiB, 100 * k + i),
                 write(here_fs / f"s{k}" / "f.ptd", 2 * MiB, k)] for i, n in enumerate("ab")}
            for k in range(2)]
    for trial in range(3):
        outcome: list[str] = ["", ""]
        barrier = threading.Barrier(2)

        def one(k: int, trial: int = trial, outcome: list[str] = outcome,
                barrier: threading.Barrier = barrier) -> None:
            barrier.wait()
            try:
                publish_set(sets[k], url_of(s3env, f"race{trial}/"),
                            endpoint_url=s3env.endpoint.url,
                            config=PublishConfig(journal_dir=here_fs / f"journal{k}"))
                outcome[k] = "won"
            except ConflictError:
                outcome[k] = "conflict"

        threads = [threading.Thread(target=one, args=(k,)) for k in range(2)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        assert sorted(outcome) == ["conflict", "won"], outcome
        winner = outcome.index("won")
        out = here_fs / f"out{trial}"
        fetch_set(url_of(s3env, f"race{trial}/"), out, "b", endpoint_url=s3env.endpoint.url)
        for f in sets[winner]["b"]:
            assert (out / f.name).read_bytes() == f.read_bytes()
