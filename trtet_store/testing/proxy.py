"""A counting loopback TCP proxy: how many bytes a client really exchanged with a server.

:class:`CountingProxy` listens on 127.0.0.1 (a free port), forwards every
connection it accepts to ``(target_host, target_port)`` and counts the bytes
it forwarded in each direction: ``downstream`` (server -> client, e.g. a
GetObject's body plus response headers) and ``upstream`` (client -> server,
e.g. a PutObject's body plus request headers). Give a client
:attr:`CountingProxy.endpoint_url` instead of the server's URL, and the counts
are an independent measure of what it downloaded or uploaded: they do not
trust the client's own report.

Bytes are counted as they are handed to the kernel (counted before each
``send``, so a client that has read them never sees a smaller count; what the
send did not take is taken back), so a connection cut mid-transfer counts what
actually went through. Counters are guarded by a
lock; :meth:`CountingProxy.reset` zeroes them between measurements.

Standard library only (tests and benchmarks use it; nothing in the library
imports it). One accept thread, two pump threads per connection;
:meth:`CountingProxy.close` stops them all and closes every socket.
"""

from __future__ import annotations

import contextlib
import socket
import threading
from typing import Any
from urllib.parse import urlsplit

__all__ = ["CountingProxy"]

_BUF = 1024 * 1024
# The accept loop wakes this often to notice close(): a blocked accept() is not
# reliably woken by closing its socket from another thread.
_ACCEPT_POLL = 0.05


