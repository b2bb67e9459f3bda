"""fetch_set's failure advice, given the state each branch is for.

A server that answered and then went away is an interruption: run the same
fetch-set again (tested in test_sets_fetch_faults.py). An endpoint that never
answered at all (a wrong host or port) is not: the error stays the
endpoint's own, naming the address to check, with no rerun advice and
nothing created.
"""

from __future__ import annotations

import os
import socket
from pathlib import Path

import pytest

import trtet_store.sets.fetch as set_fetch
from trtet_store.remote.errors import EndpointUnreachableError, FetchInterruptedError
from trtet_store.sets import fetch_set


def test_an_endpoint_that_never_answered_is_said_as_such_not_as_an_interruption(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(set_fetch, "RETRY_WINDOW", 0.3)  # the policy; the state needs no 20 s
    for var, value in (("AWS_ACCESS_KEY_ID", "k"), ("AWS_SECRET_ACCESS_KEY", "s"),
                       ("AWS_DEFAULT_REGION", "us-east-1")):
        monkeypatch.setenv(var, value)
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]  # closed again: connections to it are refused
    with pytest.raises(EndpointUnreachableError) as caught:
        fetch_set("s3://bucket/rel/", tmp_path / "dest", "a",
                  endpoint_url=f"http://127.0.0.1:{port}")
    assert not isinstance(caught.value, FetchInterruptedError), caught.value
    said = str(caught.value)
    assert f"could not connect to 127.0.0.1:{port}" in said and "fetch-set" not in said, said
    assert os.listdir(tmp_path) == []


@pytest.mark.parametrize("source", ["TRTET_TRUSTED_KEYS", "config file"])
def test_a_signed_set_is_fetched_with_trusted_keys_from_the_environment(
        s3env, here_fs: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
        source: str) -> None:
    """The trust comes from the environment (or the config file), not the call: the set
    is checked by it, and each blob's own fetch into the store (a blob's manifest is
    unsigned: the signed set vouches for its bytes) does not ask it again."""
    from keyed import with_keys
    from sets_helpers import write

    from trtet_store.remote.upload.config import PublishConfig
    from trtet_store.sets import publish_set

    env = with_keys(s3env, tmp_path, monkeypatch)
    url = f"s3://{env.bucket}/signed/v1/"
    members = {"a": [write(here_fs / "src" / "a" / "model.pte", 4096 + 5, 1),
                     write(here_fs / "src" / "foundation.ptd", 8192 + 11, 7)]}
    publish_set(members, url, endpoint_url=env.endpoint.url, signing_key=env.keys / "team.key",
                config=PublishConfig(journal_dir=env.journal_dir))
    pub = env.keys / "team.key.pub"
    if source == "TRTET_TRUSTED_KEYS":
        monkeypatch.setenv("TRTET_TRUSTED_KEYS", os.fspath(pub))
    else:
        config = tmp_path / "config"
        config.write_text(f"[trtet_store]\ntrusted_keys = {pub}\n")
        config.chmod(0o600)
        monkeypatch.setenv("TRTET_CONFIG_FILE", os.fspath(config))
    out = here_fs / "out"
    out.mkdir()
    rep = fetch_set(url, out / "a", "a", endpoint_url=env.endpoint.url, store=out / "store")
    assert [(out / "a" / p.name).read_bytes() for p in members["a"]] == \
        [p.read_bytes() for p in members["a"]]
    assert rep.bytes_downloaded == sum(p.stat().st_size for p in members["a"])


def test_the_rerun_command_names_a_loaded_key_by_its_file_and_skips_one_without(
        tmp_path: Path) -> None:
    """``trusted_keys`` given as loaded PublicKeys: the command names each by the file it
    was read from; a key made in memory (no file) cannot be named and is left out."""
    import dataclasses
    import shlex

    from trtet_store.remote.keys import keygen, load_public_key
    from trtet_store.sets.fetch import fetch_set_command

    keys = tmp_path / "keys"
    keys.mkdir(mode=0o700)
    keygen(keys / "team.key")
    loaded = load_public_key(keys / "team.key.pub")
    assert loaded.source
    bare = dataclasses.replace(loaded, source="")
    words = shlex.split(fetch_set_command("s3://b/set/", tmp_path / "d",
                                          trusted_keys=[loaded, bare, keys / "other.pub"]))
    assert words == ["trtet-store", "fetch-set", "s3://b/set/", os.fspath(tmp_path / "d"),
                     "--trusted-key", loaded.source,
                     "--trusted-key", os.fspath(keys / "other.pub")]
