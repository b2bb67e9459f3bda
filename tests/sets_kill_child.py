"""The set kill tests' child: run publish_set or fetch_set and SIGKILL itself at a phase.

Run as ``python tests/sets_kill_child.py JSON``; JSON says ``op`` (``publish``
or ``fetch``), ``phase`` and the call's arguments. The kill is a real
SIGKILL of this process at the chosen step (nothing is cleaned up, no
``finally`` runs):

- ``blobs``: inside a blob's upload, once ``after`` bytes of it were sent
  (publish's own progress: parts completed and journaled);
- ``manifest``: every blob is in the bucket, right before the set manifest;
- ``cleanup``: the manifest committed, right before the replaced blobs go;
- ``download``: inside a blob's download, after ``after`` ranges were
  written and journaled.
"""

from __future__ import annotations

import json
import os
import signal
import sys


def die(*_args: object, **_kwargs: object) -> None:
    sys.stdout.write("killed\n")
    sys.stdout.flush()
    os.kill(os.getpid(), signal.SIGKILL)


def main() -> None:
    job = json.loads(sys.argv[1])
    import trtet_store.sets.publish as room
    from trtet_store.remote.upload.config import PublishConfig
    from trtet_store.sets import fetch_set, publish_set

    phase = job["phase"]
    if phase == "blobs":
        real = room.publish_blob

        def sending(*args, **kwargs):
            def progress(p):
                if p.sent >= job["after"]:
                    die()
            return real(*args, progress=progress, **kwargs)

        room.publish_blob = sending
    elif phase == "manifest":
        room._commit = die
    elif phase == "cleanup":
        room._remove_unnamed = die
    elif phase == "download":
        from trtet_store.remote.download.staging import Staging

        record = Staging.record
        seen = []

        def recording(self, rng, crc):
            record(self, rng, crc)
            seen.append(rng)
            if len(seen) >= job["after"]:
                die()

        Staging.record = recording
    if job["op"] == "publish":
        publish_set(job["members"], job["url"], endpoint_url=job["endpoint"],
                    config=PublishConfig(journal_dir=job["journal_dir"], part_size=5 << 20,
                                         concurrency=1),
                    if_exists=job.get("if_exists", "error"))
    else:
        fetch_set(job["url"], job["dest"], job["member"], endpoint_url=job["endpoint"],
                  concurrency=1, range_size=1 << 20)
    sys.stdout.write("finished\n")


if __name__ == "__main__":
    main()
