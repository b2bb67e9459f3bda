"""A loopback TCP proxy that understands just enough HTTP/1.1 to break it on purpose.

:class:`TcpProxy` listens on 127.0.0.1 (a free port), forwards every
connection to ``target``, and parses both directions as HTTP/1.1 messages
(headers, then a ``Content-Length`` or chunked body; keep-alive connections
carry several). :class:`Fault` rules fire at chosen moments:

- ``action="flip"``: XOR one byte of a message body (``at`` = its offset in
  the body) with ``0x01`` as it passes; the client or server sees the wrong
  byte, every header intact.
- ``action="reset"``: once ``at`` bytes of the body have passed (``at=0``:
  right after the headers), close both sides with an RST (``SO_LINGER`` 0).
- ``action="cut"``: as ``reset``, but the client's side is closed with a FIN
  after exactly ``at`` body bytes: the client reads every one of them, then
  the end of the stream (a body cut short at a known byte; an RST may drop
  what the client had not read yet).

``date_skew`` (seconds, settable at any time) moves every response's ``Date``
header that far: the server's clock as a client reads it, so an object written now
looks ``date_skew`` seconds old (Date less Last-Modified) without waiting.

A rule picks its messages by direction (``"request"`` or ``"response"``),
an optional predicate on :class:`Message` (a response's message carries the
request it answers, so "the response to a ranged GET of key K" is
expressible) and ``skip``/``times`` (let the first ``skip`` matches pass,
then fire on ``times`` of them). What it did is recorded in
:attr:`TcpProxy.fired`; :attr:`TcpProxy.body_bytes` counts body bytes per
direction and method, an independent measure of what a client sent.

Standard library only; no pytest. Threads, one pair per connection.
"""

from __future__ import annotations

import contextlib
import socket
import struct
import threading
import time
from collections import Counter, deque
from collections.abc import Callable
from dataclasses import dataclass, field

_BUF = 256 * 1024


@dataclass
class Message:
    """One HTTP message's start line and headers (names lower-cased)."""

    direction: str  # "request" or "response"
    start_line: str
    headers: dict[str, str]
    request: Message | None = None  # for a response: the request it answers

    @property
    def method(self) -> str:
        """The request's method (a response: its request's)."""
        if self.direction == "response":
            return self.request.method if self.request else ""
        return self.start_line.split(" ", 1)[0]

    @property
    def target(self) -> str:
        """The request target (path and query); a response: its request's."""
        if self.direction == "response":
            return self.request.target if self.request else ""
        parts = self.start_line.split(" ")
        return parts[1] if len(parts) > 1 else ""

    @property
    def status(self) -> int:
        """A response's status code (0 for a request)."""
        if self.direction != "response":
            return 0
        try:
            return int(self.start_line.split(" ")[1])
        except (IndexError, ValueError):
            return 0


@dataclass
class Fault:
    """One rule: what to do to which message, and how often.

    Parameters
    ----------
    direction : {"request", "response"}
    action : {"flip", "reset", "cut"}
    at : int
        Body offset: the byte flipped, or the bytes let through before the reset.
    match : callable, optional
        ``match(message) -> bool``; default every message of ``direction``
        with a body longer than ``at`` (for ``flip``) or any (for ``reset``).
    skip : int
        Matching messages let through untouched before the rule fires.
    times : int
        How many messages it fires on; then it is spent.
    """

    direction: str
    action: str
    at: int = 0
    match: Callable[[Message], bool] | None = None
    skip: int = 0
    times: int = 1
    fired: int = field(default=0, init=False)
    seen: int = field(default=0, init=False)

    def __post_init__(self) -> None:
        if self.direction not in ("request", "response"):
            raise ValueError(f"direction must be 'request' or 'response', not {self.direction!r}")
        if self.action not in ("flip", "reset", "cut"):
            raise ValueError(f"action must be 'flip', 'reset' or 'cut', not {self.action!r}")

    @property
    def spent(self) -> bool:
        return self.fired >= self.times


class _Reset(Exception):
    """A rule asked for this connection to be reset (``args``: the bytes still to send,
    and whether the client's side closes with a FIN: ``cut``)."""


