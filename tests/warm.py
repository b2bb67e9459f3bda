"""Warm children: a test's child processes forked from a server that imported torch once.

A child that runs ``python -c CHILD`` imports torch and ExecuTorch again: 4-5 CPU-seconds
before it does anything. :func:`popen` runs the same source in a process forked from one
``multiprocessing`` forkserver per test run, which imported torch, ``executorch.exir`` and
trtet_store at its start; the child is still a separate process (its own pid, flocks,
leases and fds 1 and 2 on pipes), killable by SIGKILL at any point, and nothing it does
reaches the server or the next child. :class:`WarmChild` has :class:`subprocess.Popen`'s
face (``pid``, ``poll``, ``wait``, ``communicate``, ``kill``, ``send_signal``, ``stdout``,
``stderr``, ``returncode``) and :func:`run` has :func:`subprocess.run`'s.

Tests that need a fresh interpreter keep ``subprocess`` and say why: lazy-import checks
(torch is already imported here), the console-script entry point, terminal tests, peak
RSS (a fork shares the server's pages), and anything that reads ``TORCH_LOGS`` at torch's
import.
"""

from __future__ import annotations

import multiprocessing
import os
import selectors
import signal
import subprocess
import sys
from collections.abc import Sequence
from multiprocessing.connection import Connection
from typing import Any

#: What the server imports once; a child starts with all of it imported.
PRELOAD = ["torch", "executorch.exir", "trtet_store", "trtet_store.export",
           "trtet_store.export.compile", "trtet_store.testing.stub_tensorrt",
           "trtet_store.cache.tier", "trtet_store.cli", "boto3", "botocore.session"]

#: The source a CLI child runs: the console script's ``main``, as ``python -m`` would.
CLI = "import sys\nfrom trtet_store.cli import main\nsys.exit(main(sys.argv[1:]))\n"

_context: Any = None


def context() -> Any:
    """The forkserver context of this test run (the server starts with the first child)."""
    global _context
    if _context is None:
        ctx = multiprocessing.get_context("forkserver")
        ctx.set_forkserver_preload(PRELOAD)
        _context = ctx
    return _context


def _child(source: str, argv: list[str], cwd: str | None, env: dict[str, str], umask: int,
           out: Connection, err: Connection) -> None:
    """The child's body: fds 1 and 2 on the parent's pipes, the parent's umask, environment
    and ``cwd``, then ``source`` as ``__main__``."""
    os.umask(umask)
    os.dup2(out.fileno(), 1)
    os.dup2(err.fileno(), 2)
    out.close()
    err.close()
    os.environ.clear()
    os.environ.update(env)
    if cwd is not None:
        os.chdir(cwd)
    sys.argv = ["-c", *argv]
    signal.signal(signal.SIGINT, signal.default_int_handler)
    code: Any = 0
    try:
        exec(compile(source, "<string>", "exec"), {"__name__": "__main__",
                                                    "__builtins__": __builtins__})
    except SystemExit as e:
        code = e.code
    except BaseException:  # what `python -c` does with an uncaught exception
        import traceback

        traceback.print_exc()
        code = 1
    import logging

    logging.shutdown()
    if code is None:
        code = 0
    elif not isinstance(code, int):
        print(code, file=sys.stderr)
        code = 1
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)  # no exit handlers of the server's modules, as a fork's child


def _umask() -> int:
    """The umask now (a test may have set one for its child; the server's is its start's)."""
    old = os.umask(0o022)
    os.umask(old)
    return old


def _arg(a: Any) -> str:
    """An argument as ``subprocess`` takes it: a str or a path (numbers said as str)."""
    return os.fspath(a) if isinstance(a, (str, os.PathLike)) else str(a)


