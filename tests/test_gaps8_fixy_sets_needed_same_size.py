"""fetch-set and a same-size ``.ptd`` another program needs (sets/fetch.py ``_ptds_replaced``).

``dest`` holds another program (``other.pte``: unreadable here, so taken to need
every ``.ptd``, fetch's rule) and a ``foundation.ptd`` of exactly the size of
the member's, with other bytes. Sizes equal is not "already the member's
bytes": the file is read, found other, and the fetch is refused with
NeededByAnotherError (names "another program"'s file, other.pte) before
anything is downloaded or written (no ``replace_needed``). ``dest`` is
byte-identical after, no store made; with the same bytes there it is not
refused.
"""

from __future__ import annotations

import hashlib
import os
from pathlib import Path
from typing import Any

import pytest
from sets_helpers import write

from trtet_store import NeededByAnotherError
from trtet_store.remote.upload.config import PublishConfig
from trtet_store.sets import fetch_set, publish_set

SIZE = 50_000


def snapshot(directory: Path) -> dict[str, tuple[str, int]]:
    return {p.name: (hashlib.sha256(p.read_bytes()).hexdigest(), os.lstat(p).st_mode)
            for p in directory.iterdir()}


def test_a_same_size_ptd_another_program_needs_is_not_taken_for_the_member_s(
        s3env: Any, tmp_path: Path) -> None:
    url = f"s3://{s3env.bucket}/rel/"
    src = tmp_path / "src"
    ptd = write(src / "foundation.ptd", SIZE, 2)
    publish_set({"m": [write(src / "model.pte", 9000, 1), ptd]}, url,
                endpoint_url=s3env.endpoint.url,
                config=PublishConfig(journal_dir=s3env.journal_dir))
    out = tmp_path / "out"
    out.mkdir()
    (out / "other.pte").write_bytes(b"\0" * 100)  # another program: taken to need every .ptd
    theirs = write(out / "foundation.ptd", SIZE, 77)  # the same size, other bytes
    assert theirs.read_bytes() != ptd.read_bytes()
    before = snapshot(out)

    with pytest.raises(NeededByAnotherError, match="other.pte"):
        fetch_set(url, out, "m", endpoint_url=s3env.endpoint.url)
    assert snapshot(out) == before, "a .ptd another program needs was replaced"
    assert not (tmp_path / ".trtet-blobs").exists(), "downloaded before refusing"

    # The member's own bytes there already: nothing replaced, not refused.
    (out / "foundation.ptd").write_bytes(ptd.read_bytes())
    fetch_set(url, out, "m", endpoint_url=s3env.endpoint.url)
    assert (out / "foundation.ptd").read_bytes() == ptd.read_bytes()
    assert (out / "other.pte").read_bytes() == b"\0" * 100
