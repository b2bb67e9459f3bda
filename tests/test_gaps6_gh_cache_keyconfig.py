"""Where the key config is read from (remote/keyconfig.py, gap hunt of hardening round 5).

The XDG spec ignores a relative ``XDG_CONFIG_HOME``: a config file that a working
directory happens to hold (``rel/trtet_store/config``) is never read, and the default
under ``~/.config`` is used instead.
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from trtet_store.remote.keyconfig import config_file, resolve_keys


@pytest.fixture
def home(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    for var in ("TRTET_SIGNING_KEY", "TRTET_TRUSTED_KEYS", "TRTET_CONFIG_FILE"):
        monkeypatch.delenv(var, raising=False)
    home = tmp_path / "home"
    home.mkdir()
    monkeypatch.setenv("HOME", os.fspath(home))
    work = tmp_path / "work"
    (work / "rel" / "trtet_store").mkdir(parents=True)
    monkeypatch.chdir(work)
    return home


@pytest.mark.parametrize("value", ["rel", "./rel", "rel/"])
def test_a_relative_xdg_config_home_is_ignored(home: Path, monkeypatch: pytest.MonkeyPatch,
                                              value: str) -> None:
    monkeypatch.setenv("XDG_CONFIG_HOME", value)
    assert config_file() == home / ".config" / "trtet_store" / "config"
    # A config the working directory holds names a key it planted: never read.
    Path("rel/trtet_store/config").write_text("[trtet_store]\ntrusted_keys = /planted.pub\n")
    os.chmod("rel/trtet_store/config", 0o644)
    assert resolve_keys() == (None, None)


def test_an_absolute_xdg_config_home_is_used(home: Path, tmp_path: Path,
                                            monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("XDG_CONFIG_HOME", os.fspath(tmp_path / "xdg"))
    assert config_file() == tmp_path / "xdg" / "trtet_store" / "config"
