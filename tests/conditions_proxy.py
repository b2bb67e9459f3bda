"""A loopback HTTP proxy in front of the S3 test server that can make it ignore conditions.

:class:`ConditionsProxy` listens on 127.0.0.1 (a free port) and forwards each
request to the server as it came, and each answer back. With
``ignore=("if-none-match", "if-match")`` it removes those headers from every
write (PUT, POST, DELETE) on the way: the server then never sees them,
as a server that accepts the headers and ignores them (moto; MinIO once, for
``If-Match`` on a missing key). SeaweedFS checks each request's SigV4
signature, which covers those headers, so a request that loses one is signed
again (botocore's ``S3SigV4Auth`` over an ``AWSRequest``, with the test
credentials), payload hash included; every other request passes byte for
byte in its headers and body. The client keeps its own signature and never
knows.

:attr:`ConditionsProxy.requests` records every request as ``(method, target,
stripped headers)``. :meth:`ConditionsProxy.fail_next` answers the next writes
whose target contains a string with an S3 error of the test's choosing (a
503 ``SlowDown``, a 403 ``AccessDenied``...) instead of forwarding them.
Standard library and botocore only; no pytest.
"""

from __future__ import annotations

import http.client
import threading
from dataclasses import dataclass
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from urllib.parse import urlsplit

__all__ = ["ConditionsProxy", "Seen"]

CONDITIONS = ("if-none-match", "if-match")
# Never forwarded: they belong to one hop (and Expect is answered here, by http.server).
_HOP = frozenset({"connection", "keep-alive", "proxy-connection", "transfer-encoding", "te",
                  "trailer", "upgrade", "expect"})
_WRITES = frozenset({"PUT", "POST", "DELETE"})


@dataclass(frozen=True)
class Seen:
    """One request the proxy forwarded."""

    method: str
    target: str  # path and query, as sent
    stripped: tuple[tuple[str, str], ...]  # (header, value) removed before the server saw it


class ConditionsProxy:
    """Forward ``http://127.0.0.1:<port>`` to ``target_url``; optionally drop write conditions.

    Parameters
    ----------
    target_url : str
        The server (``http://host:port``).
    access_key, secret_key, region : str
        The credentials a stripped request is signed again with.
    ignore : tuple of str
        The condition headers (lower case: ``"if-none-match"``, ``"if-match"``)
        removed from PUT, POST and DELETE; ``()``: none (a counting pass-through).
    refuse : bool
        Answer a write that carries a condition header ``501 NotImplemented``
        (an S3 error document) instead of forwarding it: a server that does
        not implement conditional writes and says so.
    """

    def __init__(self, target_url: str, *, access_key: str, secret_key: str, region: str,
                 ignore: tuple[str, ...] = (), refuse: bool = False) -> None:
        parts = urlsplit(target_url)
        self.refuse = refuse
        self.target = (parts.hostname or "127.0.0.1", parts.port or 80)
        self.credentials = (access_key, secret_key, region)
        if not set(ignore) <= set(CONDITIONS):
            raise ValueError(f"ignore names {ignore!r}; only {CONDITIONS} can be ignored")
        self.ignore = tuple(ignore)
        self.requests: list[Seen] = []
        self._failures: list[tuple[str, int, str]] = []  # (needle, status, code), in order
        self._lock = threading.Lock()
        proxy = self

        class Handler(_Handler):
            owner = proxy

        self._server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self._server.daemon_threads = True
        self.port = self._server.server_address[1]
        self.url = f"http://127.0.0.1:{self.port}"
        self._thread = threading.Thread(target=self._server.serve_forever,
                                        name=f"conditions-proxy-{self.port}", daemon=True)
        self._thread.start()

    def seen(self, needle: str = "") -> list[Seen]:
        """The requests whose target contains ``needle`` (all by default), in order."""
        with self._lock:
            return [s for s in self.requests if needle in s.target]

    def fail_next(self, needle: str, status: int, code: str, times: int = 1) -> None:
        """Answer the next ``times`` writes whose target contains ``needle`` with ``status``
        and an S3 error document of ``code`` (never forwarded: the server sees nothing)."""
        with self._lock:
            self._failures.extend([(needle, status, code)] * times)

    def _failure(self, method: str, target: str) -> tuple[int, str] | None:
        with self._lock:
            for i, (needle, status, code) in enumerate(self._failures):
                if method in _WRITES and needle in target:
                    del self._failures[i]
                    return status, code
        return None

    def close(self) -> None:
        self._server.shutdown()
        self._server.server_close()

    def __enter__(self) -> ConditionsProxy:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def _record(self, seen: Seen) -> None:
        with self._lock:
            self.requests.append(seen)

    def _resign(self, method: str, target: str, headers: list[tuple[str, str]],
                body: bytes) -> list[tuple[str, str]]:
        """``headers`` signed again for ``method target`` (SigV4, the payload's SHA-256)."""
        from botocore.auth import S3SigV4Auth
        from botocore.awsrequest import AWSRequest
        from botocore.credentials import Credentials

        access, secret, region = self.credentials
        drop = {"authorization", "x-amz-date", "x-amz-content-sha256"}
        kept = [(k, v) for k, v in headers if k.lower() not in drop]
        host = next(v for k, v in kept if k.lower() == "host")
        request = AWSRequest(method=method, url=f"http://{host}{target}", data=body,
                             headers=dict(kept))
        S3SigV4Auth(Credentials(access, secret), "s3", region).add_auth(request)
        return list(request.headers.items())


