"""A resume downloads what is missing, counted by the proxy; a range cut mid-way keeps its pieces.

Issue 55, items 13 and 17. Before: a resume kept only whole finished ranges
(32 MiB by default, four in flight), so a 128 MiB file cut at 70-105 MiB was
downloaded again in full; and no test counted a resume's bytes against what
was missing, so an off-by-one downloading each object's last kept range
again passed. Now a range longer than a piece (:data:`PIECE_SIZE`, on the
chunk grid) is written and journaled piece by piece as its bytes arrive and
check, so a cut costs at most the piece in progress per range in flight, and
a retry or a resume asks only for what follows.

The state is set up, not timed: a loopback proxy ends one ranged GET's body
(a FIN) after exactly N bytes, so the client reads every byte up to there.
The proxy counts every response body byte, an independent measure of what
each fetch downloaded.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest
from tcp_proxy import Fault
from test_fetch_support import MiB, engine_bytes, put_program

from trtet_store.io import STAGING_DIR
from trtet_store.remote.download.ranges import PIECE_SIZE
from trtet_store.remote.download.receive import fetch
from trtet_store.remote.download.staging import fetch_id
from trtet_store.remote.errors import FetchInterruptedError
from trtet_store.testing.s3server import S3Endpoint

RANGE = 12 * MiB
CUT = 10 * MiB + 1000  # into the cut range: two whole 4 MiB pieces, and some of a third


def range_from(key: str, offset: int):
    """The response to a ranged GET of ``key`` starting at ``offset``."""
    def match(m) -> bool:
        return (m.request is not None and m.target.split("?")[0].endswith(key)
                and m.request.headers.get("range", "").startswith(f"bytes={offset}-"))
    return match


def spans(dest: Path) -> dict[int, list[tuple[int, int]]]:
    """What the journal says is staged, per object: its ranges and pieces, merged."""
    path = dest.parent / STAGING_DIR / f"fetch-{fetch_id(dest)}.journal"
    lines = [json.loads(x) for x in path.read_bytes().split(b"\n")[1:] if x.strip()]
    out: dict[int, list[tuple[int, int]]] = {}
    for obj, start, end in sorted({(d["obj"], d["offset"], d["offset"] + d["size"])
                                   for d in lines if "crc" in d}):
        merged = out.setdefault(obj, [])
        if merged and start <= merged[-1][1]:
            merged[-1] = (merged[-1][0], max(end, merged[-1][1]))
        else:
            merged.append((start, end))
    return out


def journaled(dest: Path) -> int:
    """Bytes the journal says are staged (each byte once)."""
    return sum(end - start for merged in spans(dest).values() for start, end in merged)


def got(proxy) -> int:
    return proxy.body_bytes[("response", "GET")]


@pytest.fixture
def program(s3):
    """Two objects, each longer than two ranges (1 MiB chunk grid), and the manifest's size."""
    data = engine_bytes(551, 2 * RANGE + 2 * MiB + 17)
    ptd = engine_bytes(552, RANGE + 2 * MiB + 5)
    put_program(s3.client, s3.bucket, "p", {"model.pte": (data, [len(data)]),
                                             "model.ptd": (ptd, [len(ptd)])})
    manifest = s3.client.head_object(Bucket=s3.bucket, Key="p/model.pte.trtet.json")
    return f"s3://{s3.bucket}/p/model.pte", data, ptd, manifest["ContentLength"]


