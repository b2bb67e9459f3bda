"""The shared tier's entry module at its edges (``trtet_store.cache.tier.entry``:
``parse_files``, ``RemoteEntry.from_json``): each shape of a caller's files list and what is
taken from it, and a pointer's sha256 held to a sha256 hex digest.

Pure functions on files in ``tmp_path`` (no server), well under a second.
"""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

import pytest
import xxhash

from trtet_store.cache.tier.entry import FORMAT, RemoteEntry, parse_files

KEY = "k" * 32


def _file(tmp_path: Path) -> tuple[Path, str, str]:
    p = tmp_path / "record"
    p.write_bytes(b"abc")
    return p, xxhash.xxh3_128_hexdigest(b"abc"), hashlib.sha256(b"abc").hexdigest()


def test_parse_files_keeps_the_xxh3_a_triple_hands_on_and_a_pair_names_none(tmp_path):
    p, xxh, sha = _file(tmp_path)
    assert parse_files([("record", p)]) == [("record", p, None, None)]
    assert parse_files([("record", p, xxh)]) == [("record", p, xxh, None)]
    assert parse_files([["record", p, xxh, sha]]) == [("record", p, xxh, sha)]


def test_parse_files_refuses_an_item_of_the_wrong_length_or_kind(tmp_path, monkeypatch):
    p, xxh, sha = _file(tmp_path)
    monkeypatch.chdir(tmp_path)  # "record" then names a file: a string must still be refused
    (tmp_path / "r").write_bytes(b"x")
    for bad in ([("record",)], [("record", p, xxh, sha, "extra")], ["rr"], [b"rr"],
                [{"record": p}]):
        with pytest.raises(TypeError, match=r"each file is \(name, path\)"):
            parse_files(bad)


def _pointer(**file: object) -> bytes:
    return json.dumps({"format": FORMAT, "key": KEY, "created": 1.0, "origin": "o",
                       "host": "h", "attempt": f"{KEY}/a-0000000000000000/",
                       "files": [{"name": "e0", "size": 3, "digest": "0" * 32, **file}],
                       "metadata": {}}).encode()


def test_a_pointer_s_sha256_is_kept_only_when_it_is_a_sha256(tmp_path):
    sha = hashlib.sha256(b"abc").hexdigest()
    e = RemoteEntry.from_json(_pointer(sha256=sha), "etag", KEY)
    assert e.files == [{"name": "e0", "size": 3, "digest": "0" * 32, "sha256": sha}]
    assert RemoteEntry.from_json(_pointer(), "etag", KEY).files[0].get("sha256") is None
    for bad in (sha.upper(), sha[:-1], 7, None, "../" + sha[3:]):
        with pytest.raises(ValueError, match="not a sha256 hex digest"):
            RemoteEntry.from_json(_pointer(sha256=bad), "etag", KEY)
