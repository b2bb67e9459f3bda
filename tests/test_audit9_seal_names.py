"""A seal is trusted only for the file it names (trtet_store/io/sealdir.py).

A seal records the identity of a file whose bytes were checked *and* the
digest they were checked against (``"xxh3"``). A seal at ``<name>``'s place
that records another digest says nothing about ``<name>``: the file is read,
not trusted by one ``lstat``, even though its identity is the one the seal
records. Here the file at blob A's path holds blob B's bytes and its seal
(written the store's way, for that very file) names B: A must be refused, not
served with B's bytes.
"""

from __future__ import annotations

import hashlib
import json
import os
from pathlib import Path

import pytest
import xxhash

from trtet_store.io import SealedDir, VerificationError, bytes_digested
from trtet_store.io.safedir import write_atomic

CHUNK = 4096


def _chunks(data: bytes) -> tuple[int, ...]:
    return tuple(xxhash.xxh3_64_intdigest(data[i:i + CHUNK])
                 for i in range(0, len(data), CHUNK))


def _seal_naming(d: SealedDir, name: str, other: str) -> None:
    """Rewrite ``name``'s seal (as the store writes one) to record ``other``'s digest,
    with the identity of the file at ``name``'s path as it is now."""
    st = os.lstat(d.path(name))
    doc = json.loads(d.seal_path(name).read_bytes())
    doc.update(xxh3=other, size=st.st_size)
    write_atomic(d.seal_path(name), json.dumps(doc).encode(), mode=0o444)


def test_a_seal_naming_another_blobs_digest_does_not_vouch_for_this_file(
        tmp_path: Path) -> None:
    a_bytes, b_bytes = b"A" * (2 * CHUNK + 3), b"B" * (2 * CHUNK + 3)
    a, b = (xxhash.xxh3_128(x).hexdigest() for x in (a_bytes, b_bytes))
    d = SealedDir(tmp_path / "store", todo="remove it")
    d.path(a).write_bytes(b_bytes)  # B's bytes at A's path
    d.write_seal(a, os.lstat(d.path(a)))
    _seal_naming(d, a, b)  # a seal for this very file, recording B's digest
    seal = json.loads(d.seal_path(a).read_bytes())
    assert seal["xxh3"] == b and d.matches(seal["identity"], os.lstat(d.path(a)))
    before = (hashlib.sha256(d.path(a).read_bytes()).hexdigest(), os.lstat(d.path(a)))

    digested = bytes_digested()
    with pytest.raises(VerificationError, match="changed since it was checked"):
        d.check(a, len(a_bytes), CHUNK, _chunks(a_bytes))  # B's bytes never served as A
    assert bytes_digested() > digested  # read, not trusted
    assert not d.sealed(a) and d.sealed_identity(a) is None
    after = os.lstat(d.path(a))
    assert hashlib.sha256(d.path(a).read_bytes()).hexdigest() == before[0]
    assert (after.st_ino, after.st_mode, after.st_uid) == \
        (before[1].st_ino, before[1].st_mode, before[1].st_uid)  # left as it is
    assert json.loads(d.seal_path(a).read_bytes())["xxh3"] == b  # not resealed as A
    assert sorted(os.listdir(d.root)) == [".trtet-seals", a]


def test_the_right_bytes_under_a_seal_naming_another_digest_are_read_and_sealed_anew(
        tmp_path: Path) -> None:
    a_bytes, b_bytes = b"a" * (CHUNK + 5), b"b" * (CHUNK + 5)
    a, b = (xxhash.xxh3_128(x).hexdigest() for x in (a_bytes, b_bytes))
    d = SealedDir(tmp_path / "store", todo="remove it")
    d.path(a).write_bytes(a_bytes)
    d.seal(a)
    assert d.sealed(a)
    _seal_naming(d, a, b)
    assert not d.sealed(a)
    digested = bytes_digested()
    assert d.check(a, len(a_bytes), CHUNK, _chunks(a_bytes)) is False  # it was read
    assert bytes_digested() > digested
    assert json.loads(d.seal_path(a).read_bytes())["xxh3"] == a and d.sealed(a)
    assert d.path(a).read_bytes() == a_bytes
