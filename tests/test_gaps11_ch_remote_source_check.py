"""remote/upload/source.py: ObjectSource.check and Reader refuse a file that is not as planned.

``ObjectSource.check`` ("refuse before anything is sent: ... a file not as planned")
holds each file piece to the size it had when the object was planned
(``_check_piece``): a file grown, cut or gone since is SourceChangedError naming it.
``Reader`` reading a file that ends early (cut after the check) says where it ended,
never loops or pads. Real files; nothing is sent (no S3 here).
"""

from __future__ import annotations

import os
import threading

import pytest

from trtet_store.io import SourceChangedError
from trtet_store.io.units import MiB
from trtet_store.remote.upload.source import ObjectSource, Reader


def _file(tmp_path, n=3 * MiB + 11):
    p = tmp_path / "model.pte"
    p.write_bytes(os.urandom(n))
    return p


@pytest.mark.parametrize("change,why", [("grow", r"size 3145739 -> 3145740"),
                                        ("cut", r"size 3145739 -> 3145738"),
                                        ("gone", r"the file is gone")])
def test_object_source_check_refuses_a_file_not_as_planned(tmp_path, change, why) -> None:
    p = _file(tmp_path)
    src = ObjectSource.of_file(p)
    if change == "grow":
        with open(p, "ab") as f:
            f.write(b"x")
    elif change == "cut":
        os.truncate(p, 3 * MiB + 10)
    else:
        os.unlink(p)
    with pytest.raises(SourceChangedError, match=why):
        src.check()


def test_object_source_check_takes_a_file_as_planned(tmp_path) -> None:
    src = ObjectSource.of_file(_file(tmp_path))
    src.check()
    assert src.size == 3 * MiB + 11


def test_reader_refuses_a_file_cut_after_the_check_saying_where_it_ended(tmp_path) -> None:
    p = _file(tmp_path)
    src = ObjectSource.of_file(p)
    src.check()
    os.truncate(p, 2 * MiB)
    reader = Reader(src)
    errors: list[BaseException] = []

    def read() -> None:
        try:
            reader.skip_to(memoryview(bytearray(MiB)), src.size)
        except BaseException as exc:  # noqa: BLE001 - handed to the test's thread
            errors.append(exc)

    t = threading.Thread(target=read, daemon=True)
    t.start()
    t.join(10)
    reader.close()
    assert not t.is_alive(), "the reader never stopped at the file's end"
    assert errors and isinstance(errors[0], SourceChangedError), errors
    assert "ended at 2097152 bytes" in str(errors[0]) or "size" in str(errors[0]), errors[0]
