"""Artifact sets under attack: a planted record, a swapped reference, names a bucket writer chose.

The attacker is a real second uid (65534, :mod:`attacker`) writing into a
mode 1777 directory on a real ext4 loop mount, or another client writing
the bucket on SeaweedFS directly (boto3). The fetch runs as root, as the
documentation's loop-mount instructions (docs/testing.md) have it. Each test proves that nothing
outside the named place changed (digests, owners and modes of the victim's
files, the destination's listing) and, where bytes could be downloaded,
counts them through the counting proxy.

- A ``.trtet-set.json`` we did not make (another user's, a FIFO) is reported
  in one line and ignored: nothing is removed by it, nothing hangs.
- A member's files are one plain ``<name>.pte`` and plain ``.ptd`` names:
  a manifest naming ``.bashrc``, ``authorized_keys``, ``cpu.ptd`` as the
  program or ``../x.ptd`` is refused before a byte is downloaded, and
  ``publish-set`` refuses the same names before anything is sent.
- A set manifest over 16 MiB is refused before its body is read.
- An ext4 reference is opened once (no link followed), checked by ``fstat``
  on that descriptor and copied from it: a directory on its path swapped
  with ``renameat2(RENAME_EXCHANGE)`` cannot redirect the copy.
"""

from __future__ import annotations

import ctypes
import json
import logging
import os
import stat
import subprocess
import sys
from pathlib import Path

import pytest
import xxhash
from attacker import NOBODY, as_nobody, listing, shared_dir, tree
from sets_helpers import write

import trtet_store.sets.store as store_mod
from trtet_store.io import MiB, NotOursError
from trtet_store.remote.errors import FileNameError, ManifestError
from trtet_store.remote.upload.config import PublishConfig
from trtet_store.sets import fetch_set, publish_set, verify_member
from trtet_store.sets.manifest import SET_KEY, SET_MAX_BYTES
from trtet_store.sets.record import FORMAT, RECORD
from trtet_store.testing.proxy import CountingProxy

FOUNDATION = MiB + 4099  # foundation.ptd, shared by the members
OWN = 64 * 1024 + 7  # each member's lora.pte


def digest(p: Path) -> str:
    return xxhash.xxh3_128(p.read_bytes()).hexdigest()


def owner_mode(p: Path) -> tuple[int, int, int]:
    st = os.lstat(p)
    return st.st_uid, st.st_gid, stat.S_IMODE(st.st_mode)


@pytest.fixture
def lora(s3env, here_fs):
    """Two members (a lora.pte each) sharing one foundation.ptd, published as one set."""
    shared = write(here_fs / "src" / "foundation.ptd", FOUNDATION, 5100)
    members = {n: [write(here_fs / "src" / n / "lora.pte", OWN, 5110 + i), shared]
               for i, n in enumerate("ab")}
    url = f"s3://{s3env.bucket}/sec/v1/"
    publish_set(members, url, endpoint_url=s3env.endpoint.url,
                config=PublishConfig(journal_dir=s3env.journal_dir))
    return url, shared.read_bytes(), members


def scratch(mnt: Path) -> Path:
    """A 1777 scratch directory nobody can reach (its parents 0755)."""
    os.chmod(mnt, 0o755)
    return shared_dir(mnt)


# --- the member record -------------------------------------------------------------------------


