"""Three checks a planted-bug audit found no test of: a journal's plan token, its first
output's directory, and a set store reference's identity before the copy.

- A journal of ours named for one token whose plan says another is not replayed,
  even where every path it names is one a write of that name's token would name.
- A journal whose plan's first output lies in another directory of ours (same file
  name, temp and backup named for that output and the token) is not replayed:
  recovery would rename and remove in that other directory.
- A set store's reference whose file was replaced (a new inode, same size) between
  the look and the open is not copied at all: the descriptor's identity is checked
  before its bytes are, and the blob is downloaded again.

Real directories on the root disk and a real ext4 loop mount with SeaweedFS; each
refusal proves the victim files unchanged (bytes, owner, mode).
"""

from __future__ import annotations

import logging
import os
import shutil
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest
import xxhash
from sets_helpers import write
from test_journal_plants import T1, T2, journal_text, state

import trtet_store.sets.store as store_mod
from trtet_store import recover, write_file
from trtet_store.io.journal import DONE, ROLLING_BACK, UNPUBLISHING, OutputPlan, Plan
from trtet_store.io.names import backup_path, journal_path, temp_path
from trtet_store.remote.upload.config import PublishConfig
from trtet_store.sets import fetch_set, publish_set, verify_member
from trtet_store.testing.proxy import CountingProxy

PROGRAM = b"root's new program " * 64
OLD = b"root's old program\n" * 40
NEW = b"the interrupted write's new program\n" * 20


@pytest.fixture
def here() -> Iterator[Path]:
    """root's 0755 directory on the root disk, with a staging directory of ours (0700)."""
    path = Path(tempfile.mkdtemp(prefix="plans-refs-", dir="/tmp"))
    os.chmod(path, 0o755)
    (path / ".trtet-staging").mkdir(mode=0o700)
    yield path
    shutil.rmtree(path)


def interrupted(d: Path, token: str, at: str) -> list[OutputPlan]:
    """An interrupted write of ``d/model.pte`` (token ``token``): the old file at its name
    (and its backup when ``at`` is past the renames), the new one in its temp file."""
    dest = d / "model.pte"
    dest.write_bytes(OLD)
    temp_path(dest, token).write_bytes(NEW)
    backup = backup_path(dest, token)
    os.link(dest, backup)
    return [OutputPlan(dest=os.fspath(dest), temp=os.fspath(temp_path(dest, token)),
                       backup=os.fspath(backup), size=len(NEW))]


def refused(here: Path, path: Path, detail: str, watched: list[Path]) -> None:
    """recover, then a write of ``here/model.pte``: the journal is not ours, nothing under
    ``watched`` changes, and the journal stays."""
    before = state(*watched)
    outcomes = recover(here)
    assert [(o.journal, o.action, o.detail) for o in outcomes] == [
        (path, "not ours", f"{detail}; left alone")]
    assert state(*watched) == before
    other = here / "other.pte"
    write_file(other, [PROGRAM])
    after = state(*watched)
    assert after.pop(os.fspath(other))[-1] == PROGRAM
    assert after == before
    assert path.exists()


@pytest.mark.parametrize("other", [T2, T1[:-1] + "e"])  # another token; one differing last
@pytest.mark.parametrize("at", [ROLLING_BACK, UNPUBLISHING, DONE])
def test_a_journal_whose_plan_token_is_not_its_names_is_not_replayed(here, at, other):
    """Named for token T1, its plan says another; every path it names is T1's (temp,
    backup), so only the token check refuses it. Replayed, it would remove the temp and
    the backup beside model.pte (and, done, rename the temp over model.pte)."""
    assert other != T1
    outputs = interrupted(here, T1, at)
    path = journal_path(here / "model.pte", T1)
    path.write_bytes(journal_text(Plan(token=other, outputs=outputs), at))
    refused(here, path, f"its plan's token {other!r} is not the one in its name", [here])


