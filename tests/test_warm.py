"""The warm child helper (tests/warm.py): Popen's face, a separate process, SIGKILL-able."""

from __future__ import annotations

import fcntl
import os
import signal
import subprocess

import pytest
import warm


def test_a_child_says_its_output_exit_code_and_traceback(tmp_path):
    done = warm.run("import sys, os\nprint('out', sys.argv[1:], os.getcwd(), os.environ['X'])\n"
                    "print('err', file=sys.stderr)\nsys.exit(3)\n", ["a", tmp_path],
                    cwd=tmp_path, env={**os.environ, "X": "y"}, timeout=120)
    assert done.returncode == 3, done.stderr
    assert done.stdout == f"out ['a', '{tmp_path}'] {tmp_path} y\n"
    assert done.stderr == "err\n"
    failed = warm.run("raise ValueError('boom')", timeout=120)
    assert failed.returncode == 1
    assert failed.stderr.strip().splitlines()[-1] == "ValueError: boom", failed.stderr
    assert failed.stderr.startswith("Traceback"), failed.stderr


def test_a_child_starts_warm_in_its_own_process_and_dies_by_sigkill(tmp_path):
    lock = tmp_path / "lock"
    fd = os.open(lock, os.O_RDWR | os.O_CREAT, 0o600)
    fcntl.flock(fd, fcntl.LOCK_EX)  # ours: the child must wait for it as another process
    child = warm.popen(
        "import sys, fcntl, os\nprint('torch' in sys.modules, os.getpid(), flush=True)\n"
        "fd = os.open(sys.argv[1], os.O_RDWR)\nfcntl.flock(fd, fcntl.LOCK_EX)\nprint('got')\n",
        [lock])
    line = child.stdout.readline().split()
    assert line == ["True", str(child.pid)] and child.pid != os.getpid()
    with pytest.raises(subprocess.TimeoutExpired):
        child.wait(0.5)  # blocked on our flock: a separate process
    child.send_signal(signal.SIGKILL)
    out, _ = child.communicate(timeout=60)
    assert child.returncode == -signal.SIGKILL and out == ""
    os.close(fd)


def test_nothing_a_child_does_reaches_the_next_one():
    first = warm.run("import trtet_store\ntrtet_store.MARK = 1\nprint(1)", timeout=120)
    assert first.returncode == 0, first.stderr
    second = warm.run("import trtet_store\nprint(hasattr(trtet_store, 'MARK'))", timeout=120)
    assert second.stdout == "False\n", second.stderr


def test_a_child_gets_the_parents_umask_now_not_the_servers():
    old = os.umask(0o077)
    try:
        done = warm.run("import os\nprint(oct(os.umask(0)))", timeout=120)
    finally:
        os.umask(old)
    assert done.stdout == "0o77\n", done.stderr
