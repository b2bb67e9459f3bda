"""Key and config files are trusted only under the one rule for files we read back.

A trusted key file names whom to believe; a config file names the key files.
Either, planted by another user (uid 65534, a forked child that drops to it)
in a mode 1777 directory, or a link they planted where the victim looks, must
be refused in one line ("... is not ours: owned by uid 65534, not by uid 0;
left alone"), whatever its mode; a FIFO there must not hang key resolution;
a relative ``XDG_CONFIG_HOME`` is ignored (the XDG spec), as the cache
ignores a relative ``XDG_CACHE_HOME``. Nothing outside is changed: the shared
directory's listing (names, modes, owners, digests) is the same after.
"""

from __future__ import annotations

import os
import signal
import stat
from pathlib import Path
from typing import Any

import pytest
from attacker import NOBODY, as_nobody, shared_dir
from crash_dying import in_child

from trtet_store.cache.tier import KeyFileError, RemoteTier, keygen
from trtet_store.remote.keyconfig import config_file, resolve_keys


def state(directory: Path) -> list[tuple[str, int, int, bytes | str]]:
    """Each entry: name, mode, owner, and its bytes (a link's target; a FIFO's nothing)."""
    out = []
    for p in sorted(directory.iterdir()):
        st = p.lstat()
        body: bytes | str = (os.readlink(p) if stat.S_ISLNK(st.st_mode)
                             else p.read_bytes() if stat.S_ISREG(st.st_mode) else "")
        out.append((p.name, st.st_mode, st.st_uid, body))
    return out


@pytest.fixture
def place(make_fs: Any, monkeypatch: pytest.MonkeyPatch) -> Any:
    """A 1777 directory on ext4, the victim's own keys (root, 0700 dir), no key settings."""
    from types import SimpleNamespace

    for var in ("TRTET_SIGNING_KEY", "TRTET_TRUSTED_KEYS", "XDG_CONFIG_HOME"):
        monkeypatch.delenv(var, raising=False)
    mnt = make_fs("ext4", 64)
    shared = shared_dir(mnt)
    mine = mnt / "mine"
    mine.mkdir(mode=0o700)
    monkeypatch.setenv("TRTET_CONFIG_FILE", os.fspath(mine / "no-config"))
    team = keygen(mine / "team.key")
    return SimpleNamespace(mnt=mnt, shared=shared, mine=mine, team=team)


def _planted_key(shared: Path, name: str = "evil") -> Path:
    """The attacker's own key pair, made by uid 65534 in the shared directory (0600/0644)."""
    as_nobody(lambda: keygen(shared / f"{name}.key"))
    pub = shared / f"{name}.key.pub"
    assert pub.stat().st_uid == NOBODY and stat.S_IMODE(pub.stat().st_mode) == 0o644
    return pub


def test_a_trusted_key_file_another_user_owns_is_refused(place: Any,
                                                         monkeypatch: pytest.MonkeyPatch) -> None:
    pub = _planted_key(place.shared)
    before = state(place.shared)
    said = f"trusted key {pub} is not ours: owned by uid {NOBODY}, not by uid 0; left alone"
    with pytest.raises(KeyFileError) as caught:
        RemoteTier("s3://bucket/p", trusted_keys=[place.mine / "team.key.pub", pub])
    assert str(caught.value) == said
    monkeypatch.setenv("TRTET_TRUSTED_KEYS", f"{place.mine / 'team.key.pub'}{os.pathsep}{pub}")
    with pytest.raises(KeyFileError) as caught:
        RemoteTier("s3://bucket/p")
    assert str(caught.value) == said
    # The private key of another user is refused the same way (not "mode 0600: fine").
    with pytest.raises(KeyFileError, match=f"signing key {place.shared / 'evil.key'} is not "
                       f"ours: owned by uid {NOBODY}"):
        resolve_keys(place.shared / "evil.key", None)
    assert state(place.shared) == before
    # Our own key file still loads, and root's would (an administrator's key).
    _, trusted = resolve_keys(None, [place.mine / "team.key.pub"])
    assert list(trusted) == [place.team.key_id]


