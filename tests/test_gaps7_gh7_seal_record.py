"""sets.record's size cap: a member record (``.trtet-set.json``) over 16 MiB is not ours to
read (RECORD_MAX_BYTES): read_record ignores it and says so in ``left_alone``, verify_member
refuses it, both on its ``fstat`` size before a byte is read (a sparse file here)."""

from __future__ import annotations

from pathlib import Path

import pytest

from trtet_store.io import NotOursError
from trtet_store.sets.record import RECORD, read_record, verify_member

CAP = 16 * 1024 * 1024


def test_a_record_over_16_mib_is_left_alone_unread(tmp_path: Path) -> None:
    d = tmp_path / "m"
    d.mkdir()
    with open(d / RECORD, "wb") as f:
        f.truncate(CAP + 1)  # sparse: refused on its size, nothing read
    said: list[str] = []
    assert read_record(d, said) is None
    assert said == [f"set record {d / RECORD} is not ours: {CAP + 1} bytes, over the {CAP} "
                    "such a file may hold; left alone"]
    with pytest.raises(NotOursError, match=f"{CAP + 1} bytes, over the {CAP}"):
        verify_member(d)
    assert (d / RECORD).stat().st_size == CAP + 1  # left as it is