@pytest.mark.parametrize("cut", [CUT, 2 * PIECE_SIZE], ids=["mid-piece", "at-a-piece-end"])
def test_a_cut_range_keeps_its_checked_pieces_and_the_resume_downloads_only_the_rest(
        s3, here_fs, tcp_proxy, program, cut):
    url, data, ptd, manifest = program
    total = len(data) + len(ptd)
    dest = here_fs / "model.pte"
    # The second range of each object is cut ``cut`` bytes in; attempts=1: the fetch fails
    # there. At a piece's end, that piece is whole and kept.
    proxy = tcp_proxy(s3.endpoint.url, [
        Fault("response", "cut", at=cut, match=range_from("p/model.pte", RANGE)),
        Fault("response", "cut", at=cut, match=range_from("p/model.ptd", RANGE))])
    client = S3Endpoint(proxy.url).client(retries={"max_attempts": 1}, read_timeout=5)
    with pytest.raises(FetchInterruptedError):
        fetch(url, dest, client=client, range_size=RANGE, concurrency=1, attempts=1)
    first = got(proxy)
    assert not dest.exists()
    assert len(proxy.fired) == 1  # the fetch stopped at the first cut (model.pte's)
    staged = journaled(dest)
    # The first range whole, and the cut range's whole pieces (8 MiB of 10, or of 8); the
    # object's last range too when the one GET thread had started it before the stop.
    kept = (cut // PIECE_SIZE) * PIECE_SIZE
    assert spans(dest)[0] in ([(0, RANGE + kept)],
                              [(0, RANGE + kept), (2 * RANGE, len(data))]), spans(dest)
    # What the cut cost: less than the one piece in progress (the range was in flight).
    assert first - manifest - staged < PIECE_SIZE, (first, staged)

    # The resume, through a proxy that cuts nothing: exactly what is missing, and the manifest.
    again = tcp_proxy(s3.endpoint.url)
    report = fetch(url, dest, client=S3Endpoint(again.url).client(), range_size=RANGE,
                   concurrency=1)
    assert dest.read_bytes() == data and (here_fs / "model.ptd").read_bytes() == ptd
    # Counted by the proxy first (the client's own report second): what was missing, once.
    assert got(again) == total - staged + manifest, (got(again), total - staged + manifest)
    assert report.bytes_resumed == staged
    # Both together: the program once, plus less than one piece per cut range.
    assert first + got(again) < total + PIECE_SIZE + 2 * manifest
    assert sorted(os.listdir(here_fs)) == ["model.ptd", "model.pte"]


def test_each_objects_kept_ranges_are_not_downloaded_again(s3, here_fs, tcp_proxy, program):
    """Two objects with kept bytes each (an off-by-one per object would show twice)."""
    url, data, ptd, manifest = program
    total = len(data) + len(ptd)
    dest = here_fs / "model.pte"
    # model.pte is fetched to its end; model.ptd's first range is cut: both have kept bytes.
    proxy = tcp_proxy(s3.endpoint.url, [
        Fault("response", "cut", at=CUT, match=range_from("p/model.ptd", 0))])
    client = S3Endpoint(proxy.url).client(retries={"max_attempts": 1}, read_timeout=5)
    with pytest.raises(FetchInterruptedError):
        fetch(url, dest, client=client, range_size=RANGE, concurrency=1, attempts=1)
    staged = journaled(dest)
    kept = (CUT // PIECE_SIZE) * PIECE_SIZE  # and ptd's last range, if it was started
    assert spans(dest) in ({0: [(0, len(data))], 1: [(0, kept)]},
                           {0: [(0, len(data))], 1: [(0, kept), (RANGE, len(ptd))]})
    again = tcp_proxy(s3.endpoint.url)
    report = fetch(url, dest, client=S3Endpoint(again.url).client(), range_size=RANGE,
                   concurrency=2)
    assert dest.read_bytes() == data and (here_fs / "model.ptd").read_bytes() == ptd
    # Counted by the proxy first (the client's own report second): what was missing, once.
    assert got(again) == total - staged + manifest, (got(again), total - staged + manifest)
    assert report.bytes_resumed == staged


def test_a_retried_range_asks_only_for_what_follows_its_checked_pieces(
        s3, here_fs, tcp_proxy, program):
    """The same within one fetch: a range cut once is retried from its first missing piece."""
    url, data, ptd, manifest = program
    total = len(data) + len(ptd)
    dest = here_fs / "model.pte"
    proxy = tcp_proxy(s3.endpoint.url, [
        Fault("response", "cut", at=CUT, match=range_from("p/model.pte", RANGE))])
    client = S3Endpoint(proxy.url).client(retries={"max_attempts": 1}, read_timeout=5)
    report = fetch(url, dest, client=client, range_size=RANGE, concurrency=4)
    assert len(proxy.fired) == 1
    assert dest.read_bytes() == data and (here_fs / "model.ptd").read_bytes() == ptd
    assert got(proxy) < total + PIECE_SIZE + manifest, got(proxy)
    assert report.bytes_downloaded < total + PIECE_SIZE
    assert sorted(os.listdir(here_fs)) == ["model.ptd", "model.pte"]


KILLED_CHILD = r"""
import os, signal, sys
import boto3
from botocore.config import Config
import trtet_store.remote.download.staging as staging
from trtet_store.remote.download.receive import fetch

url, dest, endpoint, key, secret, after, range_size = sys.argv[1:8]
real = staging.Staging.record
lines = [0]


def record(self, rng, crc):
    real(self, rng, crc)  # written, then journaled: then killed, nothing cleaned up
    lines[0] += 1
    if lines[0] == int(after):
        os.kill(os.getpid(), signal.SIGKILL)


staging.Staging.record = record
client = boto3.client("s3", endpoint_url=endpoint, aws_access_key_id=key,
                      aws_secret_access_key=secret, region_name="us-east-1",
                      config=Config(s3={"addressing_style": "path"}))
fetch(url, dest, client=client, concurrency=2, range_size=int(range_size))
print("finished", flush=True)
"""


def test_a_fetch_killed_mid_range_keeps_its_journaled_pieces(s3, here_fs, program):
    """SIGKILL in the writer right after its 3rd journal line: two ranges were in flight."""
    import subprocess
    import sys

    from trtet_store.testing.proxy import CountingProxy

    url, data, ptd, manifest = program
    total = len(data) + len(ptd)
    dest = here_fs / "model.pte"
    ep = s3.endpoint
    env = {**os.environ, "PYTHONPATH": os.fspath(Path(__file__).resolve().parents[1])}
    child = subprocess.run([sys.executable, "-c", KILLED_CHILD, url, os.fspath(dest), ep.url,
                            ep.access_key, ep.secret_key, "3", str(RANGE)],
                           capture_output=True, text=True, timeout=120, env=env)
    assert child.returncode == -9, (child.stdout, child.stderr[-2000:])
    assert not dest.exists()
    staged = journaled(dest)
    # Three lines: whole pieces, none a whole range yet (each range is three pieces).
    assert staged == 3 * PIECE_SIZE, spans(dest)
    with CountingProxy.for_url(ep.url) as proxy:
        report = fetch(url, dest, client=S3Endpoint(proxy.endpoint_url).client(),
                       range_size=RANGE, concurrency=2)
        body = proxy.downstream
    assert dest.read_bytes() == data and (here_fs / "model.ptd").read_bytes() == ptd
    assert report.bytes_resumed == staged
    # What was missing and the manifest (and the response headers the proxy counts too).
    assert total - staged + manifest <= body <= total - staged + manifest + 64 * 1024, body
    assert sorted(os.listdir(here_fs)) == ["model.ptd", "model.pte"]