class _Stream:
    """One direction of one connection: parses messages, applies faults, returns bytes to send."""

    def __init__(self, proxy: TcpProxy, direction: str, requests: deque) -> None:
        self.proxy = proxy
        self.direction = direction
        self.requests = requests  # request heads awaiting their response (FIFO)
        self.head = bytearray()
        self.message: Message | None = None
        self.remaining = 0  # body bytes left (content-length), or in the current chunk
        self.body_pos = 0
        self.chunked = False
        self.chunk_state = ""  # "", "size", "data", "crlf", "trailer"
        self.line = bytearray()
        self.armed: list[Fault] = []

    def feed(self, data: bytes) -> bytes:
        out = bytearray()
        view = memoryview(data)
        try:
            while len(view):
                if self.message is None:
                    view = self._read_head(view, out)
                elif self.chunked:
                    view = self._read_chunked(view, out)
                else:
                    take = min(len(view), self.remaining)
                    out += self._body(view[:take])
                    view = view[take:]
                    self.remaining -= take
                    if self.remaining == 0:
                        self._end()
        except _Reset as reset:  # what passed before the fault still goes through
            raise _Reset(bytes(out) + reset.args[0], *reset.args[1:]) from None
        return bytes(out)

    def _read_head(self, view: memoryview, out: bytearray) -> memoryview:
        self.head += view
        end = self.head.find(b"\r\n\r\n")
        if end < 0:
            return memoryview(b"")
        rest = bytes(self.head[end + 4:])
        raw = bytes(self.head[:end + 4])
        self.head.clear()
        if self.direction == "response" and self.proxy.date_skew:
            raw = _skew_date(raw, self.proxy.date_skew)
        out += raw
        lines = raw.decode("latin-1").split("\r\n")
        headers = {}
        for line in lines[1:]:
            if ":" in line:
                k, v = line.split(":", 1)
                headers[k.strip().lower()] = v.strip()
        request = None
        if self.direction == "response" and self.requests:
            # an interim answer (100 Continue) leaves its request waiting for the final one
            interim = lines[0].split(" ")[1:2] in (["100"], ["101"], ["102"], ["103"])
            request = self.requests[0] if interim else self.requests.popleft()
        msg = Message(self.direction, lines[0], headers, request)
        if self.direction == "request":
            self.requests.append(msg)
        self.message = msg
        self.body_pos = 0
        self.chunked = "chunked" in headers.get("transfer-encoding", "").lower()
        no_body = self.direction == "response" and (
            msg.method == "HEAD" or msg.status in (204, 304) or 100 <= msg.status < 200)
        self.remaining = 0 if no_body else int(headers.get("content-length", "0") or 0)
        self.chunk_state = "size"
        self.armed = self.proxy._arm(msg)
        self._maybe_reset()  # a reset at 0 fires right after the headers
        if not self.chunked and self.remaining == 0:
            self._end()
        return memoryview(rest)

    def _read_chunked(self, view: memoryview, out: bytearray) -> memoryview:
        if self.chunk_state in ("size", "crlf", "trailer"):
            nl = bytes(view).find(b"\n")
            if nl < 0:
                self.line += view
                out += view
                return memoryview(b"")
            self.line += view[:nl + 1]
            out += view[:nl + 1]
            line = bytes(self.line).strip()
            self.line.clear()
            view = view[nl + 1:]
            if self.chunk_state == "size":
                size = int(line.split(b";")[0], 16)
                if size == 0:
                    self.chunk_state = "trailer"
                else:
                    self.remaining, self.chunk_state = size, "data"
            elif self.chunk_state == "crlf":
                self.chunk_state = "size"
            elif not line:  # the blank line after the trailers
                self._end()
            return view
        take = min(len(view), self.remaining)
        out += self._body(view[:take])
        self.remaining -= take
        if self.remaining == 0:
            self.chunk_state = "crlf"
        return view[take:]

    def _body(self, chunk: memoryview) -> bytes:
        data = bytearray(chunk)
        start = self.body_pos
        for fault in self.armed:
            if fault.action == "flip" and start <= fault.at < start + len(data):
                data[fault.at - start] ^= 0x01
                self.proxy._record(fault, self.message)
        self.body_pos += len(data)
        try:
            self._maybe_reset(data, start)
        finally:  # what passed: a reset's chunk is cut to its ``at`` bytes first
            self.proxy._count(self.direction, self.message.method, len(data))
        return bytes(data)

    def _maybe_reset(self, data: bytearray | None = None, start: int = 0) -> None:
        for fault in self.armed:
            if fault.action in ("reset", "cut") and self.body_pos >= fault.at:
                self.proxy._record(fault, self.message)
                if data is not None:
                    # let exactly ``at`` body bytes through before the reset
                    del data[max(0, fault.at - start):]
                raise _Reset(bytes(data or b""), fault.action == "cut")

    def _end(self) -> None:
        self.message = None
        self.armed = []