class WarmChild:
    """:class:`subprocess.Popen`'s face over a forkserver child running ``source``."""

    def __init__(self, source: str, args: Sequence[Any] = (), *, cwd: Any = None,
                 env: dict[str, str] | None = None, text: bool = True) -> None:
        self.args = ["-c", source, *map(_arg, args)]
        out_r, out_w = os.pipe()
        err_r, err_w = os.pipe()
        ends = Connection(out_w), Connection(err_w)
        try:
            self._proc = context().Process(
                target=_child, daemon=True,
                args=(source, self.args[2:], None if cwd is None else os.fspath(cwd),
                      dict(os.environ if env is None else env), _umask(), *ends))
            self._proc.start()
        finally:
            for end in ends:
                end.close()
        self.pid: int = self._proc.pid
        self.returncode: int | None = None
        mode = {"encoding": "utf-8", "errors": "replace"} if text else {}
        self.stdout = open(out_r, "r" if text else "rb", **mode)  # noqa: SIM115 (Popen's)
        self.stderr = open(err_r, "r" if text else "rb", **mode)  # noqa: SIM115
        self._text = text
        self._got: dict[int, list[bytes]] = {out_r: [], err_r: []}

    def poll(self) -> int | None:
        if self.returncode is None:
            self.returncode = self._proc.exitcode
        return self.returncode

    def wait(self, timeout: float | None = None) -> int:
        self._proc.join(timeout)
        if self.poll() is None:
            raise subprocess.TimeoutExpired(self.args, timeout)
        return self.returncode  # type: ignore[return-value]

    def send_signal(self, sig: int) -> None:
        if self.poll() is None:
            os.kill(self.pid, sig)

    def kill(self) -> None:
        self.send_signal(signal.SIGKILL)

    def terminate(self) -> None:
        self.send_signal(signal.SIGTERM)

    def communicate(self, input: Any = None, timeout: float | None = None) -> tuple[Any, Any]:
        """Both pipes to their ends, then the exit; TimeoutExpired keeps what came so far."""
        import time

        deadline = None if timeout is None else time.monotonic() + timeout
        streams = [s for s in (self.stdout, self.stderr) if not s.closed]
        with selectors.DefaultSelector() as sel:
            for s in streams:
                sel.register(s.fileno(), selectors.EVENT_READ, s)
            while sel.get_map():
                left = None if deadline is None else deadline - time.monotonic()
                if left is not None and left <= 0:
                    raise subprocess.TimeoutExpired(self.args, timeout)
                for key, _ in sel.select(left):
                    chunk = os.read(key.fd, 1 << 16)
                    if chunk:
                        self._got[key.fd].append(chunk)
                    else:
                        sel.unregister(key.fd)
        got = []
        for s in (self.stdout, self.stderr):
            if not s.closed:
                data = b"".join(self._got[s.fileno()])
                s.close()
                got.append(data.decode("utf-8", "replace") if self._text else data)
            else:
                got.append("" if self._text else b"")
        left = None if deadline is None else max(0.0, deadline - time.monotonic())
        self.wait(left)
        return got[0], got[1]

    def __enter__(self) -> WarmChild:
        return self

    def __exit__(self, *exc: Any) -> None:
        if self.poll() is None:
            self.kill()
        self.communicate()


def popen(source: str, args: Sequence[Any] = (), **kw: Any) -> WarmChild:
    """``subprocess.Popen([sys.executable, "-c", source, *args], ...)``, warm."""
    return WarmChild(source, args, **kw)


def run(source: str, args: Sequence[Any] = (), *, timeout: float | None = None,
        **kw: Any) -> subprocess.CompletedProcess:
    """``subprocess.run([sys.executable, "-c", source, *args], capture_output=True, ...)``."""
    child = WarmChild(source, args, **kw)
    try:
        out, err = child.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        child.kill()
        child.communicate()
        raise
    return subprocess.CompletedProcess(child.args, child.returncode, out, err)


def cli(*argv: Any, **kw: Any) -> subprocess.CompletedProcess:
    """``trtet-store ARGV...`` in a warm child: the CLI's ``main`` as ``python -m`` runs it."""
    return run(CLI, argv, **kw)


def prestart() -> None:
    """Start the server now (it does not wait for its imports): they overlap the tests that
    run before the first child, which then waits only for what is left of them."""
    from multiprocessing import forkserver

    context()
    forkserver.ensure_running()


if not getattr(multiprocessing.current_process(), "_inheriting", False):  # not in a child
    prestart()  # on the first import here, i.e. when a test file using it is collected
