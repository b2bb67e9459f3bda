"""trtet_store.testing.proxy.CountingProxy on the real SeaweedFS server.

The proxy is the independent measure the engine cache's tests and benchmark
use for "bytes downloaded once": its counts must bound a transfer from both
sides (at least the body, at most the body plus HTTP headers), attribute
each byte to its direction, and close without leaving a socket or thread.
"""

from __future__ import annotations

import dataclasses
import os
import socket
import threading
from typing import Any
from urllib.parse import urlsplit

import pytest

from trtet_store.testing.proxy import CountingProxy

MiB = 1024 * 1024
# HTTP request and response headers of one S3 call (SigV4 authorization,
# checksum headers, x-amz-*): a few hundred bytes to ~2 KiB. Allow 8 KiB.
HEADERS = 8 * 1024


def client_through(s3: Any, proxy: CountingProxy) -> Any:
    """A boto3 client on the test server's credentials, connecting through ``proxy``."""
    return dataclasses.replace(s3.endpoint, url=proxy.endpoint_url).client()


def proxy_threads() -> list[str]:
    return [t.name for t in threading.enumerate() if t.name.startswith("counting-proxy-")]


def refused(port: int) -> bool:
    """Whether a connection to 127.0.0.1:``port`` is refused (nothing listens there)."""
    try:
        socket.create_connection(("127.0.0.1", port), timeout=2).close()
    except ConnectionRefusedError:
        return True
    return False


def test_a_get_object_is_counted_downstream_once(s3: Any) -> None:
    body = os.urandom(3 * MiB + 123)
    s3.client.put_object(Bucket=s3.bucket, Key="k", Body=body)  # directly, not counted
    with CountingProxy.for_url(s3.endpoint.url) as proxy:
        client = client_through(s3, proxy)
        got = client.get_object(Bucket=s3.bucket, Key="k")["Body"].read()
        assert got == body
        down, up = proxy.downstream, proxy.upstream
        assert len(body) <= down < len(body) + HEADERS, (down, len(body))
        assert 0 < up < HEADERS, up  # the request: headers only
        # reset() hands back what it held, and the next call starts from zero
        assert proxy.reset() == {"downstream": down, "upstream": up, "connections": 1}
        assert proxy.counts() == {"downstream": 0, "upstream": 0, "connections": 0}
        client.head_object(Bucket=s3.bucket, Key="k")
        assert 0 < proxy.downstream < HEADERS  # the same kept-alive connection, headers only


class _HeldAfterSend:
    """A socket whose ``send`` delivers, then holds its thread until released.

    Sets up the interleaving CI drew once: the peer has read the bytes and looks at
    the counter while the pump has not run again since its send.
    """

    def __init__(self, sock: socket.socket) -> None:
        self.sock = sock
        self.sent = threading.Event()
        self.release = threading.Event()

    def send(self, data: Any) -> int:
        n = self.sock.send(data)
        self.sent.set()
        assert self.release.wait(10)
        return n


def test_bytes_a_peer_has_read_are_already_counted(s3: Any) -> None:
    with CountingProxy.for_url(s3.endpoint.url) as proxy:
        a, b = socket.socketpair()
        held = _HeldAfterSend(a)
        pump = threading.Thread(target=proxy._forward, args=(held, b"x" * 1000, "_downstream"))
        pump.start()
        try:
            assert held.sent.wait(10)
            assert b.recv(4096) == b"x" * 1000
            assert proxy.downstream == 1000  # the pump is still held after its send
        finally:
            held.release.set()
            pump.join(10)
            a.close()
            b.close()
        assert proxy.downstream == 1000


