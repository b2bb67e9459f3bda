"""A publish resumed without its ``--part-size`` takes the journal's (issue 45 item 24).

The first publish (``part_size`` 5 MiB, one part in flight) is stopped
deterministically at part 6: the loopback proxy flips a byte of every
attempt at it, so parts 1-5 are on the server and journaled. The same
command without ``--part-size`` (the default is 8 MiB) must resume those
parts, not abort the upload and send all 11 again. With a part size given
that really differs, the upload starts over and the log line says what
differs. Run through the CLI, stderr as a user reads it.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import xxhash
from tcp_proxy import Fault

import trtet_store
from trtet_store.io.units import MiB
from trtet_store.remote import ChecksumMismatchError
from trtet_store.remote.upload.journal import Journal

ROOT = Path(__file__).resolve().parent.parent
PART = 5 * MiB
SIZE = 10 * PART + 1234  # 11 parts of 5 MiB


def _part_number(number: int):
    def match(m) -> bool:
        return (f"partNumber={number}&" in m.target or m.target.endswith(f"partNumber={number}")
                ) and "x-amz-copy-source" not in m.headers
    return match


def _interrupted(s3env, tmp_path, tcp_proxy, name: str):
    """A publish of 11 parts of 5 MiB stopped at part 6; the pte, url, proxy and parts kept."""
    pte = tmp_path / "model.pte"
    pte.write_bytes(os.urandom(SIZE))
    proxy = tcp_proxy(s3env.endpoint.url)
    proxy.add(Fault("request", "flip", at=7, match=_part_number(6), times=1000))
    url = f"s3://{s3env.bucket}/{name}/model.pte"
    with pytest.raises(ChecksumMismatchError) as info:
        trtet_store.publish(pte, url, endpoint_url=proxy.url, part_size=PART, concurrency=1,
                            journal_dir=s3env.journal_dir)
    journaled = {r["number"] for r in Journal.read(Path(info.value.journal))
                 if r.get("t") == "sent"}
    assert {1, 2, 3, 4, 5} <= journaled and 6 not in journaled, journaled
    proxy.clear()
    return pte, url, proxy, journaled


def _cli(s3env, *argv: object) -> subprocess.CompletedProcess:
    env = {**os.environ, **s3env.endpoint.environ(), "PYTHONPATH": os.fspath(ROOT)}
    return subprocess.run([sys.executable, "-m", "trtet_store", *map(os.fspath, argv)],
                          capture_output=True, text=True, timeout=300, cwd=ROOT, env=env)


def _published(s3env, url: str) -> str:
    key = url.split("/", 3)[3]
    got = s3env.client.get_object(Bucket=s3env.bucket, Key=key)["Body"].read()
    return xxhash.xxh3_128_hexdigest(got)


def test_a_resume_without_part_size_takes_the_journals(s3env, tmp_path, tcp_proxy):
    pte, url, proxy, journaled = _interrupted(s3env, tmp_path, tcp_proxy, "same")
    before = proxy.body_bytes[("request", "PUT")]
    done = _cli(s3env, "-v", "publish", pte, url, "--endpoint-url", proxy.url,
                "--journal-dir", s3env.journal_dir, "--json", "--no-progress")
    assert done.returncode == 0, done.stderr
    assert "aborted" not in done.stderr, done.stderr
    (obj,) = json.loads(done.stdout)["objects"]
    kept = len(journaled)
    assert (obj["parts"], obj["parts_resumed"], obj["parts_sent"]) == (11, kept, 11 - kept), obj
    sent = proxy.body_bytes[("request", "PUT")] - before
    assert sent <= SIZE - kept * PART + 64 * 1024, sent  # the rest only, not all 11 parts
    assert _published(s3env, url) == xxhash.xxh3_128_hexdigest(pte.read_bytes())
    assert s3env.client.list_multipart_uploads(Bucket=s3env.bucket).get("Uploads", []) == []


def test_a_resume_with_another_part_size_says_what_differs(s3env, tmp_path, tcp_proxy):
    pte, url, proxy, _ = _interrupted(s3env, tmp_path, tcp_proxy, "other")
    done = _cli(s3env, "-v", "publish", pte, url, "--endpoint-url", proxy.url,
                "--journal-dir", s3env.journal_dir, "--part-size", "6M", "--json",
                "--no-progress")
    assert done.returncode == 0, done.stderr
    [line] = [x for x in done.stderr.splitlines() if "aborted" in x]
    assert line.endswith("an earlier journal's uploads are aborted (model.pte: part size "
                         "6.0 MiB, the journal's 5.0 MiB (give the journal's --part-size to "
                         "resume))"), line
    (obj,) = json.loads(done.stdout)["objects"]
    assert (obj["parts"], obj["parts_resumed"], obj["parts_sent"]) == (9, 0, 9), obj
    assert _published(s3env, url) == xxhash.xxh3_128_hexdigest(pte.read_bytes())
    assert s3env.client.list_multipart_uploads(Bucket=s3env.bucket).get("Uploads", []) == []
