"""``fetch-set`` through a server that stops and one that keeps failing (issue 55, 15 and 16).

15: fetch-set spent botocore's 5 tries in about a second, so a server back
after 2 s failed it, where plain ``fetch`` waited about 20 s. Both now keep
one retry policy (:func:`trtet_store.remote.s3.wait_out`, over
:data:`~trtet_store.remote.s3.RETRY_WINDOW` seconds): a server stopped for
3 s mid-download (the endpoint, a proxy in front of SeaweedFS, closed then
opened again on the same port) is waited out and the member placed whole.

16: a network failure said to run the blob's own fetch (``trtet-store fetch
s3://.../blobs/<hex> <store>/<hex>``), an internal step; it says to run the
same ``fetch-set`` again, which resumes: tested on the CLI's one line, and by
running the command it printed.
"""

from __future__ import annotations

import os
import shlex
import threading
import time
from pathlib import Path

import pytest
from sets_helpers import write, xxh
from tcp_proxy import Fault, TcpProxy

import trtet_store.sets.fetch as set_fetch
from trtet_store.cli import main
from trtet_store.io.units import MiB
from trtet_store.remote.errors import FetchInterruptedError
from trtet_store.remote.upload.config import PublishConfig
from trtet_store.sets import fetch_set, publish_set

OWN, SHARED = MiB + 17, 8 * MiB + 5


def publish(s3env, here_fs: Path) -> tuple[str, Path, Path]:
    url = f"s3://{s3env.bucket}/rel/"
    pte = write(here_fs / "src" / "a" / "model.pte", OWN, 11)
    ptd = write(here_fs / "src" / "foundation.ptd", SHARED, 12)
    publish_set({"a": [pte, ptd]}, url, endpoint_url=s3env.endpoint.url,
                config=PublishConfig(journal_dir=s3env.journal_dir))
    return url, pte, ptd


def target_of(s3env) -> tuple[str, int]:
    rest = s3env.endpoint.url.split("//", 1)[1]
    return rest.rsplit(":", 1)[0], int(rest.rsplit(":", 1)[1])


def ranged_get_of(digest: str):
    def match(m) -> bool:
        return (m.request is not None and "range" in m.request.headers
                and f"/blobs/{digest}" in m.target)
    return match


def assert_placed(dest: Path, pte: Path, ptd: Path) -> None:
    assert (dest / "model.pte").read_bytes() == pte.read_bytes()
    assert (dest / "foundation.ptd").read_bytes() == ptd.read_bytes()
    assert sorted(os.listdir(dest)) == [".trtet-set.json", "foundation.ptd", "model.pte"]
    assert not list(dest.parent.rglob(".trtet-staging")), "a staging directory was left"


def test_a_server_stopped_for_3_s_mid_fetch_set_is_waited_out(s3env, here_fs):
    url, pte, ptd = publish(s3env, here_fs)
    target = target_of(s3env)
    proxies: list[TcpProxy] = []
    down: dict[str, float] = {}

    def stop_for_3_s() -> None:
        proxies[0].close()  # refused (and the open connections cut) from now on
        down["at"] = time.monotonic()
        time.sleep(3.0)
        proxies.append(TcpProxy(target, port=proxies[0].port).start())
        down["up"] = time.monotonic()

    def third_range(m) -> bool:
        # The response to foundation.ptd's third 1 MiB range: the server goes away while
        # its body is read (a thread: the rule is matched under the proxy's lock).
        hit = ranged_get_of(xxh(ptd))(m) and "bytes=2097152-" in m.request.headers["range"]
        if hit and "at" not in down:
            down["at"] = 0.0
            threading.Thread(target=stop_for_3_s, daemon=True).start()
        return hit

    proxies.append(TcpProxy(target, [Fault("response", "reset", at=1000, match=third_range)])
                   .start())
    dest = here_fs / "machine" / "a"
    dest.parent.mkdir()
    try:
        start = time.monotonic()
        report = fetch_set(url, dest, "a", endpoint_url=proxies[0].url, concurrency=1,
                           range_size=MiB)
        took = time.monotonic() - start
    finally:
        for p in proxies:
            p.close()
    assert "up" in down, "the endpoint was never stopped"
    assert took >= 3.0  # it waited the server out
    assert_placed(dest, pte, ptd)
    # Went on from where it was: not the blob again from its start.
    assert report.bytes_downloaded <= OWN + SHARED + MiB, report.bytes_downloaded


def test_a_failing_download_says_to_run_the_same_fetch_set_again(s3env, here_fs, capsys):
    url, pte, ptd = publish(s3env, here_fs)
    # Every ranged GET of foundation.ptd's blob is cut, however often it is tried.
    proxy = TcpProxy(target_of(s3env), [Fault("response", "reset", at=1000,
                                              match=ranged_get_of(xxh(ptd)), times=10_000)])
    dest = here_fs / "machine" / "a"
    dest.parent.mkdir()
    with proxy:
        rc = main(["fetch-set", url, str(dest), "--member", "a", "--endpoint-url", proxy.url,
                   "--no-progress"])
        err = capsys.readouterr().err
        assert rc == 1, err
        assert err.count("\n") == 1 and err.startswith("trtet-store fetch-set: interrupted: "), err
        command = err.split("run `", 1)[1].split("`", 1)[0]
        words = shlex.split(command)
        assert words == ["trtet-store", "fetch-set", url, str(dest), "--member", "a",
                         "--endpoint-url", proxy.url], command
        assert "trtet-store fetch " not in err, err  # not the blob's internal fetch
        assert f"s3://{s3env.bucket}/rel/:" in err  # which set
        assert not (dest / "model.pte").exists()  # nothing placed
        # The command it printed, run as printed, finishes the member.
        proxy.clear()
        assert main([*words[1:], "--no-progress"]) == 0, capsys.readouterr().err
    assert_placed(dest, pte, ptd)


def test_a_server_gone_for_good_says_to_run_the_same_fetch_set_again(s3env, here_fs,
                                                                    monkeypatch):
    """A call of fetch-set's own (a blob's HEAD) failing past the window: the same advice."""
    url, pte, ptd = publish(s3env, here_fs)
    monkeypatch.setattr(set_fetch, "RETRY_WINDOW", 1.0)  # the policy; the state needs no 20 s
    proxy = TcpProxy(target_of(s3env)).start()

    def gone_after_the_manifest(m) -> bool:
        # The first request for a blob (its HEAD, after the set manifest was read): the
        # server goes away for good (a thread: the rule is matched under the proxy's lock).
        if "/blobs/" in m.target:
            threading.Thread(target=proxy.close, daemon=True).start()
        return False

    proxy.add(Fault("request", "reset", match=gone_after_the_manifest))
    dest = here_fs / "machine" / "a"
    dest.parent.mkdir()
    try:
        with pytest.raises(FetchInterruptedError) as info:
            fetch_set(url, dest, "a", endpoint_url=proxy.url)
    finally:
        proxy.close()
    message = str(info.value)
    assert "(gave up after " in message, message  # the policy said: tries and seconds
    assert info.value.resume == shlex.join(["trtet-store", "fetch-set", url, str(dest),
                                            "--member", "a", "--endpoint-url", proxy.url])
    assert "trtet-store fetch " not in message, message
    assert not (dest / "model.pte").exists()
