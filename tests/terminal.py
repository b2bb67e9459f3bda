"""A command run with its stderr on a pseudo-terminal (a real tty), as a user's shell runs it."""

from __future__ import annotations

import fcntl
import os
import pty
import struct
import subprocess
import termios
import threading
from collections.abc import Mapping, Sequence
from pathlib import Path


def run_on_terminal(command: Sequence[str], *, size: tuple[int, int], cwd: Path,
                    env: Mapping[str, str] | None = None) -> tuple[int, str, str]:
    """Run ``command``, stderr on a pty of ``size`` (rows, columns): (exit code, stdout, stderr).

    A new pty is 0 x 0 unless given a size; tqdm would then draw a bar of nothing.
    """
    master, slave = pty.openpty()
    fcntl.ioctl(slave, termios.TIOCSWINSZ, struct.pack("HHHH", *size, 0, 0))
    chunks: list[bytes] = []

    def drain() -> None:  # the pty's buffer is small: read while the child writes
        while True:
            try:
                data = os.read(master, 65536)
            except OSError:  # EIO: every slave end is closed
                return
            if not data:
                return
            chunks.append(data)

    reader = threading.Thread(target=drain, daemon=True)
    reader.start()
    try:
        done = subprocess.run(list(command), stdout=subprocess.PIPE, stderr=slave, text=True,
                              timeout=300, env=None if env is None else dict(env), cwd=cwd)
    finally:
        os.close(slave)
    reader.join(30)
    os.close(master)
    return done.returncode, done.stdout, b"".join(chunks).decode(errors="replace")
