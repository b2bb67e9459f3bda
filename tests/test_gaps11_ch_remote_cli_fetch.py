"""cli/fetch.py ``cmd_fetch``: each flag reaches ``fetch`` itself, not only the resume line.

``cmd_fetch`` builds two things from the flags: the command that resumes (tested
elsewhere) and the keywords of the fetch it runs. Here each flag's effect on the real
fetch is observed, through a proxy in front of SeaweedFS that records every request's
Range header (a Fault that never fires):

- ``--range-size 2M`` (not the 32 MiB default): the 6 MiB object comes in GETs of
  about 2 MiB each, not one;
- ``--reuse OLD`` (a local copy of the same bytes): every byte is reused, no ranged
  GET at all, ``bytes_reused`` the whole object.
"""

from __future__ import annotations

import json
import os
import re

from tcp_proxy import Fault
from test_fetch_support import MiB, engine_program, put_program

from trtet_store.cli import main


def _ranges(tcp_proxy, s3env) -> tuple[object, list[str]]:
    seen: list[str] = []

    def record(m) -> bool:
        head = m.request.headers if m.request else {}
        if "range" in head:
            seen.append(head["range"])
        return False

    return tcp_proxy(s3env.endpoint.url, [Fault("response", "reset", match=record,
                                                times=10**9)]), seen


def test_cmd_fetch_range_size_flag_reaches_the_fetch(s3env, here_fs, tcp_proxy, capsys):
    data, sizes = engine_program(91, (6 * MiB,))
    url = f"s3://{s3env.bucket}/cf/model.pte"
    put_program(s3env.client, s3env.bucket, "cf", {"model.pte": (data, sizes)})
    proxy, seen = _ranges(tcp_proxy, s3env)
    dest = here_fs / "model.pte"
    assert main(["fetch", url, os.fspath(dest), "--endpoint-url", proxy.url,
                 "--range-size", "2M", "--no-progress", "--json"]) == 0
    report = json.loads(capsys.readouterr().out)
    assert dest.read_bytes() == data and report["bytes_downloaded"] == len(data)
    sizes_got = [int(b) - int(a) + 1 for a, b in
                 (re.fullmatch(r"bytes=(\d+)-(\d+)", r).groups() for r in seen)]
    assert len(sizes_got) >= 3, seen  # not one 32 MiB GET
    assert max(sizes_got) <= 2 * MiB + 64 * 1024, seen


def test_cmd_fetch_reuse_flag_reaches_the_fetch(s3env, here_fs, tcp_proxy, capsys):
    data, sizes = engine_program(92, (3 * MiB,))
    url = f"s3://{s3env.bucket}/cr/model.pte"
    put_program(s3env.client, s3env.bucket, "cr", {"model.pte": (data, sizes)})
    old = here_fs / "old.pte"
    old.write_bytes(data)
    proxy, seen = _ranges(tcp_proxy, s3env)
    dest = here_fs / "model.pte"
    assert main(["fetch", url, os.fspath(dest), "--endpoint-url", proxy.url,
                 "--reuse", os.fspath(old), "--no-progress", "--json"]) == 0
    report = json.loads(capsys.readouterr().out)
    assert dest.read_bytes() == data
    assert report["bytes_reused"] == len(data) and report["bytes_downloaded"] == 0, report
    assert seen == []  # not one byte of it downloaded
    assert old.read_bytes() == data