def test_a_planted_set_record_removes_nothing(s3env, lora, make_fs, caplog):
    """nobody's .trtet-set.json in a 1777 directory names root's program and a .ptd of
    another user's: root's fetch-set reports it in one line, ignores it, removes nothing."""
    url, foundation, members = lora
    mnt = make_fs("ext4", 64)
    shared = scratch(mnt)
    mine = write(shared / "other.pte", 5000, 1)  # root's other program
    theirs = shared / "report.ptd"

    def plant() -> None:
        theirs.write_bytes(b"nobody's own report\n" * 40)
        files = [{"name": p.name, "size": p.stat().st_size, "xxh3": digest(p),
                  "chunks": []} for p in (mine, theirs)]
        doc = {"format": FORMAT, "version": 1, "set": url, "member": "a", "set_version": "x",
               "chunk_size": MiB, "files": files}
        (shared / RECORD).write_text(json.dumps(doc))

    as_nobody(plant)
    assert os.lstat(shared / RECORD).st_uid == NOBODY
    before = {p: (digest(p), owner_mode(p)) for p in (mine, theirs)}
    with caplog.at_level(logging.WARNING, logger="trtet_store"):
        rep = fetch_set(url, shared, "a", store=mnt / "store", endpoint_url=s3env.endpoint.url)
    assert rep.removed == []
    assert rep.left_alone == [f"set record {shared / RECORD} is not ours: owned by uid 65534, "
                              "not by uid 0; left alone"]
    assert {p: (digest(p), owner_mode(p)) for p in (mine, theirs)} == before
    lines = [r.getMessage() for r in caplog.records if RECORD in r.getMessage()]
    assert any("is not ours: owned by uid 65534" in m and "left alone" in m for m in lines), lines
    assert all("\n" not in m for m in lines)
    # The member is placed, with its own record now (root's).
    assert (shared / "lora.pte").read_bytes() == members["a"][0].read_bytes()
    assert (shared / "foundation.ptd").read_bytes() == foundation
    assert os.lstat(shared / RECORD).st_uid == 0 and verify_member(shared).ok


