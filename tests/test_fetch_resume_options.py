"""A fetch resumed with other options keeps what was staged (issue 34, items 13 and 6).

Item 13: staged bytes are matched by what they cover, not by the exact
``(object, offset, size)`` of the ranges this fetch would cut, so a resume
with another ``--range-size`` downloads only what is missing; the resume
command printed repeats every option given. Item 6 (mutant 07): a resume
re-reads and re-checks every journaled range against the bytes actually
staged, so journal lines that outlived their bytes (a power cut: the run file
is fallocated, ranges are not fsynced) are fetched again, never written out
as zeros.

Interruptions are forced: a loopback proxy resets every ranged GET after the
first few, whatever the retries. The proxy also counts every response body
byte, an independent measure of what the resume downloaded.
"""

from __future__ import annotations

import json
import os
import shlex
from pathlib import Path

import pytest
from tcp_proxy import Fault
from test_fetch_support import MiB, engine_bytes, engine_program, put_program

from trtet_store.cli import main
from trtet_store.io import STAGING_DIR
from trtet_store.remote.download.receive import fetch
from trtet_store.remote.download.staging import fetch_id
from trtet_store.remote.errors import FetchInterruptedError
from trtet_store.testing.s3server import S3Endpoint


def ranged(m) -> bool:
    return "range" in (m.request.headers if m.request else {})


def interrupted_fetch(s3, tcp_proxy, dest: Path, url: str, *, range_size: int, through: int,
                      concurrency: int = 1) -> FetchInterruptedError:
    """A fetch of ``url`` whose ranged GETs after the first ``through`` are all reset."""
    proxy = tcp_proxy(s3.endpoint.url, [Fault("response", "reset", at=1000, match=ranged,
                                              skip=through, times=10_000)])
    client = S3Endpoint(proxy.url).client(retries={"max_attempts": 1}, read_timeout=5)
    with pytest.raises(FetchInterruptedError) as info:
        fetch(url, dest, client=client, range_size=range_size, concurrency=concurrency,
              attempts=2)
    assert not dest.exists()
    return info.value


def journal_ranges(dest: Path) -> list[dict]:
    path = dest.parent / STAGING_DIR / f"fetch-{fetch_id(dest)}.journal"
    lines = [json.loads(x) for x in path.read_bytes().split(b"\n")[1:] if x.strip()]
    return [d for d in lines if "crc" in d]


@pytest.mark.parametrize(("first", "second"), [(MiB, 3 * MiB), (3 * MiB, MiB),
                                               (2 * MiB, 3 * MiB)],
                         ids=["1M-then-3M", "3M-then-1M", "2M-then-3M"])
def test_a_resume_with_another_range_size_downloads_only_what_is_missing(
        s3, here_fs, tcp_proxy, first, second):
    data, sizes = engine_program(81, (12 * MiB,))
    ptd = engine_bytes(82, 5 * MiB + 17)
    url = f"s3://{s3.bucket}/r/model.pte"
    put_program(s3.client, s3.bucket, "r", {"model.pte": (data, sizes),
                                             "model.ptd": (ptd, [len(ptd)])})
    dest = here_fs / "model.pte"
    exc = interrupted_fetch(s3, tcp_proxy, dest, url, range_size=first, through=4)
    staged = sum(d["size"] for d in journal_ranges(dest))
    assert staged > 2 * MiB  # the set-up really left bytes staged
    assert f"--range-size {first}" in exc.resume and "--concurrency 1" in exc.resume
    proxy = tcp_proxy(s3.endpoint.url)
    client = S3Endpoint(proxy.url).client()
    report = fetch(url, dest, client=client, range_size=second, concurrency=2)
    assert dest.read_bytes() == data
    assert (here_fs / "model.ptd").read_bytes() == ptd
    total = len(data) + len(ptd)
    assert report.bytes_resumed == staged
    assert report.bytes_downloaded == total - staged
    manifest = s3.client.head_object(Bucket=s3.bucket, Key="r/model.pte.trtet.json")
    got = proxy.body_bytes[("response", "GET")]
    assert got == total - staged + manifest["ContentLength"], (got, total, staged)
    assert sorted(os.listdir(here_fs)) == ["model.ptd", "model.pte"]


