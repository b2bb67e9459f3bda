"""The CLI's one error table (``cli._common.ERROR_TABLE``) serves each command's failures.

A command's except chain that only translated is a call of ``report_error``:
publish's kept upload (the resume and give-up lines) is a row of the table,
publish's and recover's lines keep naming the type (``plain``), fetch's bad key
file goes through the same call as its other failures.
"""

from __future__ import annotations

import os

from trtet_store.cli import main
from trtet_store.cli._common import explain
from trtet_store.io.units import MiB
from trtet_store.remote.errors import AccessDeniedError, BucketNotFoundError


def test_plain_names_the_type_where_the_table_would_explain() -> None:
    exc = BucketNotFoundError("s3://nope: no such bucket")
    assert explain(exc, "fetch") == ["not found: s3://nope: no such bucket"]
    assert explain(exc, "publish", plain=True) == [
        "BucketNotFoundError: s3://nope: no such bucket"]
    assert explain(AccessDeniedError("denied"), "recover", plain=True) == [
        "AccessDeniedError: denied"]
    assert explain(KeyboardInterrupt(), "publish", plain=True, resume="again") == [
        "interrupted; what was downloaded is kept: run `again` to continue"]


def test_a_kept_upload_says_how_to_resume_and_give_up(s3env, tmp_path, capsys, monkeypatch,
                                                       tcp_proxy) -> None:
    from tcp_proxy import Fault

    monkeypatch.setenv("XDG_STATE_HOME", os.fspath(tmp_path / "state"))
    pte = tmp_path / "model.pte"
    pte.write_bytes(os.urandom(6 * MiB))
    proxy = tcp_proxy(s3env.endpoint.url)
    proxy.add(Fault("request", "flip", at=1, times=100,
                    match=lambda m: m.method == "PUT" and "partNumber=" in m.target))
    url = f"s3://{s3env.bucket}/kept/model.pte"
    assert main(["publish", os.fspath(pte), url, "--endpoint-url", proxy.url, "--part-size",
                 "5M", "--no-progress"]) == 1
    first, *rest = [line for line in capsys.readouterr().err.splitlines()
                    if ": warning: " not in line]  # the part retries, logged above the bar
    assert first.startswith("trtet-store publish: ChecksumMismatchError: "), first
    assert rest == [f"  resume: trtet-store publish --resume {pte} {url}",
                    f"  give up: trtet-store publish --abort {url}"]
    assert main(["publish", "--abort", url, "--endpoint-url", proxy.url]) == 0
    assert s3env.client.list_multipart_uploads(Bucket=s3env.bucket).get("Uploads", []) == []


def test_a_bad_key_file_is_one_line_through_the_table(tmp_path, capsys) -> None:
    key = tmp_path / "team.pub"
    key.write_text("not a key\n")
    out = tmp_path / "out" / "m.pte"
    out.parent.mkdir()
    assert main(["fetch", "s3://bucket/m.pte", os.fspath(out), "--trusted-key", os.fspath(key),
                 "--endpoint-url", "http://127.0.0.1:9", "--no-progress"]) == 1
    (line,) = capsys.readouterr().err.splitlines()
    assert line.startswith("trtet-store fetch: KeyFileError: ") and os.fspath(key) in line, line
    assert list(out.parent.iterdir()) == []


def test_each_shared_option_is_declared_once() -> None:
    """A flag of ``OPTIONS`` is added only through ``add_option``: on every command that has
    it, the same type, action, default and metavar; no command module declares it again."""
    import argparse
    import re
    from pathlib import Path

    import trtet_store.cli as cli
    from trtet_store.cli import build_parser
    from trtet_store.cli._common import OPTIONS

    pattern = re.compile(r"add_argument\(\s*\"(--[a-z-]+)\"")
    for source in Path(cli.__file__).parent.glob("*.py"):
        declared = set(pattern.findall(source.read_text())) & set(OPTIONS)
        assert not declared, f"{source.name} declares {sorted(declared)} itself"

    def parsers(p: argparse.ArgumentParser):
        yield p
        for a in p._actions:
            if isinstance(a, argparse._SubParsersAction):
                for sub in a.choices.values():
                    yield from parsers(sub)

    seen: dict[str, int] = {}
    for p in parsers(build_parser()):
        for a in p._actions:
            flag = next((s for s in a.option_strings if s in OPTIONS), None)
            if flag is None:
                continue
            seen[flag] = seen.get(flag, 0) + 1
            want = OPTIONS[flag]
            assert (a.type, a.metavar) == (want.get("type"), want.get("metavar")), (p.prog, flag)
            kind = {"store_true": argparse._StoreTrueAction,
                    "append": argparse._AppendAction}.get(want.get("action"),
                                                           argparse._StoreAction)
            assert type(a) is kind, (p.prog, flag)
    assert all(n >= 2 for n in seen.values()) and set(seen) == set(OPTIONS), seen
