"""io/sealdir.py SealedDir: what a renewal answers, what a seal keeps beside, whose seal is read.

- ``renew`` of a file still sealed records the new identity and says so (True), which the
  engine cache logs as "resealed" (``return True``);
- the store's form keeps the sha256 given to ``seal`` beside the seal (``**extra``): what a
  signed set's check takes instead of reading the blob again;
- the cache's form (``beside=True``) hands another user's seal file to ``refuse`` (the
  cache refuses it with PermissionError), never trusting or skipping it quietly
  (``if self.beside`` in ``read_seal``).
"""

from __future__ import annotations

import hashlib
import json
import os
from pathlib import Path
from typing import Any

import pytest
import xxhash
from attacker import NOBODY, tree
from test_sealdir import _in_form

from trtet_store.io import Seal, SealedDir

CHUNK = 4096


def _cache_form(tmp_path: Path, data: bytes, **kw: Any) -> tuple[SealedDir, str]:
    return _in_form(tmp_path, True, data, **kw)


def test_renew_of_a_sealed_file_records_its_new_identity_and_says_so(tmp_path: Path) -> None:
    data = b"R" * (CHUNK + 3)
    d, name = _cache_form(tmp_path, data)
    old = d.read(name)
    os.link(d.path(name), tmp_path / "copy")  # a new identity (ctime), the same bytes
    os.unlink(d.path(name))
    os.rename(tmp_path / "copy", d.path(name))
    assert not d.sealed(name)
    fd = os.open(d.path(name), os.O_RDONLY)
    try:
        new = Seal.read(fd, CHUNK)
    finally:
        os.close(fd)
    assert new.identity != old.identity
    assert d.renew(name, new) is True
    assert d.read(name) == new and d.sealed(name)


def test_the_store_form_keeps_the_sha256_given_beside_its_seal(tmp_path: Path) -> None:
    data = b"S" * 5000
    root = tmp_path / "store"
    d = SealedDir(root, todo="remove it")
    name = xxhash.xxh3_128(data).hexdigest()
    d.path(name).write_bytes(data)
    sha = hashlib.sha256(data).hexdigest()
    d.seal(name, sha256=sha)
    doc = json.loads(d.seal_path(name).read_bytes())
    assert (doc["xxh3"], doc["size"], doc["sha256"]) == (name, 5000, sha)
    assert d.sealed(name)
    d.seal(name)  # sealed again without one: none kept
    assert "sha256" not in json.loads(d.seal_path(name).read_bytes())


def test_another_users_seal_in_the_cache_form_is_refused_and_left_alone(tmp_path: Path) -> None:
    """``refuse=True`` (the engine cache): another user's seal raises NotOursError, naming
    its owner, and nothing in the directory changes; without it, the seal is not trusted."""
    from trtet_store.io import NotOursError

    d, name = _cache_form(tmp_path, b"F" * 100, refuse=True)
    assert d.read(name) is not None
    os.chown(d.seal_path(name), NOBODY, NOBODY)
    before = tree(tmp_path / "blobs")
    with pytest.raises(NotOursError, match="owned by uid 65534") as caught:
        d.read(name)
    assert caught.value.other_owner
    assert tree(tmp_path / "blobs") == before
    assert os.stat(d.seal_path(name)).st_uid == NOBODY
    lenient = SealedDir(tmp_path / "blobs", beside=True, temp_dir=tmp_path)
    assert lenient.read(name) is None  # not trusted, not raised
    assert tree(tmp_path / "blobs") == before


def test_relinked_with_nothing_changed_leaves_the_seal_and_its_sha256(tmp_path: Path) -> None:
    """relinked: ``if new is not None and new != seal``: a file whose identity did not move
    at all keeps its seal file as it is (no rewrite, which would drop the sha256 beside)."""
    data = b"K" * 3000
    d = SealedDir(tmp_path / "store", todo="remove it")
    name = xxhash.xxh3_128(data).hexdigest()
    d.path(name).write_bytes(data)
    sha = hashlib.sha256(data).hexdigest()
    d.seal(name, sha256=sha)
    before = os.stat(d.seal_path(name))
    d.relinked(name)
    d.seal(name, relink=True)
    after = os.stat(d.seal_path(name))
    assert (after.st_ino, after.st_mtime_ns) == (before.st_ino, before.st_mtime_ns)
    assert json.loads(d.seal_path(name).read_bytes())["sha256"] == sha


@pytest.mark.parametrize("identity", [[1, 2, 3, 4], "abcde", {"a": 1}],
                         ids=["four-members", "a-string", "an-object"])
def test_a_store_seal_whose_identity_is_not_five_numbers_is_no_seal(tmp_path: Path,
                                                                   identity) -> None:
    """read: ``not isinstance(ident, list) or len(ident) != 5``: such a seal vouches for
    nothing, and no identity is taken from it."""
    data = b"I" * 700
    d = SealedDir(tmp_path / "store", todo="remove it")
    name = xxhash.xxh3_128(data).hexdigest()
    d.path(name).write_bytes(data)
    d.seal(name)
    good = d.sealed_identity(name)
    assert good is not None and len(good) == 5
    doc = json.loads(d.seal_path(name).read_bytes())
    doc["identity"] = identity
    os.chmod(d.seal_path(name), 0o644)
    d.seal_path(name).write_text(json.dumps(doc))
    assert d.read(name) is None and d.sealed_identity(name) is None
    assert not d.sealed(name)
