"""``trtet-store recover DIR`` looks into the set store beside DIR only when it is ours.

``fetch-set`` keeps its partial downloads in ``DIR/../.trtet-blobs/.trtet-staging``;
``recover DIR`` names them, and ``--discard-fetches`` removes them. That store and
its staging directory are looked into only after both pass the staging
directory check (not a link, owned by us, not writable by group or others). Here
each is made unsafe in turn, on a real filesystem with a real second uid: the
store another user's (uid 65534, with an interrupted download of theirs in it),
the store ours but its staging directory theirs, and the store a symbolic link
to another directory of root's that holds a fake interrupted download. ``recover
DIR`` (and ``--discard-fetches``) must print the one line saying the store was
not looked into, name no download there, and remove nothing.
"""

from __future__ import annotations

import json
import os
import shutil
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest
from attacker import NOBODY, as_nobody, tree

from trtet_store import cli
from trtet_store.io import STAGING_DIR
from trtet_store.sets.store import STORE_DIR

FID = "0123456789abcdef0123456789abcdef"
URL = "s3://bucket/rel/blobs/abc"


@pytest.fixture
def top() -> Iterator[Path]:
    """A 0755 directory under /tmp that uid 65534 can reach (tmp_path's parents are 0700)."""
    path = Path(tempfile.mkdtemp(prefix="recover-store-", dir="/tmp"))
    os.chmod(path, 0o755)
    yield path
    shutil.rmtree(path)


def fake_download(store: Path) -> None:
    """An interrupted download in ``store/.trtet-staging``: a fetch's journal (head, one
    range written) and its run file, as a killed fetch leaves them."""
    staging = store / STAGING_DIR
    staging.mkdir(mode=0o700, exist_ok=True)
    head = {"fetch": 1, "url": URL, "dest": os.fspath(store / "abc.blob"),
            "runs": [[0, 0, 4096]]}
    rng = {"obj": 0, "offset": 0, "size": 2048, "crc": 1}
    (staging / f"fetch-{FID}.journal").write_text(json.dumps(head) + "\n" + json.dumps(rng)
                                                   + "\n")
    (staging / f"fetch-{FID}-0-0-4096.run").write_bytes(b"x" * 2048)


def recover_cli(capsys, *argv: str | os.PathLike) -> tuple[int, list[str], str]:
    capsys.readouterr()
    code = cli.main(["recover", *map(os.fspath, argv)])
    captured = capsys.readouterr()
    return code, captured.out.splitlines(), captured.err


def members(top: Path) -> Path:
    """DIR (a set member's directory, as fetch-set makes it) under ``top/machine``."""
    machine = top / "machine"
    machine.mkdir(mode=0o755)
    dest = machine / "a"
    dest.mkdir()
    return dest


def check_left_alone(capsys, dest: Path, watched: Path, why: str) -> None:
    """``recover DIR`` and ``recover DIR --discard-fetches``: one line, nothing listed or
    removed under ``watched``."""
    before = tree(watched)
    owners = {p: (p.lstat().st_uid, p.lstat().st_mode) for p in [watched, *watched.rglob("*")]}
    for extra in ((), ("--discard-fetches",)):
        code, out, err = recover_cli(capsys, dest, *extra)
        assert "Traceback" not in err, err
        said = [ln for ln in out if ln.startswith("trtet-store recover: the set store beside")]
        assert len(said) == 1, out
        assert said[0].startswith(f"trtet-store recover: the set store beside {dest}: "), said
        assert why in said[0], said
        assert said[0].endswith("not looked into"), said
        assert not any("interrupted download" in ln or "discarded" in ln for ln in out), out
        assert FID not in "\n".join(out) + err
        assert code == 0, (out, err)
        assert tree(watched) == before
        assert {p: (p.lstat().st_uid, p.lstat().st_mode)
                for p in [watched, *watched.rglob("*")]} == owners


def test_a_set_store_of_another_user_is_not_looked_into(top, capsys):
    dest = members(top)
    store = dest.parent / STORE_DIR

    def theirs() -> None:
        store.mkdir(mode=0o755)
        fake_download(store)

    os.chmod(dest.parent, 0o777)  # the attacker may make the store there
    as_nobody(theirs)
    os.chmod(dest.parent, 0o755)
    assert store.stat().st_uid == (store / STAGING_DIR).stat().st_uid == NOBODY
    check_left_alone(capsys, dest, store, f"owned by uid {NOBODY}")


def test_a_set_store_whose_staging_is_another_users_is_not_looked_into(top, capsys):
    dest = members(top)
    store = dest.parent / STORE_DIR
    store.mkdir(mode=0o755)
    os.chmod(store, 0o777)
    as_nobody(lambda: fake_download(store))
    os.chmod(store, 0o755)
    assert store.stat().st_uid == 0 and (store / STAGING_DIR).stat().st_uid == NOBODY
    check_left_alone(capsys, dest, store, f"owned by uid {NOBODY}")


def test_a_set_store_that_is_a_link_is_not_followed(top, capsys):
    """The store a symbolic link to another directory of root's (0700, root's own) that
    holds an interrupted download: neither named nor discarded through the link."""
    dest = members(top)
    elsewhere = top / "elsewhere"
    elsewhere.mkdir(mode=0o700)
    fake_download(elsewhere)
    store = dest.parent / STORE_DIR
    store.symlink_to(elsewhere)
    check_left_alone(capsys, dest, elsewhere, "link")
    assert os.readlink(store) == os.fspath(elsewhere)


def test_the_same_download_in_a_store_of_ours_is_named_and_discarded(top, capsys):
    """The control: the fake download above is one recover names and discards when the
    store and its staging directory are ours (so the refusals above are the checks')."""
    dest = members(top)
    store = dest.parent / STORE_DIR
    store.mkdir(mode=0o755)
    fake_download(store)
    code, out, _ = recover_cli(capsys, dest)
    assert code == 0
    assert any(ln.startswith(f"interrupted download of a killed fetch-set in the set store "
                             f"{store}: blob abc.blob from {URL}") for ln in out), out
    code, out, _ = recover_cli(capsys, dest, "--discard-fetches")
    assert code == 0
    assert any(ln.startswith("discarded the set store's download of blob abc.blob")
               for ln in out), out
    assert not (store / STAGING_DIR).exists() or os.listdir(store / STAGING_DIR) == []
