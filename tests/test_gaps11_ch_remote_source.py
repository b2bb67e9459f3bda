"""remote/upload/source.py: a file written to while it is published is refused.

``ObjectSource.check`` records each file piece's identity (device, inode, size,
mtime, ctime) before anything is sent, and ``Reader._finish_piece`` compares it
again when the piece's last byte has been read: "a file written to meanwhile is
refused" (SourceChangedError "it was modified while it was published"). Here the
file is rewritten in place mid-publish (after its first part was sent, at the
publish's own progress callback), same size, with its mtime put back (os.utime):
only the ctime tells. The publish is refused, and no manifest names the half-old
bytes: the program is not published.
"""

from __future__ import annotations

import os

import pytest

import trtet_store
from trtet_store.io import SourceChangedError
from trtet_store.remote.manifest import manifest_key

MiB = 1 << 20


def test_reader_finish_piece_refuses_a_file_rewritten_with_its_mtime_put_back(
        s3env, tmp_path):
    src = tmp_path / "src"
    src.mkdir()
    pte = src / "model.pte"
    pte.write_bytes(os.urandom(16 * MiB + 123))
    st = os.stat(pte)
    done: list[int] = []

    def progress(p) -> None:
        if p.sent >= 5 * MiB and not done:
            done.append(p.sent)
            with open(pte, "r+b") as f:  # in place: same inode, same size
                f.write(os.urandom(4096))
            os.utime(pte, ns=(st.st_atime_ns, st.st_mtime_ns))  # mtime put back

    url = f"s3://{s3env.bucket}/src/model.pte"
    with pytest.raises(SourceChangedError, match="modified while it was published"):
        trtet_store.publish([os.fspath(pte)], url, endpoint_url=s3env.endpoint.url,
                            progress=progress,
                            config=trtet_store.PublishConfig(part_size=5 * MiB, concurrency=1,
                                                             journal_dir=s3env.journal_dir))
    assert done, "the file was never rewritten mid-publish"
    after = os.stat(pte)
    assert (after.st_size, after.st_mtime_ns) == (st.st_size, st.st_mtime_ns)
    # No manifest: nothing names the bytes read before and after the rewrite.
    listed = s3env.client.list_objects_v2(Bucket=s3env.bucket).get("Contents", [])
    assert manifest_key("src/model.pte") not in [o["Key"] for o in listed]
