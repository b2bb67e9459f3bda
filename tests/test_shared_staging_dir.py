"""A staging directory shared between users: another user's files never raise PermissionError.

A store tells a live owner from a dead one by locking the owner's lock
file, which needs no write access, so it is opened read-only; one that is
not even readable (mode 0600) belongs to a store we cannot judge, whose
blobs are left alone. In a sticky directory (like /tmp) another user's debris
cannot be removed by us and is left for its owner. The tests run as root, so
the unprivileged side runs in a forked child that takes the uid of
``nobody``.
"""

from __future__ import annotations

import json
import os
import pwd

import pytest
from crash_dying import die, in_child
from digests import digest, file_digest
from faults import WrappedCalls

from trtet_store import BlobStore, recover, write_file
from trtet_store.io import names
from trtet_store.io.units import KiB


def _as_nobody(fn, report: str) -> int:
    """Run ``fn`` in a child as the user ``nobody``; its JSON result goes to ``report``."""
    nobody = pwd.getpwnam("nobody")

    def child() -> None:
        os.setgroups([])
        os.setgid(nobody.pw_gid)
        os.setuid(nobody.pw_uid)
        result = fn()
        with open(report, "w") as f:
            json.dump(result, f)

    return in_child(child)


class DieAtFirstMoveTruncation(WrappedCalls):
    """End the process (as SIGKILL would) at the first truncation of a staged blob
    (by its descriptor: a move's syncs and cuts may run in another thread)."""

    def _wrap(self, name, real):
        def call(*args, **kwargs):
            if name == "ftruncate" and os.readlink(f"/proc/self/fd/{args[0]}").endswith(
                    names.BLOB_SUFFIX):
                die()
            return real(*args, **kwargs)

        return call


@pytest.mark.parametrize("mode", [0o600, 0o644], ids=["0600", "0644"])
def test_another_users_store_lock_and_journal_raise_nothing_for_an_unprivileged_user(
        make_fs, mode):
    mnt = make_fs("ext4", 64)
    shared = mnt / "shared"
    shared.mkdir()
    os.chmod(shared, 0o1777)  # like /tmp: anyone creates, only owners remove
    report = os.fspath(mnt / "report.json")
    # root's dead writer: it staged two blobs and died moving one into m.pte
    # (its journal, temp file and pin stay, and a half-written blob).
    data = os.urandom(300 * KiB + 7)
    kept_data = os.urandom(100 * KiB)

    def write_and_die() -> None:
        store = BlobStore(shared, chunk_size=16 * KiB)
        blob = store.put(data)
        kept = store.put(kept_data)  # referenced until the death: a blob dies with its object
        unfinished = store.writer()  # kept referenced: its file must stay open
        unfinished.__enter__().write(b"half")  # a .blob.part, debris of a dead store
        with DieAtFirstMoveTruncation():
            written = write_file(shared / "m.pte", [b"h" * 100, blob], consume=True,
                                 chunk_size=64 * KiB, placements={"move"})
        # Not reached, unless the blob was not moved: say how it was placed.
        (mnt / "placed").write_text(repr(written.placements))
        kept.close()

    # root's live store (first: a store starting later would remove the dead
    # one's lock file, and then anyone can tell that store is dead).
    live = BlobStore(shared)
    live_blob = live.put(os.urandom(50 * KiB))
    code = in_child(write_and_die)
    placed = mnt / "placed"
    assert code == 86, placed.read_text() if placed.exists() else f"exit {code}"
    # And a destination lock file nobody holds.
    stray_lock = names.lock_path_of(shared / "x.pte")
    stray_lock.write_bytes(b"")
    for p in shared.iterdir():
        if p.name.startswith(".") and not p.is_symlink():
            os.chmod(p, mode)
    before = sorted(p.name for p in shared.iterdir())

    def unprivileged() -> dict:
        store = BlobStore(shared)
        orphans = store.orphans()
        outcomes = recover(shared)
        mine = store.put(b"mine")
        mine_path = os.fspath(mine.path)
        store.close()
        return {"orphans": sorted(o.path.name for o in orphans),
                "actions": sorted({o.action for o in outcomes}),
                "mine_gone": not os.path.exists(mine_path)}

    code = _as_nobody(unprivileged, report)
    assert code == 0, "the unprivileged store or recover raised (see the captured stderr)"
    with open(report) as f:
        result = json.load(f)
    os.unlink(report)
    assert result["mine_gone"]
    if mode == 0o644:
        # Readable lock files: the dead store is found dead, its unpinned blob listed.
        assert len(result["orphans"]) == 2
    else:
        assert result["orphans"] == []  # cannot tell: nothing taken for an orphan
    assert "rolled back" not in result["actions"]  # not nobody's to recover
    # Nothing of root's was removed or changed.
    assert sorted(p.name for p in shared.iterdir()) == before
    assert file_digest(live_blob.path) == live_blob.digest
    # root recovers its own write: it finishes the move.
    outcomes = recover(shared)
    assert "rolled forward" in [o.action for o in outcomes]
    assert digest((shared / "m.pte").read_bytes()) == digest(b"h" * 100 + data)
    staged = {digest(p.read_bytes()) for p in shared.glob("*.blob")}
    assert staged == {digest(kept_data), live_blob.digest}
    live.close()
