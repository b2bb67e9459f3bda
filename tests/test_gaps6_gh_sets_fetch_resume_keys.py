"""A plain ``fetch`` with trusted keys, interrupted: the rerun it says keeps the keys.

The program is signed; every ranged GET of it is cut (a proxy resets the
response), so the fetch gives up with FetchInterruptedError. The command it
says to run again names each trusted key given (``--trusted-key``), as a path or as a key
loaded from one: a rerun
without them would fetch under another trust than the one asked for.
"""

from __future__ import annotations

import os
import shlex
from pathlib import Path
from typing import Any

import pytest
from keyed import with_keys
from sets_helpers import write
from tcp_proxy import Fault, TcpProxy

import trtet_store
from trtet_store.remote.errors import FetchInterruptedError
from trtet_store.remote.keys import load_public_key


@pytest.mark.parametrize("given", ["path", "loaded key"])
def test_an_interrupted_signed_fetch_says_to_rerun_it_with_its_trusted_keys(
        s3env: Any, here_fs: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
        given: str) -> None:
    env = with_keys(s3env, tmp_path, monkeypatch)
    url = f"s3://{env.bucket}/k/model.pte"
    src = write(here_fs / "src" / "model.pte", 64 * 1024 + 5, 3)
    trtet_store.publish([os.fspath(src)], url, endpoint_url=env.endpoint.url,
                        journal_dir=env.journal_dir, signing_key=env.keys / "team.key")
    rest = env.endpoint.url.split("//", 1)[1]
    target = (rest.rsplit(":", 1)[0], int(rest.rsplit(":", 1)[1]))

    def ranged_get(m) -> bool:
        return m.request is not None and "range" in m.request.headers \
            and m.target.split("?")[0].endswith("/k/model.pte")

    pub = env.keys / "team.key.pub"
    out = here_fs / "out"
    out.mkdir()
    trusted = pub if given == "path" else load_public_key(pub)
    cut = [Fault("response", "reset", at=100, match=ranged_get, times=10_000)]
    with TcpProxy(target, cut) as proxy, pytest.raises(FetchInterruptedError) as caught:
        trtet_store.fetch(url, out / "model.pte", endpoint_url=proxy.url, trusted_keys=[trusted])
    words = shlex.split(caught.value.resume)
    assert words[:2] == ["trtet-store", "fetch"], words
    i = words.index("--trusted-key")
    assert words[i + 1] == os.fspath(pub), words
    assert not (out / "model.pte").exists()
