"""Where a tier's keys come from (``trtet_store.remote.keyconfig``: ``resolve_trusted``,
``resolve_signing``, ``resolve_keys``): a ``TRTET_TRUSTED_KEYS`` or ``TRTET_SIGNING_KEY`` that
names no file (``:``, ``::``, blanks; a CI line like ``TRTET_TRUSTED_KEYS=$EXTRA:`` with
``EXTRA`` empty) counts as unset, as an empty one does: the config file's keys apply. Taken
as "no trusted keys", it silently made the shared tier accept every entry, unsigned ones
too, though the config file names whom to trust.
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from trtet_store.remote.keyconfig import resolve_keys, resolve_signing, resolve_trusted
from trtet_store.remote.keys import keygen


@pytest.mark.parametrize("value", [os.pathsep, os.pathsep * 2, " ", f" {os.pathsep} "],
                         ids=["sep", "two-seps", "blank", "blank-sep"])
def test_a_variable_naming_no_key_file_counts_as_unset(tmp_path: Path,
                                                       monkeypatch: pytest.MonkeyPatch,
                                                       value: str) -> None:
    d = tmp_path / "conf"
    d.mkdir(mode=0o700)
    team = keygen(d / "team.key")
    config = d / "config"
    config.write_text("[trtet_store]\ntrusted_keys = team.key.pub\nsigning_key = team.key\n")
    config.chmod(0o600)
    monkeypatch.setenv("TRTET_CONFIG_FILE", os.fspath(config))
    monkeypatch.setenv("TRTET_TRUSTED_KEYS", value)
    monkeypatch.setenv("TRTET_SIGNING_KEY", value)
    trusted = resolve_trusted()
    assert trusted is not None and set(trusted) == {team.key_id}, trusted
    assert resolve_signing().key_id == team.key_id
    signing, trusted = resolve_keys()
    assert signing.key_id == team.key_id and set(trusted) == {team.key_id}
