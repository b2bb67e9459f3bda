"""A sixth planted-bug batch (U) found checks no test set up: the size caps of the key file,
the config file and the set member record, a malformed sha256 in ``Digests``, a member
naming one file twice, and the errno of a "not ours" refusal.

Each test sets the state up on a real filesystem (sparse files: a cap is judged on
``fstat``, before a byte is read) and fails with its check planted away.
"""

from __future__ import annotations

import errno
import os
from pathlib import Path

import pytest

from trtet_store.io import Digests, NotOursError, read_ours
from trtet_store.remote.errors import FileNameError
from trtet_store.remote.keys import KeyFileError, load_public_key
from trtet_store.sets.manifest import check_member_files
from trtet_store.sets.record import RECORD, RECORD_MAX_BYTES, read_record


def _sparse(path: Path, size: int, mode: int = 0o644) -> Path:
    with open(path, "wb") as f:
        f.truncate(size)
    os.chmod(path, mode)
    return path


def test_a_key_file_over_its_cap_is_refused_unread(tmp_path: Path):
    big = _sparse(tmp_path / "team.pub", (64 << 10) + 1)
    with pytest.raises(KeyFileError, match=r"65537 bytes, over the 65536"):
        load_public_key(big)


def test_a_config_file_over_its_cap_is_refused_unread(tmp_path: Path, monkeypatch):
    from trtet_store.remote.keyconfig import resolve_trusted

    config = _sparse(tmp_path / "config", (1 << 20) + 1)
    monkeypatch.delenv("TRTET_TRUSTED_KEYS", raising=False)
    monkeypatch.setenv("TRTET_CONFIG_FILE", os.fspath(config))
    with pytest.raises(KeyFileError, match=r"1048577 bytes, over the 1048576"):
        resolve_trusted(None)


def test_a_member_record_over_its_cap_is_left_alone_and_said(tmp_path: Path):
    _sparse(tmp_path / RECORD, RECORD_MAX_BYTES + 1)
    said: list[str] = []
    assert read_record(tmp_path, said) is None
    assert len(said) == 1 and f"{RECORD_MAX_BYTES + 1} bytes, over the {RECORD_MAX_BYTES}" \
        in said[0], said


def test_a_malformed_sha256_is_no_digest():
    for bad in ("xyz", "A" * 64, "0" * 63, "g" * 64):
        with pytest.raises(ValueError, match="Digests.sha256 must be a sha256 hex digest"):
            Digests("0" * 32, 0, 1 << 20, (), None, bad)
    assert Digests("0" * 32, 0, 1 << 20, (), None, "0" * 64).sha256 == "0" * 64


def test_a_member_naming_one_file_twice_is_refused():
    with pytest.raises(FileNameError, match="names a file twice"):
        check_member_files(["m.pte", "cpu.ptd", "cpu.ptd"], "s3://b/p/: member 'm'")
    check_member_files(["m.pte", "cpu.ptd", "gpu.ptd"], "s3://b/p/: member 'm'")


def test_a_refusal_is_eperm(tmp_path: Path):
    os.symlink(tmp_path / "elsewhere", tmp_path / "j")
    with pytest.raises(NotOursError) as err:
        read_ours(tmp_path / "j", limit=10)
    assert err.value.errno == errno.EPERM and isinstance(err.value, PermissionError)