def test_a_put_object_is_counted_upstream_once(s3: Any) -> None:
    body = os.urandom(2 * MiB + 7)
    server = urlsplit(s3.endpoint.url)
    with CountingProxy(server.hostname, server.port) as proxy:  # the plain constructor
        client_through(s3, proxy).put_object(Bucket=s3.bucket, Key="up", Body=body)
        up, down = proxy.upstream, proxy.downstream
    assert len(body) <= up < len(body) + HEADERS, (up, len(body))
    assert 0 < down < HEADERS, down  # the answer: headers only
    assert s3.client.get_object(Bucket=s3.bucket, Key="up")["Body"].read() == body


def test_concurrent_connections_are_all_counted(s3: Any) -> None:
    """Four clients at once (four connections, eight pumps) against one lock: no count is lost."""
    bodies = {f"c{i}": os.urandom(MiB + i) for i in range(4)}
    for key, body in bodies.items():
        s3.client.put_object(Bucket=s3.bucket, Key=key, Body=body)
    with CountingProxy.for_url(s3.endpoint.url) as proxy:
        got: dict[str, bytes] = {}

        def get(key: str) -> None:
            got[key] = client_through(s3, proxy).get_object(Bucket=s3.bucket,
                                                            Key=key)["Body"].read()

        threads = [threading.Thread(target=get, args=(k,)) for k in bodies]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        assert got == bodies
        total = sum(map(len, bodies.values()))
        assert total <= proxy.downstream < total + 4 * HEADERS
        assert proxy.connections == 4


def test_close_leaves_no_listener_thread_or_connection(s3: Any) -> None:
    before = proxy_threads()
    proxy = CountingProxy.for_url(s3.endpoint.url)
    port = proxy.port
    client = client_through(s3, proxy)
    client.put_object(Bucket=s3.bucket, Key="k", Body=b"x" * 1000)  # a kept-alive connection
    assert len(proxy_threads()) == len(before) + 3  # accept + the connection's two pumps
    proxy.close()
    assert proxy.closed
    assert proxy_threads() == before
    assert refused(port), f"something still listens on the proxy's port {port}"
    assert not proxy._socks
    proxy.close()  # idempotent
    # the client's pooled connection was cut: its next call fails, it does not hang
    with pytest.raises(Exception):  # noqa: B017, PT011  (botocore's connection errors vary)
        client.head_object(Bucket=s3.bucket, Key="k")


def test_a_server_that_is_gone_cuts_the_client_and_counts_nothing() -> None:
    # A port nothing listens on: bind, read it, close.
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    dead = s.getsockname()[1]
    s.close()
    with CountingProxy("127.0.0.1", dead, connect_timeout=2) as proxy:
        c = socket.create_connection(("127.0.0.1", proxy.port), timeout=5)
        c.sendall(b"GET / HTTP/1.1\r\nHost: x\r\n\r\n")
        try:  # closed by the proxy, no answer: EOF, or a reset (its request was left unread)
            answer = c.recv(100)
        except ConnectionResetError:
            answer = b""
        assert answer == b""
        c.close()
        assert proxy.counts() == {"downstream": 0, "upstream": 0, "connections": 0}


@pytest.mark.parametrize(("args", "kwargs", "message"), [
    (("", 80), {}, "target_host"),
    (("127.0.0.1", 0), {}, "target_port"),
    (("127.0.0.1", "80"), {}, "target_port"),
    (("127.0.0.1", True), {}, "target_port"),
    (("127.0.0.1", 80), {"connect_timeout": 0}, "connect_timeout"),
])
def test_bad_arguments_are_refused(args: tuple, kwargs: dict, message: str) -> None:
    before = proxy_threads()
    with pytest.raises(ValueError, match=message):
        CountingProxy(*args, **kwargs)
    assert proxy_threads() == before


def test_unknown_keywords_and_bad_urls_are_refused() -> None:
    with pytest.raises(TypeError):
        CountingProxy("127.0.0.1", 80, timeout=3)  # type: ignore[call-arg]
    for url in ("https://127.0.0.1:8333", "http://127.0.0.1", "127.0.0.1:8333"):
        with pytest.raises(ValueError, match="http://host:port"):
            CountingProxy.for_url(url)