class CountingProxy:
    """Forward ``127.0.0.1:<free port>`` to ``(target_host, target_port)``, counting bytes.

    Starts listening and accepting when constructed; use it as a context
    manager (``with CountingProxy(host, port) as proxy:``) or call
    :meth:`close` when done.

    Parameters
    ----------
    target_host : str
        The server's host name or address.
    target_port : int
        The server's port (1-65535).
    connect_timeout : float
        Seconds to wait for a connection to the server (> 0). A connection
        that cannot be made closes the client's connection (the client sees
        a reset or EOF, as if the server were down).

    Attributes
    ----------
    port : int
        The port the proxy listens on (127.0.0.1).
    target : tuple of (str, int)
        Where it forwards.

    Examples
    --------
    >>> with CountingProxy("127.0.0.1", 8333) as proxy:      # doctest: +SKIP
    ...     client = boto3.client("s3", endpoint_url=proxy.endpoint_url, ...)
    ...     client.get_object(Bucket="b", Key="k")["Body"].read()
    ...     print(proxy.downstream, proxy.upstream)
    """

    def __init__(self, target_host: str, target_port: int, *,
                 connect_timeout: float = 10.0) -> None:
        if not isinstance(target_host, str) or not target_host:
            raise ValueError(f"target_host must be a non-empty host name, not {target_host!r}")
        if isinstance(target_port, bool) or not isinstance(target_port, int) \
                or not 0 < target_port < 65536:
            raise ValueError(f"target_port must be an int in 1..65535, not {target_port!r}")
        if not connect_timeout > 0:
            raise ValueError(f"connect_timeout must be > 0 seconds, not {connect_timeout!r}")
        self.target = (target_host, target_port)
        self._connect_timeout = connect_timeout
        self._lock = threading.Lock()
        self._downstream = 0
        self._upstream = 0
        self._connections = 0
        self._closed = threading.Event()
        self._socks: set[socket.socket] = set()
        self._threads: list[threading.Thread] = []
        self._listener = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        try:
            self._listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            self._listener.bind(("127.0.0.1", 0))
            self._listener.listen(64)
            self._listener.settimeout(_ACCEPT_POLL)
        except BaseException:
            self._listener.close()
            raise
        self.port: int = self._listener.getsockname()[1]
        accept = threading.Thread(target=self._accept, name=f"counting-proxy-{self.port}",
                                  daemon=True)
        self._threads.append(accept)
        accept.start()

    @classmethod
    def for_url(cls, url: str, **kwargs: Any) -> CountingProxy:
        """A proxy in front of an ``http://host:port`` endpoint URL (e.g. the test server's).

        Raises
        ------
        ValueError
            The URL is not ``http://host:port`` (https cannot be counted
            through a plain TCP proxy without the client trusting it, and a
            port is needed to connect).
        """
        parts = urlsplit(url)
        if parts.scheme != "http" or not parts.hostname or parts.port is None:
            raise ValueError(f"CountingProxy.for_url needs 'http://host:port', got {url!r}")
        return cls(parts.hostname, parts.port, **kwargs)

    # -- what callers read ---------------------------------------------------------------------

    @property
    def endpoint_url(self) -> str:
        """``http://127.0.0.1:<port>``: give this to the client as its endpoint."""
        return f"http://127.0.0.1:{self.port}"

    @property
    def downstream(self) -> int:
        """Bytes forwarded server -> client since construction or the last :meth:`reset`."""
        with self._lock:
            return self._downstream

    @property
    def upstream(self) -> int:
        """Bytes forwarded client -> server since construction or the last :meth:`reset`."""
        with self._lock:
            return self._upstream

    @property
    def connections(self) -> int:
        """Client connections accepted since construction or the last :meth:`reset`."""
        with self._lock:
            return self._connections

    @property
    def closed(self) -> bool:
        """Whether :meth:`close` was called."""
        return self._closed.is_set()

    def counts(self) -> dict[str, int]:
        """``{"downstream", "upstream", "connections"}`` read together (one consistent snapshot)."""
        with self._lock:
            return {"downstream": self._downstream, "upstream": self._upstream,
                    "connections": self._connections}

    def reset(self) -> dict[str, int]:
        """Zero the counters; returns what they held (read and zeroed atomically)."""
        with self._lock:
            before = {"downstream": self._downstream, "upstream": self._upstream,
                      "connections": self._connections}
            self._downstream = self._upstream = self._connections = 0
        return before

    # -- the forwarding ------------------------------------------------------------------------

    def _accept(self) -> None:
        while not self._closed.is_set():
            try:
                client, _ = self._listener.accept()
            except TimeoutError:
                continue
            except OSError:  # the listener was closed
                return
            client.settimeout(None)
            try:
                server = socket.create_connection(self.target, timeout=self._connect_timeout)
                server.settimeout(None)
            except OSError:
                _close(client)
                continue
            with self._lock:
                if self._closed.is_set():  # close() ran meanwhile: it will not see these
                    _close(client)
                    _close(server)
                    return
                self._connections += 1
                self._socks.update((client, server))
                # Finished threads are dropped so a long-lived proxy does not grow a list.
                self._threads = [t for t in self._threads if t.is_alive()]
                pumps_left = [2]  # the connection's sockets close when both pumps end
                pumps = [threading.Thread(target=self._pump, args=(src, dst, attr, pumps_left),
                                          name=f"counting-proxy-{self.port}-{attr}", daemon=True)
                         for src, dst, attr in ((client, server, "_upstream"),
                                                (server, client, "_downstream"))]
                self._threads.extend(pumps)
            for t in pumps:
                t.start()

    def _pump(self, src: socket.socket, dst: socket.socket, counter: str,
              pumps_left: list[int]) -> None:
        try:
            while True:
                data = src.recv(_BUF)
                if not data:
                    # Half-close: the peer may still be answering (HTTP keeps it simple,
                    # but a client that shuts down its write side still reads).
                    with contextlib.suppress(OSError):
                        dst.shutdown(socket.SHUT_WR)
                    return
                self._forward(dst, data, counter)
        except OSError:
            # One side failed: end both directions of this connection.
            for s in (src, dst):
                with contextlib.suppress(OSError):
                    s.shutdown(socket.SHUT_RDWR)
        finally:
            self._retire(src, dst, pumps_left)

    def _forward(self, dst: socket.socket, data: bytes, counter: str) -> None:
        """Send ``data`` to ``dst``, counted before each send and corrected after it.

        Counted first, because the peer may read the bytes and its caller look at the
        counter before this thread runs again (counted after ``sendall``, a client
        saw ``downstream == 0`` after its HeadObject answer). What a send did not take
        is taken back, so a cut connection still counts only what went through.
        """
        view = memoryview(data)
        while view:
            self._add(counter, len(view))
            try:
                sent = dst.send(view)
            except OSError:
                self._add(counter, -len(view))
                raise
            self._add(counter, sent - len(view))
            view = view[sent:]

    def _add(self, counter: str, n: int) -> None:
        with self._lock:
            setattr(self, counter, getattr(self, counter) + n)

    def _retire(self, src: socket.socket, dst: socket.socket, pumps_left: list[int]) -> None:
        """Close a connection's two sockets once both of its pumps are done with them."""
        with self._lock:
            pumps_left[0] -= 1
            last = pumps_left[0] == 0
            if last:
                self._socks.discard(src)
                self._socks.discard(dst)
        if last:
            _close(src)
            _close(dst)

    # -- stopping ------------------------------------------------------------------------------

    def close(self, timeout: float = 5.0) -> None:
        """Stop accepting, cut every open connection, join every thread. Idempotent.

        Raises
        ------
        RuntimeError
            A thread did not end within ``timeout`` seconds (it should not happen:
            every socket it could block on is shut down first).
        """
        self._closed.set()
        with contextlib.suppress(OSError):
            self._listener.close()
        with self._lock:
            socks = list(self._socks)
            threads = list(self._threads)
        for s in socks:
            # shutdown wakes a pump blocked in recv/send on it; its finally closes it.
            with contextlib.suppress(OSError):
                s.shutdown(socket.SHUT_RDWR)
        stuck = []
        for t in threads:
            if t is not threading.current_thread():
                t.join(timeout)
                if t.is_alive():
                    stuck.append(t.name)
        with self._lock:
            leftover = list(self._socks)
            self._socks.clear()
        for s in leftover:
            _close(s)
        if stuck:
            raise RuntimeError(f"CountingProxy.close: threads still running after {timeout} s: "
                               f"{stuck}")

    def __enter__(self) -> CountingProxy:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def __repr__(self) -> str:
        state = "closed" if self.closed else "open"
        return (f"CountingProxy({self.endpoint_url} -> {self.target[0]}:{self.target[1]}, "
                f"{state}, downstream={self.downstream}, upstream={self.upstream})")


def _close(sock: socket.socket) -> None:
    with contextlib.suppress(OSError):
        sock.close()