class TcpProxy:
    """Forward 127.0.0.1:``port`` to ``target``, applying :class:`Fault` rules.

    Use as a context manager, or :meth:`start` / :meth:`close`.

    Attributes
    ----------
    url : str
        ``http://127.0.0.1:<port>``, to give a client as its endpoint.
    fired : list of (Fault, Message)
        Every time a rule acted, in order.
    body_bytes : collections.Counter
        Body bytes passed, keyed by ``(direction, method)``.
    connections : int
        Connections accepted.
    request_rate : float or None
        Bytes per second each connection may send toward the server (a slow
        uplink, so a test can stop a client mid-upload); None: no limit.
    date_skew : float
        Seconds added to every response's ``Date`` (0: untouched).
    """

    def __init__(self, target: tuple[str, int], faults: list[Fault] | None = None,
                 request_rate: float | None = None, port: int = 0) -> None:
        self.target = target
        self.request_rate = request_rate
        self.date_skew = 0.0
        self.faults: list[Fault] = list(faults or [])
        self.fired: list[tuple[Fault, Message]] = []
        self.body_bytes: Counter = Counter()
        self.connections = 0
        self._lock = threading.Lock()
        self._listener = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        self._listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        self._listener.bind(("127.0.0.1", port))  # a port again: a server back after a stop
        self._listener.listen(64)
        self.port = self._listener.getsockname()[1]
        self.url = f"http://127.0.0.1:{self.port}"
        self._closed = threading.Event()
        self._socks: set[socket.socket] = set()
        self._threads: list[threading.Thread] = []

    def add(self, fault: Fault) -> Fault:
        """Arm one more rule (thread-safe); returns it, to read ``fault.fired`` later."""
        with self._lock:
            self.faults.append(fault)
        return fault

    def clear(self) -> None:
        """Disarm every rule."""
        with self._lock:
            self.faults.clear()

    def _arm(self, msg: Message) -> list[Fault]:
        armed = []
        with self._lock:
            for f in self.faults:
                if f.direction != msg.direction or f.spent:
                    continue
                if f.match is not None and not f.match(msg):
                    continue
                f.seen += 1
                if f.seen > f.skip:
                    armed.append(f)
        return armed

    def _record(self, fault: Fault, msg: Message) -> None:
        with self._lock:
            if fault.fired < fault.times:
                fault.fired += 1
                self.fired.append((fault, msg))

    def _count(self, direction: str, method: str, n: int) -> None:
        with self._lock:
            self.body_bytes[(direction, method)] += n

    def start(self) -> TcpProxy:
        t = threading.Thread(target=self._accept, name=f"tcp-proxy-{self.port}", daemon=True)
        t.start()
        self._threads.append(t)
        return self

    def _accept(self) -> None:
        while not self._closed.is_set():
            try:
                client, _ = self._listener.accept()
            except OSError:
                return
            try:
                upstream = socket.create_connection(self.target, timeout=10)
                upstream.settimeout(None)
            except OSError:
                _reset(client)
                continue
            with self._lock:
                self.connections += 1
                self._socks.update((client, upstream))
            requests: deque = deque()
            for src, dst, direction in ((client, upstream, "request"),
                                        (upstream, client, "response")):
                t = threading.Thread(target=self._pump,
                                     args=(src, dst, _Stream(self, direction, requests), client,
                                           upstream), daemon=True)
                t.start()
                self._threads.append(t)

    def _pump(self, src: socket.socket, dst: socket.socket, stream: _Stream,
              client: socket.socket, upstream: socket.socket) -> None:
        try:
            while True:
                data = src.recv(_BUF)
                if not data:
                    with contextlib.suppress(OSError):
                        dst.shutdown(socket.SHUT_WR)
                    return
                try:
                    out = stream.feed(data)
                except _Reset as reset:
                    with contextlib.suppress(OSError):
                        dst.sendall(reset.args[0])
                    if len(reset.args) > 1 and reset.args[1]:
                        # cut: a FIN after what was sent, so the client reads all of it
                        with contextlib.suppress(OSError):
                            client.shutdown(socket.SHUT_RDWR)
                        with contextlib.suppress(OSError):
                            client.close()
                    else:
                        _reset(client)
                    _reset(upstream)
                    return
                dst.sendall(out)
                if self.request_rate and stream.direction == "request":
                    time.sleep(len(data) / self.request_rate)
        except OSError:
            _reset(client)
            _reset(upstream)
        finally:
            with self._lock:
                self._socks.discard(src)

    def close(self) -> None:
        """Stop accepting and reset every open connection."""
        self._closed.set()
        with contextlib.suppress(OSError):
            # Wakes the accept() blocked in _accept: a close alone leaves the port
            # listening (the kernel keeps the socket while a thread is inside accept).
            self._listener.shutdown(socket.SHUT_RDWR)
        with contextlib.suppress(OSError):
            self._listener.close()
        with self._lock:
            socks = list(self._socks)
        for s in socks:
            _reset(s)

    def __enter__(self) -> TcpProxy:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.close()


def _skew_date(head: bytes, seconds: float) -> bytes:
    """``head`` (a response's start line and headers) with its Date moved ``seconds`` on."""
    import email.utils

    lines = head.split(b"\r\n")
    for i, line in enumerate(lines):
        name, sep, value = line.partition(b":")
        if sep and name.strip().lower() == b"date":
            when = email.utils.parsedate_to_datetime(value.strip().decode("latin-1"))
            moved = email.utils.formatdate(when.timestamp() + seconds, usegmt=True)
            lines[i] = name + b": " + moved.encode("latin-1")
    return b"\r\n".join(lines)


def _reset(sock: socket.socket) -> None:
    """Close ``sock`` with an RST rather than a FIN.

    ``shutdown(SHUT_RD)`` first wakes the other pump thread's ``recv`` on
    it (sending nothing to the peer): a close while another thread is in a
    call on the socket would release it, and send the RST, only when that
    call returns, which for an idle peer is never.
    """
    with contextlib.suppress(OSError):
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
    with contextlib.suppress(OSError):
        sock.shutdown(socket.SHUT_RD)
    with contextlib.suppress(OSError):
        sock.close()
