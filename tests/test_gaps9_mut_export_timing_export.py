"""export/timing_entries.py export_entry: an existing destination (without ``replace``)
is refused before the entry is even read (gap hunt 3): nothing of the cache is read,
dropped or changed, the destination left byte for byte, and the refusal the one the
caller expects (FileExistsError), not whatever the entry's own state would say (a key
that is no timing cache). Real filesystem, the stub TensorRT seam.
"""

from __future__ import annotations

import pytest
from test_gaps7_gh7_timing_export import _cache, _entry

from trtet_store.export import timing_entries


def test_export_entry_refuses_an_existing_destination_before_reading_the_entry(
        here_fs, monkeypatch):
    key, data = _entry(here_fs, 6, "x")
    (here_fs / "engine").write_bytes(b"\0" * 64)
    build = "trt-" + "1" * 32 + "-sm_89"
    assert _cache(here_fs).blobs.put(build, here_fs / "engine",
                                     {"kind": "trtet_store.tensorrt.build"}).stored
    out = here_fs / "out.timing"
    out.write_bytes(b"the user's own file\n")
    read = []
    real = timing_entries.read_fd_capped
    monkeypatch.setattr(timing_entries, "read_fd_capped",
                        lambda *a: read.append(a) or real(*a))
    for name in (key, build):
        with pytest.raises(FileExistsError, match="exists: left as it was"):
            timing_entries.export_entry(_cache(here_fs), out, name)
    assert read == []  # never read
    assert out.read_bytes() == b"the user's own file\n"
    assert sorted(e.key for e in _cache(here_fs).entries()) == sorted([key, build])