class _Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"  # keep-alive, as botocore's pool expects; 100-continue
    owner: ConditionsProxy

    def log_message(self, format: str, *args: object) -> None:  # noqa: A002 - the base's name
        pass

    def _forward(self) -> None:
        owner = self.owner
        if "chunked" in self.headers.get("Transfer-Encoding", "").lower():
            raise AssertionError("a chunked request body: the proxy forwards sized bodies only")
        length = int(self.headers.get("Content-Length") or 0)
        body = self.rfile.read(length) if length else b""
        headers = [(k, v) for k, v in self.headers.items() if k.lower() not in _HOP]
        stripped: tuple[tuple[str, str], ...] = ()
        if self.command in _WRITES:
            stripped = tuple((k.lower(), v) for k, v in headers if k.lower() in owner.ignore)
            if stripped:
                headers = owner._resign(self.command, self.path,
                                        [(k, v) for k, v in headers
                                         if k.lower() not in owner.ignore], body)
        owner._record(Seen(self.command, self.path, stripped))
        failure = owner._failure(self.command, self.path)
        if failure is not None:
            status, code = failure
            error = (f'<?xml version="1.0" encoding="UTF-8"?>\n<Error><Code>{code}</Code>'
                     f'<Message>injected by the test proxy</Message></Error>').encode()
            self.send_response_only(status)
            self.send_header("Content-Type", "application/xml")
            self.send_header("Content-Length", str(len(error)))
            self.end_headers()
            self.wfile.write(error)
            return
        if owner.refuse and self.command in _WRITES and \
                any(k.lower() in CONDITIONS for k, _ in headers):
            error = (b'<?xml version="1.0" encoding="UTF-8"?>\n<Error><Code>NotImplemented'
                     b'</Code><Message>A header you provided implies functionality that is '
                     b'not implemented</Message></Error>')
            self.send_response_only(501, "Not Implemented")
            self.send_header("Content-Type", "application/xml")
            self.send_header("Content-Length", str(len(error)))
            self.end_headers()
            self.wfile.write(error)
            return
        conn = http.client.HTTPConnection(*owner.target, timeout=120)
        try:
            conn.putrequest(self.command, self.path, skip_host=True, skip_accept_encoding=True)
            for k, v in headers:
                conn.putheader(k, v)
            conn.endheaders(body if body else None)
            answer = conn.getresponse()
            data = answer.read()
            self.send_response_only(answer.status, answer.reason)
            for k, v in answer.getheaders():
                if k.lower() not in _HOP and k.lower() != "content-length":
                    self.send_header(k, v)
            size = answer.getheader("Content-Length") if self.command == "HEAD" else None
            self.send_header("Content-Length", size if size is not None else str(len(data)))
            self.end_headers()
            if self.command != "HEAD":
                self.wfile.write(data)
        finally:
            conn.close()

    do_GET = do_PUT = do_POST = do_DELETE = do_HEAD = _forward  # noqa: N815 - http.server's names
