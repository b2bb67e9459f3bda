"""The crash tests' helpers under their old name, for the tests that import them from here.

The helpers live by job: the write (:mod:`crash_scenario`), the checks after
recovery (:mod:`crash_verdict`), ways to die (:mod:`crash_dying`) and the
kill tests' child (:mod:`crash_child`). New code imports from those.

Run as a script (``python tests/crashkit.py SCENARIO ROOT``), this is still
the kill child, for callers that start it by this file's path; Python puts
this file's directory on ``sys.path`` then, so the imports below resolve.
"""

from __future__ import annotations

import sys

from crash_child import main as _child_main
from crash_dying import CallHook, die, in_child, power_cut
from crash_scenario import Scenario, content, kill_scenario, tampered, write_pristine
from crash_verdict import Broken, blob_files, check_recovered, collect_dead_store, journal_state
from digests import digest, file_digest

__all__ = [
    "Broken", "CallHook", "Scenario", "blob_files", "check_recovered", "collect_dead_store",
    "content", "die", "digest", "file_digest", "in_child", "journal_state", "kill_scenario",
    "power_cut", "tampered", "write_pristine",
]

if __name__ == "__main__":  # pragma: no cover
    sys.exit(_child_main(sys.argv[1:]))
