"""The kill tests' child: stage a scenario's blobs, write, and say on stdout how far it got.

Run as ``python -m crash_child SCENARIO_JSON ROOT`` with the tests directory
on ``PYTHONPATH`` (:func:`spawn` does both). It prints one line per event,
and the parent SIGKILLs it at a random moment:

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

import errno
import os
import subprocess
import sys
from pathlib import Path

from crash_scenario import Scenario

from trtet_store.io import journal

READY, ROLLBACK, DONE, FAILED = "ready", "rollback", "done", "failed"
#: The exit status after ``failed``.
FAILED_STATUS = 3
#: Journal states a write records when it starts undoing itself.
UNDOING = frozenset({journal.UNPUBLISHING, journal.ROLLING_BACK})

_TESTS = Path(__file__).resolve().parent


def spawn(scenario_file: os.PathLike | str, root: os.PathLike | str) -> subprocess.Popen:
    """Start the child on ``scenario_file`` (a :meth:`Scenario.to_json`) under ``root``.

    Its stdout and stderr are pipes of text; the tests directory goes on its
    ``PYTHONPATH`` so that it imports the test helpers as the tests do.
    """
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(
        p for p in (os.fspath(_TESTS), env.get("PYTHONPATH")) if p)
    return subprocess.Popen(
        [sys.executable, "-m", "crash_child", os.fspath(scenario_file), os.fspath(root)],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env)


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