@pytest.mark.parametrize("at", [ROLLING_BACK, UNPUBLISHING, DONE])
def test_a_journal_whose_first_output_is_in_another_directory_is_not_replayed(here, at):
    """The journal is here/.model.pte.<T1>.trtet-journal; its plan's first output is
    victim/model.pte (root's 0700 directory: one of ours), temp and backup named for it
    and T1. Replayed, recovery would remove and rename in victim/."""
    victim = here / "victim"
    victim.mkdir(mode=0o700)
    outputs = interrupted(victim, T1, at)
    path = journal_path(here / "model.pte", T1)
    path.write_bytes(journal_text(Plan(token=T1, outputs=outputs), at))
    first = outputs[0].dest
    refused(here, path, f"its plan's first output {first} is not in {here}", [here, victim])
    assert (victim / "model.pte").read_bytes() == OLD
    assert Path(outputs[0].temp).read_bytes() == NEW
    assert Path(outputs[0].backup).read_bytes() == OLD


FOUNDATION = 256 * 1024 + 3  # foundation.ptd, in both members
OWN = 64 * 1024 + 5


@pytest.fixture
def pair(s3env, here_fs):
    """Members a and b (a lora.pte each) sharing one foundation.ptd, published as a set."""
    shared = write(here_fs / "src" / "foundation.ptd", FOUNDATION, 5700)
    members = {n: [write(here_fs / "src" / n / "lora.pte", OWN, 5710 + i), shared]
               for i, n in enumerate("ab")}
    url = f"s3://{s3env.bucket}/pair/v1/"
    publish_set(members, url, endpoint_url=s3env.endpoint.url,
                config=PublishConfig(journal_dir=s3env.journal_dir))
    return url, shared.read_bytes()


@pytest.mark.parametrize("replacement", ["file", "directory"])
def test_a_reference_replaced_before_the_open_is_never_copied(
        s3env, pair, make_fs, monkeypatch, caplog, replacement):
    """Member a is placed on ext4 (the store keeps a reference to a's foundation.ptd). When
    member b takes the reference, a different file of the same size (a new inode), or a
    directory, is put at that name after the look and before the open: its descriptor's
    identity is not the recorded one, so nothing is copied from it, and b's
    foundation.ptd is the set's bytes, downloaded again."""
    url, foundation = pair
    mnt = make_fs("ext4", 64)
    store = mnt / "store"
    fetch_set(url, mnt / "a", "a", store=store, endpoint_url=s3env.endpoint.url)
    ref = mnt / "a" / "foundation.ptd"
    assert store_mod.ContentStore(store).reference(
        xxhash.xxh3_128(foundation).hexdigest(), FOUNDATION) == ref
    bait = write(mnt / "bait.ptd", FOUNDATION, 666)
    bait_bytes = bait.read_bytes()
    assert bait_bytes != foundation
    replaced = []

    def step(at: str, path: Path) -> None:
        if at == "open":
            if replacement == "file":
                os.rename(bait, path)  # same size, a new inode
            else:
                os.unlink(path)
                os.mkdir(path, 0o755)
            replaced.append(path)

    copied = []
    real_copy = store_mod._copy_reference

    def copy(fd: int, src: Path, dest: Path, size: int) -> None:
        real_copy(fd, src, dest, size)
        copied.append((src, dest.read_bytes()))

    monkeypatch.setattr(store_mod, "_reference_step", step)
    monkeypatch.setattr(store_mod, "_copy_reference", copy)
    with caplog.at_level(logging.INFO, logger="trtet_store"), \
            CountingProxy.for_url(s3env.endpoint.url) as px:
        rep = fetch_set(url, mnt / "b", "b", store=store, endpoint_url=px.endpoint_url)
    assert replaced == [ref]
    assert copied == [], "a file at the reference's name was copied before its identity check"
    assert "not the file placed as blob" in caplog.text
    got = (mnt / "b" / "foundation.ptd").read_bytes()
    assert got == foundation and got != bait_bytes
    assert verify_member(mnt / "b").ok
    assert rep.bytes_downloaded >= FOUNDATION and px.downstream >= FOUNDATION
    if replacement == "file":
        assert ref.read_bytes() == bait_bytes  # the replacing file itself untouched
    else:
        assert ref.is_dir() and not any(ref.iterdir())
