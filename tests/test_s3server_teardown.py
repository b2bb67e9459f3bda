"""The S3 test server never outlives the process that started it.

A run killed by CI's timeout (SIGKILL, no fixture teardown) once left a
``weed mini`` holding its ports and directory; the server is in a session of
its own, so only ``PR_SET_PDEATHSIG`` (``s3server._die_with_parent``) ties it
to its starter.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

STARTER = """
import sys, time
from pathlib import Path
from trtet_store.testing.s3server import S3Server
server = S3Server(Path(sys.argv[1]))
server.start()
print(server.pid, flush=True)
time.sleep(600)
"""


def _alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as f:
            state = f.read().rsplit(")", 1)[1].split()[0]
    except FileNotFoundError:
        return False
    return state != "Z"


def test_a_killed_starter_takes_its_server_with_it(tmp_path_factory):
    # A short path: the server's sockets live in its directory (108-byte limit).
    directory = Path(tmp_path_factory.mktemp("s3k", numbered=True))
    starter = subprocess.Popen([sys.executable, "-c", STARTER, str(directory)],
                               stdout=subprocess.PIPE, text=True)
    weed = None
    try:
        weed = int(starter.stdout.readline())
        assert _alive(weed)
        starter.send_signal(signal.SIGKILL)  # no teardown runs
        starter.wait(10)
        deadline = time.monotonic() + 20
        while _alive(weed) and time.monotonic() < deadline:
            time.sleep(0.2)
        assert not _alive(weed), f"weed {weed} outlived the process that started it"
    finally:
        if starter.poll() is None:
            starter.kill()
            starter.wait(10)
        if weed is not None and _alive(weed):
            os.kill(weed, signal.SIGKILL)
