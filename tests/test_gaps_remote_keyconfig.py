"""Where keys come from (argument, environment, config file), each rule given its state.

An empty variable counts as unset (the config file then speaks); a
relative key path in the config file is relative to the config file's
directory, not to wherever the command runs (a hostile working directory
could hold its own ``team.pub``); ``~`` is expanded; a config file a group
may write, one naming a setting this version does not know, one that is
not UTF-8 or not INI are refused in one line; the argument's types are
held; the listing's SIGNED BY column says "claims ..., not checked" only
where no trusted key looked.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("cryptography")

from trtet_store.remote.keyconfig import (  # noqa: E402
    config_file,
    resolve_signing,
    resolve_trusted,
)
from trtet_store.remote.keys import KeyFileError, keygen  # noqa: E402


@pytest.fixture
def conf(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Any:
    """A config directory of our own (0700) with a team key pair; a hostile cwd with its own."""
    from types import SimpleNamespace

    for var in ("TRTET_SIGNING_KEY", "TRTET_TRUSTED_KEYS", "XDG_CONFIG_HOME"):
        monkeypatch.delenv(var, raising=False)
    d = tmp_path / "conf"
    d.mkdir(mode=0o700)
    team = keygen(d / "team.key")
    cwd = tmp_path / "cwd"
    cwd.mkdir()
    evil = keygen(cwd / "team.key")  # same file names, another key
    monkeypatch.chdir(cwd)
    path = d / "config"
    monkeypatch.setenv("TRTET_CONFIG_FILE", os.fspath(path))
    return SimpleNamespace(dir=d, cwd=cwd, team=team, evil=evil, path=path)


def _write(path: Path, text: str | bytes, mode: int = 0o600) -> None:
    path.write_bytes(text.encode() if isinstance(text, str) else text)
    os.chmod(path, mode)


def test_an_empty_variable_counts_as_unset(conf: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    _write(conf.path, "[trtet_store]\ntrusted_keys = team.key.pub\nsigning_key = team.key\n")
    monkeypatch.setenv("TRTET_TRUSTED_KEYS", "")
    monkeypatch.setenv("TRTET_SIGNING_KEY", "")
    assert set(resolve_trusted()) == {conf.team.key_id}
    assert resolve_signing().key_id == conf.team.key_id


def test_a_relative_path_in_the_config_is_its_directory_s_not_the_working_directory_s(
        conf: Any) -> None:
    _write(conf.path, "[trtet_store]\ntrusted_keys = team.key.pub\nsigning_key = team.key\n")
    got = resolve_trusted()
    assert set(got) == {conf.team.key_id}, "the working directory's team.key.pub was trusted"
    assert got[conf.team.key_id].source == os.fspath(conf.dir / "team.key.pub")
    assert resolve_signing().key_id == conf.team.key_id


def test_a_relative_path_in_the_environment_is_the_working_directory_s(
        conf: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    """The environment's paths are the caller's own, as given (no config directory)."""
    monkeypatch.setenv("TRTET_TRUSTED_KEYS", f"team.key.pub{os.pathsep}{os.pathsep}")
    assert set(resolve_trusted()) == {conf.evil.key_id}


def test_several_trusted_keys_and_a_tilde_in_the_config(conf: Any, tmp_path: Path,
                                                         monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("HOME", os.fspath(conf.cwd))
    _write(conf.path, f"[trtet_store]\ntrusted_keys = ~/team.key.pub {os.pathsep} "
                      f"{conf.dir / 'team.key.pub'}\n")
    assert set(resolve_trusted()) == {conf.team.key_id, conf.evil.key_id}


@pytest.mark.parametrize("mode", [0o620, 0o602, 0o622])
def test_a_config_file_a_group_or_others_may_write_is_refused(conf: Any, mode: int) -> None:
    _write(conf.path, "[trtet_store]\ntrusted_keys = team.key.pub\n", mode)
    with pytest.raises(KeyFileError) as caught:
        resolve_trusted()
    assert str(caught.value) == (f"config file {conf.path} (uid 0, mode {mode:04o}) can be "
                                 "written by another user, and it names whom to trust; "
                                 "chmod go-w it")
    os.chmod(conf.path, 0o644)  # readable by others is fine: it holds no secret
    assert set(resolve_trusted()) == {conf.team.key_id}


def test_a_setting_the_config_does_not_know_is_refused(conf: Any) -> None:
    """``trusted_key`` (a typo) would leave the fetch trusting anything, silently."""
    _write(conf.path, "[trtet_store]\ntrusted_key = team.key.pub\n")
    with pytest.raises(KeyFileError) as caught:
        resolve_trusted()
    assert str(caught.value) == (f"config file {conf.path}: [trtet_store] has ['trusted_key']; "
                                 "it knows ['signing_key', 'trusted_keys']")


def test_a_config_file_that_is_not_ini_is_refused_in_one_line(conf: Any) -> None:
    for text in ("[trtet_store]\ntrusted_keys = a\nno equals sign here\n",
                 "[trtet_store]\ntrusted_keys = a\n[trtet_store]\ntrusted_keys = b\n",
                 "trusted_keys = a\n"):
        _write(conf.path, text)
        with pytest.raises(KeyFileError) as caught:
            resolve_trusted()
        said = str(caught.value)
        assert said.startswith(f"config file {conf.path}: ") and "\n" not in said, said
    _write(conf.path, b"[trtet_store]\ntrusted_keys = \xff\n")
    with pytest.raises(KeyFileError) as caught:
        resolve_trusted()
    assert str(caught.value).startswith(f"config file {conf.path} is not UTF-8 (")


def test_a_config_without_the_section_or_file_trusts_nothing(conf: Any) -> None:
    assert resolve_trusted() is None and resolve_signing() is None
    _write(conf.path, "[other]\ntrusted_keys = team.key.pub\n")
    assert resolve_trusted() is None and resolve_signing() is None


def test_the_config_file_variable_expands_a_tilde(monkeypatch: pytest.MonkeyPatch,
                                                  tmp_path: Path) -> None:
    monkeypatch.setenv("HOME", os.fspath(tmp_path))
    monkeypatch.setenv("TRTET_CONFIG_FILE", "~/c/config")
    assert config_file() == tmp_path / "c" / "config"
    monkeypatch.setenv("TRTET_CONFIG_FILE", "")
    monkeypatch.setenv("XDG_CONFIG_HOME", os.fspath(tmp_path / "x"))
    assert config_file() == tmp_path / "x" / "trtet_store" / "config"


@pytest.mark.parametrize("bad,exc", [("team.key.pub", TypeError), (b"team.key.pub", TypeError),
                                     ([], ValueError), ((), ValueError), ([7], TypeError)])
def test_trusted_keys_of_another_type_or_empty_are_refused(conf: Any, bad: Any,
                                                           exc: type) -> None:
    with pytest.raises(exc):
        resolve_trusted(bad)


def test_the_listing_says_not_checked_only_where_no_trusted_key_looked() -> None:
    from trtet_store.cli.cache import _signer_shown

    kid = "ed25519:0123456789abcdef"
    row = {"signed_by": None, "claims": [kid], "checked": False, "refused": None}
    assert _signer_shown(row) == f"claims {kid}, not checked"
    assert _signer_shown({**row, "checked": True, "refused": "x"}) == f"claims {kid} (refused)"
    assert _signer_shown({**row, "signed_by": kid, "checked": True}) == kid
    assert _signer_shown({**row, "claims": []}) == "unsigned"
    assert _signer_shown({**row, "claims": [], "refused": "x"}) == "unsigned (refused)"
