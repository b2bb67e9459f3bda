"""keygen never leaves half a key pair: when the public key cannot be written, the private
key it has just written is removed, and what stands at the public key's name is left alone.

The state: the ``.pub`` name is free when keygen looks, and taken (another keygen, another
user) by the time it writes it, after the private key is on disk.
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from trtet_store.remote import keys


def test_a_public_key_name_taken_after_the_private_key_is_written_leaves_no_half_pair(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    path = tmp_path / "team.key"
    theirs = tmp_path / "team.key.pub"
    create = keys._create
    calls = []

    def create_then_race(target: Path, data: bytes, mode: int) -> None:
        calls.append(Path(target))
        if Path(target) == theirs:  # between keygen's look and its write: someone else's
            theirs.write_bytes(b"their public key\n")
        create(target, data, mode)

    monkeypatch.setattr(keys, "_create", create_then_race)
    with pytest.raises(FileExistsError):
        keys.keygen(path)
    assert calls == [path, theirs]
    assert not os.path.lexists(path), "the private key of a half pair was left behind"
    assert theirs.read_bytes() == b"their public key\n"
    assert sorted(os.listdir(tmp_path)) == ["team.key.pub"]
