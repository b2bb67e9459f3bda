"""FetchConfig: ``config=`` of fetch and fetch_set, the old keywords beside it.

Against the real S3 server: the two spellings make the same requests (the
ranges each GET asks for, counted on the client's own event hooks) and place
the same bytes; a keyword given beside the object with another value is
refused before any request or file.
"""

from __future__ import annotations

import os
import threading
from pathlib import Path
from typing import Any

import pytest
from attacker import listing

import trtet_store
from trtet_store import FetchConfig
from trtet_store.io.units import MiB
from trtet_store.remote.s3 import S3
from trtet_store.sets import fetch_set, publish_set

DEAD = "http://127.0.0.1:9"  # discard port: nothing answers
SIZE = 3 * MiB + 5
OPTIONS = dict(concurrency=2, range_size=MiB, attempts=2)


class GetLog:
    """The Range of every GetObject a boto3 client sends, and the most in flight at once."""

    def __init__(self, client: Any) -> None:
        self.ranges: list[str] = []
        self.in_flight = self.most = 0
        self._lock = threading.Lock()
        client.meta.events.register("before-call.s3.GetObject", self._before)
        client.meta.events.register("after-call.s3.GetObject", self._after)

    def _before(self, params: dict, **_: Any) -> None:
        with self._lock:
            self.ranges.append(params.get("headers", {}).get("Range", "whole"))
            self.in_flight += 1
            self.most = max(self.most, self.in_flight)

    def _after(self, **_: Any) -> None:
        with self._lock:
            self.in_flight -= 1


def _published(s3env: Any, tmp_path: Path) -> tuple[str, bytes]:
    src = tmp_path / "src.pte"
    data = os.urandom(SIZE)
    src.write_bytes(data)
    url = f"s3://{s3env.bucket}/p/m.pte"
    trtet_store.publish(src, url, endpoint_url=s3env.endpoint.url,
                        journal_dir=s3env.journal_dir)
    return url, data


def test_fetch_config_and_keywords_make_the_same_fetch(s3env, tmp_path):
    url, data = _published(s3env, tmp_path)
    runs = {}
    for how, kw in (("keywords", OPTIONS), ("config", {"config": FetchConfig(**OPTIONS)}),
                    ("both", {"config": FetchConfig(**OPTIONS), "range_size": MiB}),
                    ("default", {})):
        out = tmp_path / how
        out.mkdir()
        client = s3env.endpoint.client()
        log = GetLog(client)
        report = trtet_store.fetch(url, out / "m.pte", client=client, **kw)
        assert (out / "m.pte").read_bytes() == data
        # The manifest is one whole GET; the object's bytes are ranged.
        runs[how] = (sorted(r for r in log.ranges if r != "whole"), report.bytes_downloaded)
        assert log.most <= (2 if how != "default" else 4)
    assert runs["keywords"] == runs["config"] == runs["both"]
    assert len(runs["config"][0]) == 4  # 1 MiB ranges reached the download ...
    assert len(runs["default"][0]) == 1  # ... where the default asks for one 32 MiB range


def test_fetch_set_config_and_keywords_make_the_same_fetch(s3env, tmp_path):
    src = tmp_path / "model.pte"
    data = os.urandom(SIZE)
    src.write_bytes(data)
    url = f"s3://{s3env.bucket}/set/"
    publish_set({"a": [src]}, url, endpoint_url=s3env.endpoint.url,
                config=trtet_store.PublishConfig(journal_dir=s3env.journal_dir))
    runs = {}
    for how, kw in (("keywords", dict(concurrency=2, range_size=MiB)),
                    ("config", {"config": FetchConfig(**OPTIONS)})):
        root = tmp_path / how
        root.mkdir()
        client = s3env.endpoint.client()
        log = GetLog(client)
        report = fetch_set(url, root / "out", "a", client=S3(client=client), **kw)
        assert (root / "out" / "model.pte").read_bytes() == data
        runs[how] = (sorted(r for r in log.ranges if r != "whole"), report.bytes_downloaded)
        assert log.most <= 2
    assert runs["keywords"] == runs["config"]
    assert len(runs["config"][0]) == 4  # 1 MiB ranges reached the blob's download


@pytest.mark.parametrize("call", ["fetch", "fetch_set"])
def test_a_keyword_beside_config_with_another_value_is_refused_before_anything(tmp_path, call):
    # "b" is no bucket name: a refusal that came too late would be a RemoteURLError, at once.
    before = listing(tmp_path)
    config = FetchConfig(range_size=2 * MiB)
    with pytest.raises(TypeError, match=rf"{call}\(\): range_size given both as keyword "
                                        rf"\(range_size=1048576\) and in config "
                                        rf"\(range_size=2097152\)"):
        if call == "fetch":
            trtet_store.fetch("s3://b/m.pte", tmp_path / "m.pte", endpoint_url=DEAD,
                              config=config, range_size=MiB)
        else:
            fetch_set("s3://b/set/", tmp_path / "out", "a", endpoint_url=DEAD, config=config,
                      range_size=MiB)
    with pytest.raises(TypeError, match=rf"{call}\(\): config must be a "
                                        r"trtet_store.remote.download.options.FetchConfig"):
        getattr(trtet_store, call)("s3://b/set/", tmp_path / "out", endpoint_url=DEAD,
                                   config={"range_size": MiB})
    assert listing(tmp_path) == before


def test_a_bad_value_is_refused_when_the_config_is_made():
    with pytest.raises(ValueError, match="concurrency must be 1 to 256, not 0"):
        FetchConfig(concurrency=0)
    with pytest.raises(TypeError, match="attempts must be an int"):
        FetchConfig(attempts=1.5)
