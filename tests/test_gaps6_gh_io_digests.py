"""io/digests.py: the sha256 a signature names bytes by (a gap hunt: no test held the
sha256 form to exactly 64 lowercase hex digits, read a file's sha256 through
:func:`read_digests`, or asked :class:`InOrderDigest` for it before every byte arrived).
"""

from __future__ import annotations

import hashlib
import os
from pathlib import Path

import pytest

from trtet_store.io import Digests, InOrderDigest, MiB, bytes_digested, is_sha256, read_digests

SHA = hashlib.sha256(b"x").hexdigest()


@pytest.mark.parametrize("value", [SHA + "0", SHA + "\n", SHA.upper(), SHA[:63], SHA[:-1] + "g",
                                   " " + SHA, SHA.encode(), None, 0])
def test_only_64_lowercase_hex_digits_are_a_sha256(value: object) -> None:
    """digests.py is_sha256: ``re.fullmatch(r"[0-9a-f]{64}", value)``: a longer string (a
    manifest naming 65 digits, or a digest with a newline) or another case is not one."""
    assert is_sha256(SHA)
    assert not is_sha256(value)
    if value is None:
        return  # Digests.sha256 None: not asked for
    with pytest.raises(ValueError, match="must be a sha256 hex digest"):
        Digests("0" * 32, 1, MiB, None, None, value)  # type: ignore[arg-type]


def test_read_digests_takes_the_sha256_in_the_same_pass(tmp_path: Path) -> None:
    """digests.py read_digests: ``Digester(chunk_size, sha256=sha256)``: asked for, the
    sha256 of the bytes comes back from the one read; not asked for, None."""
    data = os.urandom(3 * MiB + 5)
    (tmp_path / "f").write_bytes(data)
    fd = os.open(tmp_path / "f", os.O_RDONLY)
    try:
        before = bytes_digested()
        got = read_digests(fd, MiB, sha256=True)
        assert bytes_digested() == before + len(data)  # one pass
        assert got.sha256 == hashlib.sha256(data).hexdigest()
        assert (got.size, len(got.chunk_digests)) == (len(data), 4)
        assert read_digests(fd, MiB).sha256 is None
    finally:
        os.close(fd)


def test_an_in_order_sha256_is_none_until_every_byte_was_added() -> None:
    """digests.py InOrderDigest.sha256: ``self._next != self.size``: the sha256 of the bytes
    added so far is not the file's, and a caller would sign or compare a partial file."""
    data = os.urandom(1000)
    d = InOrderDigest(len(data), sha256=True)
    d.add(0, data[:600])
    assert d.sha256() is None and d.digest() is None
    d.add(600, data[600:])
    assert d.sha256() == hashlib.sha256(data).hexdigest()
    assert InOrderDigest(1, sha256=False).sha256() is None
