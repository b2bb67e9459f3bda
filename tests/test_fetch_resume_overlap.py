"""A fetch resumed twice with other range sizes, over overlapping journaled ranges (issue 45
item 6).

Overlap in the journal is set up deterministically: a first attempt (2 MiB
ranges) is cut after three ranges and the staged bytes of its last one are
zeroed (as a power cut leaves a fallocated run file); the second attempt
(3 MiB ranges) finds them wrong, fetches from that offset again in 3 MiB
ranges and is cut in turn. Its journal then lists both the old 2 MiB range
(its line is kept: the journal is rewritten only when a fetch opens) and the
new 3 MiB one over the same bytes. The third run (1 MiB ranges) must write
the published bytes and count each byte once: resumed + downloaded is the
total, and what the proxy carried is what it says it downloaded.
"""

from __future__ import annotations

import os

from test_fetch_resume_options import interrupted_fetch, journal_ranges
from test_fetch_support import MiB, engine_bytes, engine_program, put_program

from trtet_store.io import STAGING_DIR
from trtet_store.remote.download.receive import fetch
from trtet_store.remote.download.staging import fetch_id
from trtet_store.testing.s3server import S3Endpoint


def _zero(staging, dest, rng: dict) -> None:
    """Zero one journaled range's bytes in its run file, in place (size and inode kept)."""
    for run in staging.glob(f"fetch-{fetch_id(dest)}-*.run"):
        obj, offset, size = (int(x) for x in run.name[:-len(".run")].split("-")[2:])
        if obj == rng["obj"] and offset <= rng["offset"] < offset + size:
            with open(run, "r+b") as f:
                f.seek(rng["offset"] - offset)
                f.write(b"\0" * rng["size"])
                f.flush()
                os.fsync(f.fileno())
            return
    raise AssertionError(f"no run file holds {rng}: {sorted(os.listdir(staging))}")


def _overlaps(ranges: list[dict]) -> list[tuple[tuple, tuple]]:
    spans = sorted((d["obj"], d["offset"], d["offset"] + d["size"]) for d in ranges)
    return [(a, b) for a, b in zip(spans, spans[1:], strict=False) if a[0] == b[0] and b[1] < a[2]]


def test_a_third_run_over_overlapping_ranges_of_two_range_sizes_counts_each_byte_once(
        s3, here_fs, tcp_proxy):
    data, sizes = engine_program(91, (12 * MiB,))
    ptd = engine_bytes(92, 5 * MiB + 17)
    url = f"s3://{s3.bucket}/o/model.pte"
    put_program(s3.client, s3.bucket, "o", {"model.pte": (data, sizes),
                                             "model.ptd": (ptd, [len(ptd)])})
    dest = here_fs / "model.pte"
    staging = here_fs / STAGING_DIR
    interrupted_fetch(s3, tcp_proxy, dest, url, range_size=2 * MiB, through=3)
    first = journal_ranges(dest)
    assert len(first) == 3 and first[-1]["size"] == 2 * MiB, first
    _zero(staging, dest, first[-1])
    interrupted_fetch(s3, tcp_proxy, dest, url, range_size=3 * MiB, through=2)
    second = journal_ranges(dest)
    overlaps = _overlaps(second)
    assert overlaps, second  # the set-up: two journaled ranges over the same bytes
    assert any(d["size"] == 3 * MiB and d["offset"] == first[-1]["offset"]
               and d["obj"] == first[-1]["obj"] for d in second), second

    proxy = tcp_proxy(s3.endpoint.url)
    report = fetch(url, dest, client=S3Endpoint(proxy.url).client(), range_size=MiB,
                   concurrency=2)
    assert dest.read_bytes() == data
    assert (here_fs / "model.ptd").read_bytes() == ptd
    total = len(data) + len(ptd)
    assert report.bytes_resumed > 0, report
    assert report.bytes_resumed + report.bytes_downloaded == total, (
        f"resumed {report.bytes_resumed} + downloaded {report.bytes_downloaded} != {total}: "
        f"a byte counted twice or never, over the overlaps {overlaps}")
    manifest = s3.client.head_object(Bucket=s3.bucket, Key="o/model.pte.trtet.json")
    got = proxy.body_bytes[("response", "GET")]
    assert got == report.bytes_downloaded + manifest["ContentLength"], (got, report)
    assert sorted(os.listdir(here_fs)) == ["model.ptd", "model.pte"]
    assert not staging.exists() or not any(staging.iterdir()), sorted(os.listdir(staging))