def test_a_link_planted_where_the_key_file_is_looked_for_is_refused(place: Any) -> None:
    """The victim trusts the key at a path in the shared directory (a team's scratch copy);
    another user replaces it with a link: to their own key, or to ours (either refused)."""
    evil = _planted_key(place.shared)
    ours = place.shared / "team.pub"
    for target in (evil, place.mine / "team.key.pub"):
        if os.path.lexists(ours):
            as_nobody(lambda: os.unlink(ours))
        as_nobody(lambda t=target: os.symlink(t, ours))
        before = state(place.shared)
        with pytest.raises(KeyFileError) as caught:
            RemoteTier("s3://bucket/p", trusted_keys=[ours])
        assert str(caught.value) == (f"trusted key {ours} is not ours: a symbolic link; "
                                     "left alone")
        assert state(place.shared) == before


def test_a_config_file_another_user_owns_is_refused_even_read_only(
        place: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    """Mode 0644 (nobody else can write it) and still not ours: it names whom to trust
    (here keys that load, so that only the config file's own check can refuse it)."""
    config = place.shared / "config"
    team = place.mine / "team.key.pub"
    as_nobody(lambda: (config.write_text(f"[trtet_store]\ntrusted_keys = {team}\n"),
                       os.chmod(config, 0o644)))
    monkeypatch.setenv("TRTET_CONFIG_FILE", os.fspath(config))
    before = state(place.shared)
    with pytest.raises(KeyFileError) as caught:
        RemoteTier("s3://bucket/p")
    assert str(caught.value) == (f"config file {config} is not ours: owned by uid {NOBODY}, "
                                 "not by uid 0; left alone")
    assert state(place.shared) == before
    # The same file as ours is read (its key then refused as another user's).
    mine = place.mine / "config"
    mine.write_text(f"[trtet_store]\ntrusted_keys = {place.mine / 'team.key.pub'}\n")
    monkeypatch.setenv("TRTET_CONFIG_FILE", os.fspath(mine))
    assert list(RemoteTier("s3://bucket/p").trusted_keys) == [place.team.key_id]


def test_a_fifo_config_file_does_not_hang_key_resolution(place: Any,
                                                         monkeypatch: pytest.MonkeyPatch) -> None:
    fifo = place.shared / "config"
    as_nobody(lambda: os.mkfifo(fifo, 0o644))
    monkeypatch.setenv("TRTET_CONFIG_FILE", os.fspath(fifo))
    before = state(place.shared)

    def resolve() -> None:  # in a child: a blocked open must fail the test, not hang it
        signal.alarm(10)  # default action: the child dies, in_child != 0
        try:
            RemoteTier("s3://bucket/p")
        except KeyFileError as exc:
            assert str(exc) == (f"config file {fifo} is not ours: a FIFO, not a regular "
                                "file; left alone"), str(exc)
            return
        raise AssertionError("a FIFO was read as the config file")

    assert in_child(resolve) == 0
    assert state(place.shared) == before


def test_a_relative_xdg_config_home_is_ignored(place: Any, monkeypatch: pytest.MonkeyPatch,
                                               tmp_path: Path) -> None:
    """``XDG_CONFIG_HOME=conf`` would read ``./conf/trtet_store/config`` of whatever
    directory a command runs in (a shared one); the spec says ignore it."""
    monkeypatch.delenv("TRTET_CONFIG_FILE")
    home = tmp_path / "home"
    (home / ".config" / "trtet_store").mkdir(parents=True)
    monkeypatch.setenv("HOME", os.fspath(home))
    evil = _planted_key(place.shared)
    rel = place.mine / "conf" / "trtet_store"
    rel.mkdir(parents=True)
    (rel / "config").write_text(f"[trtet_store]\ntrusted_keys = {evil}\n")
    monkeypatch.chdir(place.mine)
    monkeypatch.setenv("XDG_CONFIG_HOME", "conf")
    assert config_file() == home / ".config" / "trtet_store" / "config"
    assert RemoteTier("s3://bucket/p").trusted_keys is None  # no config at home: none
    (home / ".config" / "trtet_store" / "config").write_text(
        f"[trtet_store]\ntrusted_keys = {place.mine / 'team.key.pub'}\n")
    assert list(RemoteTier("s3://bucket/p").trusted_keys) == [place.team.key_id]
    # An absolute one is honoured.
    monkeypatch.setenv("XDG_CONFIG_HOME", os.fspath(place.mine / "conf"))
    assert config_file() == rel / "config"