def test_cli_fetch_set_says_in_one_line_that_a_planted_record_is_left_alone(
        s3env, lora, make_fs):
    url, foundation, _ = lora
    mnt = make_fs("ext4", 64)
    shared = scratch(mnt)
    mine = write(shared / "other.pte", 5000, 1)

    def plant() -> None:
        doc = {"format": FORMAT, "version": 1, "set": url, "member": "a", "set_version": "x",
               "chunk_size": MiB, "files": [{"name": "other.pte", "size": 5000,
                                             "xxh3": digest(mine), "chunks": []}]}
        (shared / RECORD).write_text(json.dumps(doc))

    as_nobody(plant)
    before = (digest(mine), owner_mode(mine))
    proc = subprocess.run(
        [sys.executable, "-m", "trtet_store.cli", "fetch-set", url, os.fspath(shared),
         "--member", "a", "--store", os.fspath(mnt / "store"),
         "--endpoint-url", s3env.endpoint.url],
        capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    lines = [ln for ln in proc.stderr.splitlines() if RECORD in ln]
    assert lines == [f"trtet-store fetch-set: set record {shared / RECORD} is not ours: "
                     "owned by uid 65534, not by uid 0; left alone"], proc.stderr
    assert (digest(mine), owner_mode(mine)) == before
    assert (shared / "foundation.ptd").read_bytes() == foundation


@pytest.mark.timeout(60)
def test_a_fifo_or_foreign_set_record_neither_hangs_nor_is_trusted_by_fetch_or_verify(
        s3env, lora, make_fs):
    url, foundation, _ = lora
    mnt = make_fs("ext4", 64)
    shared = scratch(mnt)
    as_nobody(lambda: os.mkfifo(shared / RECORD, 0o666))
    rep = fetch_set(url, shared, "a", store=mnt / "store", endpoint_url=s3env.endpoint.url)
    assert rep.removed == [] and (shared / "foundation.ptd").read_bytes() == foundation
    assert stat.S_ISREG(os.lstat(shared / RECORD).st_mode)  # replaced by ours
    # verify_member (trtet-store verify) of a directory whose record is a FIFO: refused.
    other = shared_dir(mnt, "other")
    as_nobody(lambda: os.mkfifo(other / RECORD, 0o666))
    with pytest.raises(NotOursError, match="not ours: a FIFO, not a regular file; left alone"):
        verify_member(other)
    assert stat.S_ISFIFO(os.lstat(other / RECORD).st_mode)  # left alone
    # ... and one whose record is another user's regular file.
    third = shared_dir(mnt, "third")
    as_nobody(lambda: (third / RECORD).write_text(json.dumps(
        {"format": FORMAT, "chunk_size": MiB, "files": []})))
    with pytest.raises(NotOursError, match=r"set record .* is not ours: owned by uid 65534"):
        verify_member(third)


# --- the names a member's files may have --------------------------------------------------------


def rewrite_manifest(s3env, prefix: str, rename: dict[str, str]) -> None:
    """A bucket writer's edit: the set manifest with some file names changed (boto3)."""
    c = s3env.client
    doc = json.loads(c.get_object(Bucket=s3env.bucket, Key=prefix + SET_KEY)["Body"].read())
    for m in doc["members"].values():
        for f in m["files"]:
            f["name"] = rename.get(f["name"], f["name"])
    c.put_object(Bucket=s3env.bucket, Key=prefix + SET_KEY, Body=json.dumps(doc).encode())


@pytest.mark.parametrize("program,ptd", [
    (".bashrc", "foundation.ptd"), ("authorized_keys", "foundation.ptd"),
    ("cpu.ptd", "foundation.ptd"), ("lora.pte", "../x.ptd"), (".bashrc", "../x.ptd")])
def test_fetch_set_refuses_names_a_bucket_writer_chose_before_downloading(
        s3env, lora, make_fs, program, ptd):
    url, _, _ = lora
    mnt = make_fs("ext4", 64)
    home = mnt / "home"
    home.mkdir(mode=0o700)
    bashrc = write(home / ".bashrc", 300, 7)
    keys = write(home / "authorized_keys", 200, 8)
    write(home / "cpu.ptd", 400, 9)
    write(home / "other.pte", 500, 10)  # a program that needs cpu.ptd, by fetch's rule
    before, parent_before = tree(home), listing(mnt)
    rewrite_manifest(s3env, "sec/v1/", {"lora.pte": program, "foundation.ptd": ptd})
    with CountingProxy.for_url(s3env.endpoint.url) as px, \
            pytest.raises(FileNameError) as err:
        fetch_set(url, home, "a", store=mnt / "store", endpoint_url=px.endpoint_url)
    msg = str(err.value)
    assert "\n" not in msg and "a set member's files are one plain <name>.pte" in msg, msg
    assert px.downstream < 64 * 1024  # the manifest alone: no blob asked for
    assert tree(home) == before and listing(mnt) == parent_before
    assert not (mnt / "x.ptd").exists() and not (mnt / "store").exists()
    assert bashrc.stat().st_size == 300 and keys.stat().st_size == 200


@pytest.mark.parametrize("names", [[".bashrc", "cpu.ptd"], ["authorized_keys"],
                                   ["cpu.ptd", "other.ptd"], ["m.pte", ".hidden.ptd"],
                                   ["m.pte", "notes.txt"]])
def test_publish_set_refuses_what_fetch_set_would_before_sending(s3env, tmp_path, names):
    files = [write(tmp_path / n, 1000 + i, i) for i, n in enumerate(names)]
    with CountingProxy.for_url(s3env.endpoint.url) as px, pytest.raises(FileNameError):
        publish_set({"m1": files}, f"s3://{s3env.bucket}/n/", endpoint_url=px.endpoint_url,
                    config=PublishConfig(journal_dir=s3env.journal_dir))
    assert s3env.client.list_objects_v2(Bucket=s3env.bucket).get("KeyCount", 0) == 0


def test_cli_publish_set_refuses_a_dotfile_program(s3env, tmp_path):
    bashrc, ptd = write(tmp_path / ".bashrc", 300, 1), write(tmp_path / "cpu.ptd", 400, 2)
    proc = subprocess.run(
        [sys.executable, "-m", "trtet_store.cli", "publish-set", f"s3://{s3env.bucket}/c/",
         "--member", "m1", os.fspath(bashrc), os.fspath(ptd),
         "--endpoint-url", s3env.endpoint.url, "--journal-dir", os.fspath(tmp_path / "j")],
        capture_output=True, text=True, timeout=120)
    assert proc.returncode != 0
    assert "the program's name '.bashrc' starts with a dot" in proc.stderr, proc.stderr
    assert s3env.client.list_objects_v2(Bucket=s3env.bucket).get("KeyCount", 0) == 0


# --- the set manifest's size ----------------------------------------------------------------------


def test_a_set_manifest_over_the_cap_is_refused_before_its_body_is_read(s3env, tmp_path):
    # Bigger than thousands of members need, and bigger than what loopback TCP holds in
    # flight: the client's receive buffer autotunes up to net.ipv4.tcp_rmem's maximum
    # (32 MiB here) plus the proxy's send buffer, so a client that closes at once may
    # still have been sent ~36 MiB. With 17 MiB the bound below failed under load
    # (4,275,712 bytes forwarded before the close): the proof is "far below the whole
    # body", from a body big enough for that to mean something.
    body = b"{" + b" " * (64 * MiB) + b"}"
    s3env.client.put_object(Bucket=s3env.bucket, Key="big/" + SET_KEY, Body=body)
    with CountingProxy.for_url(s3env.endpoint.url) as px, pytest.raises(ManifestError) as err:
        fetch_set(f"s3://{s3env.bucket}/big/", tmp_path / "d", "a",
                  endpoint_url=px.endpoint_url)
    assert "\n" not in str(err.value) and f"more than the {SET_MAX_BYTES}" in str(err.value)
    assert px.downstream < 48 * MiB, px.counts()
    assert not (tmp_path / "d").exists()


# --- the ext4 reference: one descriptor -----------------------------------------------------------

_RENAME_EXCHANGE = 2
_AT_FDCWD = -100


def exchange(a: Path, b: Path) -> None:
    libc = ctypes.CDLL(None, use_errno=True)
    if libc.renameat2(_AT_FDCWD, os.fsencode(a), _AT_FDCWD, os.fsencode(b),
                      _RENAME_EXCHANGE) != 0:
        err = ctypes.get_errno()
        raise OSError(err, os.strerror(err))


@pytest.mark.parametrize("bait", ["attacker-bytes", "link-to-root-secret"])
@pytest.mark.parametrize("stage", ["open", "copy"])
def test_a_directory_swapped_on_a_references_path_never_redirects_the_copy(
        s3env, lora, make_fs, monkeypatch, stage, bait):
    """Member a is placed under nobody's directory in a 1777 scratch (ext4: the store keeps
    a reference to a's foundation.ptd). When member b takes the reference, nobody swaps
    a's directory with one of theirs (renameat2 RENAME_EXCHANGE) right before the open, or
    right after the descriptor was checked: b gets the set's bytes, never theirs nor a
    root-only file's."""
    url, foundation, members = lora
    mnt = make_fs("ext4", 64)
    shared = scratch(mnt)
    home = mnt / "root-only"
    home.mkdir(mode=0o700)
    secret = write(home / "secret.ptd", FOUNDATION, 77)
    os.chmod(secret, 0o600)
    evil = shared / "evil"
    as_nobody(lambda: os.mkdir(evil, 0o755))
    store = mnt / "store"
    fetch_set(url, evil / "a", "a", store=store, endpoint_url=s3env.endpoint.url)
    assert store_mod.ContentStore(store).reference(
        xxhash.xxh3_128(foundation).hexdigest(), FOUNDATION) == evil / "a" / "foundation.ptd"
    fake = evil / "fake"

    def swap() -> None:
        os.mkdir(fake, 0o755)
        if bait == "attacker-bytes":
            write(fake / "foundation.ptd", FOUNDATION, 666)
        else:
            os.symlink(secret, fake / "foundation.ptd")
        exchange(evil / "a", fake)

    swapped = []

    def step(at: str, ref: Path) -> None:
        if at == stage:
            as_nobody(swap)
            swapped.append(ref)

    monkeypatch.setattr(store_mod, "_reference_step", step)
    home_before = tree(home)
    with CountingProxy.for_url(s3env.endpoint.url) as px:
        rep = fetch_set(url, mnt / "b", "b", store=store, endpoint_url=px.endpoint_url)
    assert swapped == [evil / "a" / "foundation.ptd"]
    got = (mnt / "b" / "foundation.ptd").read_bytes()
    assert got == foundation, "b's foundation.ptd is not the set's bytes"
    assert got != secret.read_bytes()
    assert verify_member(mnt / "b").ok
    assert tree(home) == home_before and owner_mode(secret) == (0, 0, 0o600)
    if stage == "open":  # the open reached their file: not taken, downloaded again
        assert rep.bytes_downloaded >= FOUNDATION and px.downstream >= FOUNDATION
    else:  # the checked descriptor is a's file whatever the path now leads to
        assert rep.bytes_downloaded == OWN
    # a's own file, now under the name nobody gave it, is unchanged.
    assert (fake / "foundation.ptd").read_bytes() == foundation


def test_a_reference_is_recorded_only_for_the_inode_moved_there(s3env, lora, make_fs):
    """refer() after the placement: a name that leads to another file (a directory on its
    path swapped between the rename and the record) records nothing."""
    url, foundation, _ = lora
    mnt = make_fs("ext4", 64)
    store = mnt / "store"
    fetch_set(url, mnt / "a", "a", store=store, endpoint_url=s3env.endpoint.url)
    cas = store_mod.ContentStore(store)
    d = xxhash.xxh3_128(foundation).hexdigest()
    placed = os.lstat(mnt / "a" / "foundation.ptd")
    other = write(mnt / "x" / "foundation.ptd", FOUNDATION, 9)
    assert not cas.refer(d, other, (placed.st_dev, placed.st_ino))
    assert cas.reference(d, FOUNDATION) is None
    link = mnt / "x" / "link.ptd"
    link.symlink_to(mnt / "a" / "foundation.ptd")
    assert not cas.refer(d, link, (placed.st_dev, placed.st_ino))
    assert cas.refer(d, mnt / "a" / "foundation.ptd", (placed.st_dev, placed.st_ino))
    assert cas.reference(d, FOUNDATION) == mnt / "a" / "foundation.ptd"


def test_a_file_another_user_put_back_with_the_recorded_bytes_is_never_removed(
        s3env, here_fs, make_fs):
    """Our own record names foundation.ptd; root removed it, and nobody put a file of the
    same bytes back under that name in the 1777 directory. Root's fetch of a member that
    does not name it removes only root's files: nobody's stays."""
    src = here_fs / "src"
    ptd = write(src / "foundation.ptd", 70_000, 1)
    members = {"a": [write(src / "a" / "a.pte", 5000, 2), ptd],
               "c": [write(src / "c" / "c.pte", 6000, 3)]}
    url = f"s3://{s3env.bucket}/own/"
    publish_set(members, url, endpoint_url=s3env.endpoint.url,
                config=PublishConfig(journal_dir=s3env.journal_dir))
    mnt = make_fs("ext4", 64)
    shared = scratch(mnt)
    fetch_set(url, shared, "a", store=mnt / "store", endpoint_url=s3env.endpoint.url)
    (shared / "foundation.ptd").unlink()
    data = ptd.read_bytes()
    as_nobody(lambda: (shared / "foundation.ptd").write_bytes(data))
    before = (digest(shared / "foundation.ptd"), owner_mode(shared / "foundation.ptd"))
    rep = fetch_set(url, shared, "c", store=mnt / "store", endpoint_url=s3env.endpoint.url)
    assert rep.removed == [os.fspath(shared / "a.pte")]  # root's own, as recorded
    assert (digest(shared / "foundation.ptd"), owner_mode(shared / "foundation.ptd")) == before
    assert owner_mode(shared / "foundation.ptd")[0] == NOBODY


def test_the_clean_up_removes_only_names_a_member_file_may_have(tmp_path):
    """A record of ours written before the closed name set (an older trtet_store that took
    a bucket writer's `.bashrc` as a program) still removes only .pte and .ptd names."""
    from trtet_store.sets.record import remove_unlisted

    files = {n: write(tmp_path / n, 300 + i, i)
             for i, n in enumerate([".bashrc", "authorized_keys", "x.ptd", "old.pte"])}
    old = {"format": FORMAT, "chunk_size": MiB,
           "files": [{"name": n, "size": p.stat().st_size, "xxh3": digest(p)}
                     for n, p in files.items()]}
    removed = remove_unlisted(tmp_path, old, set())
    assert sorted(removed) == sorted(os.fspath(tmp_path / n) for n in ("x.ptd", "old.pte"))
    assert files[".bashrc"].exists() and files["authorized_keys"].exists()
