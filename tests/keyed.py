"""The signing tests' common set-up: no key from the machine, a team key and another's.

Every test of signed documents (program and set manifests, the tier's entries) starts
from the same state: ``TRTET_SIGNING_KEY`` and ``TRTET_TRUSTED_KEYS`` unset and the
config file pointed at a missing file (so nothing of the machine's is trusted), and two
fresh ed25519 key pairs in a 0700 ``keys/`` directory.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import pytest

from trtet_store.remote.keys import keygen


def with_keys(s3env: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Any:
    """``s3env`` with ``team`` and ``evil`` (PublicKeys; private keys at ``keys/<name>.key``)
    and ``keys`` (the directory), the machine's own keys and config out of the way."""
    for var in ("TRTET_SIGNING_KEY", "TRTET_TRUSTED_KEYS"):
        monkeypatch.delenv(var, raising=False)
    monkeypatch.setenv("TRTET_CONFIG_FILE", os.fspath(tmp_path / "no-config"))
    keys = tmp_path / "keys"
    keys.mkdir(mode=0o700)
    s3env.team, s3env.evil = keygen(keys / "team.key"), keygen(keys / "evil.key")
    s3env.keys = keys
    return s3env