def test_the_printed_resume_command_repeats_every_option_and_resumes(
        s3env, here_fs, tcp_proxy, capsys):
    data, sizes = engine_program(83, (9 * MiB,))
    url = f"s3://{s3env.bucket}/c/model.pte"
    put_program(s3env.client, s3env.bucket, "c", {"model.pte": (data, sizes)})
    old = here_fs / "old.pte"
    old.write_bytes(b"not this program")
    dest = here_fs / "model.pte"
    proxy = tcp_proxy(s3env.endpoint.url, [Fault("response", "reset", at=1000, match=ranged,
                                                 skip=3, times=10_000)])
    rc = main(["fetch", url, os.fspath(dest), "--endpoint-url", proxy.url, "--range-size", "2M",
               "--concurrency", "1", "--reuse", os.fspath(old), "--if-replaced", "error",
               "--no-progress"])
    err = capsys.readouterr().err
    assert rc == 1, err
    assert err.count("\n") == 1, err
    command = err.split("run `", 1)[1].split("`", 1)[0]
    words = shlex.split(command)
    assert words[:4] == ["trtet-store", "fetch", url, os.fspath(dest)]
    for flag, value in [("--endpoint-url", proxy.url), ("--range-size", str(2 * MiB)),
                        ("--concurrency", "1"), ("--reuse", os.fspath(old)),
                        ("--if-replaced", "error")]:
        assert words[words.index(flag) + 1] == value, (flag, command)
    staged = sum(d["size"] for d in journal_ranges(dest))
    proxy.clear()
    before = proxy.body_bytes[("response", "GET")]
    assert main([*words[1:], "--no-progress", "--json"]) == 0
    report = json.loads(capsys.readouterr().out)
    assert dest.read_bytes() == data
    assert report["bytes_resumed"] == staged
    assert report["bytes_downloaded"] == len(data) - staged
    assert proxy.body_bytes[("response", "GET")] - before <= len(data) - staged + 64 * 1024
    assert sorted(os.listdir(here_fs)) == ["model.pte", "old.pte"]


def test_journaled_ranges_whose_staged_bytes_were_lost_are_fetched_again(
        s3, here_fs, tcp_proxy):
    """Mutant 07: the journal survived, the bytes did not (zeros where ranges were)."""
    data, sizes = engine_program(84, (8 * MiB,))
    ptd = engine_bytes(85, 3 * MiB)
    url = f"s3://{s3.bucket}/z/model.pte"
    put_program(s3.client, s3.bucket, "z", {"model.pte": (data, sizes),
                                             "model.ptd": (ptd, [len(ptd)])})
    dest = here_fs / "model.pte"
    interrupted_fetch(s3, tcp_proxy, dest, url, range_size=MiB, through=5)
    ranges = journal_ranges(dest)
    assert len(ranges) >= 4
    staging = here_fs / STAGING_DIR
    runs = sorted(staging.glob(f"fetch-{fetch_id(dest)}-*.run"))
    assert runs, sorted(os.listdir(staging))
    # Zero the staged bytes of every journaled range, in place (the run file keeps
    # its size and its inode, as a power cut leaves a fallocated file): the journal
    # still lists every range with its CRC.
    zeroed = 0
    for run in runs:
        obj, offset, _ = (int(x) for x in run.name[:-len(".run")].split("-")[2:])
        with open(run, "r+b") as f:
            for d in ranges:
                if d["obj"] == obj:
                    f.seek(d["offset"] - offset)
                    f.write(b"\0" * d["size"])
                    zeroed += d["size"]
            f.flush()
            os.fsync(f.fileno())
    assert zeroed == sum(d["size"] for d in ranges)
    before = journal_ranges(dest)
    assert before == ranges  # the journal is kept as it was
    report = fetch(url, dest, client=s3.client, range_size=MiB, concurrency=1)
    assert dest.read_bytes() == data
    assert (here_fs / "model.ptd").read_bytes() == ptd
    assert report.bytes_resumed == 0
    assert report.bytes_downloaded == len(data) + len(ptd)
    assert sorted(os.listdir(here_fs)) == ["model.ptd", "model.pte"]
