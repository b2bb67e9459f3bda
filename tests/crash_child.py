"""The kill tests' child: stage a scenario's blobs, write, and say on stdout how far it got.

Run as ``python -m crash_child SCENARIO_JSON ROOT`` with the tests directory
on ``PYTHONPATH``, or forked from the test process by :func:`spawn`. It prints one
line per event, and the parent SIGKILLs it at a random moment:

- ``ready``: the blobs are staged and synced; the write starts now.
- ``rollback``: the write failed and its journal now records that it is
  undoing itself (``unpublishing`` or ``rolling_back``): what recovery reads.
- ``done``: the write returned (exit status 0).
- ``failed <exception type> <errno> <errno name> <rolled-back|journal-left>``:
  the write raised; ``rolled-back`` if it left no journal behind, that is,
  its rollback completed (exit status 3).

Nothing here reads the writer's log: a renamed log message must not make a
rollback go unseen.
"""

from __future__ import annotations

import contextlib
import errno
import os
import signal
import subprocess
import sys
import time
import traceback
from collections.abc import Callable
from pathlib import Path

from crash_scenario import Scenario

from trtet_store.io import journal

READY, ROLLBACK, DONE, FAILED = "ready", "rollback", "done", "failed"
#: The exit status after ``failed``.
FAILED_STATUS = 3
#: Journal states a write records when it starts undoing itself.
UNDOING = frozenset({journal.UNPUBLISHING, journal.ROLLING_BACK})
#: A journal state at whose (durable) mark the child says ``held`` and waits to be
#: killed: set by a forked child's ``before`` hook, so one kill lands there for sure.
HOLD_IN: str | None = None
HELD = "held"

_TESTS = Path(__file__).resolve().parent


class Forked:
    """A child forked from the test process running ``target()``: Popen's face for the kill tests.

    The kill tests start one child per kill; a fresh interpreter's start-up was most of
    each child's time. A fork is still another process: its own locks and open files,
    which a SIGKILL takes with it. ``stdout`` and ``stderr`` are pipes read as text;
    ``target``'s return value is the exit status, and the child leaves by ``os._exit``
    (never back into pytest, whatever happens).
    """

    def __init__(self, target: Callable[[], int | None]) -> None:
        out_r, out_w = os.pipe()
        err_r, err_w = os.pipe()
        pid = os.fork()
        if pid == 0:  # pragma: no cover - the child
            status = 1
            try:
                os.close(out_r)
                os.close(err_r)
                os.dup2(out_w, 1)
                os.dup2(err_w, 2)
                sys.stdout = open(1, "w", buffering=1, closefd=False)  # noqa: SIM115
                sys.stderr = open(2, "w", buffering=1, closefd=False)  # noqa: SIM115
                status = target() or 0
            except SystemExit as exc:
                status = exc.code if isinstance(exc.code, int) else 1
            except BaseException:
                traceback.print_exc()
            finally:
                with contextlib.suppress(Exception):
                    sys.stdout.flush()
                    sys.stderr.flush()
                os._exit(status)
        os.close(out_w)
        os.close(err_w)
        self.pid = pid
        self.stdout = open(out_r, encoding="utf-8")  # noqa: SIM115
        self.stderr = open(err_r, encoding="utf-8")  # noqa: SIM115
        self.returncode: int | None = None

    def _reaped(self, flags: int) -> int | None:
        if self.returncode is None:
            pid, status = os.waitpid(self.pid, flags)
            if pid:
                self.returncode = os.waitstatus_to_exitcode(status)
        return self.returncode

    def poll(self) -> int | None:
        return self._reaped(os.WNOHANG)

    def wait(self, timeout: float | None = None) -> int:
        """The exit status (``-signal`` if killed); ``timeout`` is a hang guard only."""
        deadline = None if timeout is None else time.monotonic() + timeout
        while self.poll() is None:
            if deadline is not None and time.monotonic() > deadline:
                raise subprocess.TimeoutExpired(f"forked child {self.pid}", timeout)
            time.sleep(0.01)
        return self.returncode

    def kill(self) -> None:
        if self.returncode is None:
            with contextlib.suppress(ProcessLookupError):
                os.kill(self.pid, signal.SIGKILL)

    def communicate(self) -> tuple[str, str]:
        out = self.stdout.read()
        err = self.stderr.read()
        self.stdout.close()
        self.stderr.close()
        self.wait()
        return out, err


def spawn(scenario_file: os.PathLike | str, root: os.PathLike | str,
          before: Callable[[], None] | None = None) -> Forked:
    """Start the child on ``scenario_file`` (a :meth:`Scenario.to_json`) under ``root``.

    ``before``, if given, runs in the child first (a hook on ``fs.calls``, say).
    """
    def target() -> int:
        if before is not None:
            before()
        return main([os.fspath(scenario_file), os.fspath(root)])

    return Forked(target)


def _say(word: str) -> None:
    print(word, flush=True)


def _announce_undoing() -> None:
    """Say ``rollback`` once, as soon as the journal durably records an undoing state.

    The journal's state is what recovery acts on, so it is the structural
    sign of a rollback; the announcement comes after the mark is durable, so
    a kill after it finds the journal undoing (or gone, once the rollback
    completed).
    """
    real_mark = journal.Journal.mark
    said = False

    def mark(self: journal.Journal, state: str) -> None:
        nonlocal said
        real_mark(self, state)
        if state in UNDOING and not said:
            said = True
            _say(ROLLBACK)
        if state == HOLD_IN:  # a kill test's set state: the mark is durable, nothing moves
            _say(HELD)
            time.sleep(600)

    journal.Journal.mark = mark  # this process only: it exists to run one write


def main(argv: list[str]) -> int:  # pragma: no cover - runs in a subprocess
    """Stage, write, report; see the module's docstring."""
    scn = Scenario.from_json(Path(argv[0]).read_text())
    root = Path(argv[1])
    staging, out, user = root / "staging", root / "out", root / "user"
    _announce_undoing()
    _store, blobs = scn.stage(staging)
    for blob in blobs:  # built long ago: the kills should land in the write, not in its sync
        fd = os.open(blob.path, os.O_RDONLY)
        os.fdatasync(fd)
        os.close(fd)
    _say(READY)
    try:
        scn.write(out, user, blobs)
    except OSError as exc:
        undone = "journal-left" if journal.journals_in(out) else "rolled-back"
        _say(f"{FAILED} {type(exc).__name__} {exc.errno} "
             f"{errno.errorcode.get(exc.errno, '?')} {undone}")
        # Leave like a killed child would: the store's exit handlers would
        # release the blobs, and the parent wants to see them restored.
        os._exit(FAILED_STATUS)
    _say(DONE)
    return 0


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main(sys.argv[1:]))
