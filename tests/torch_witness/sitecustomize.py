"""Put first on PYTHONPATH by tests/lanes.py: a child interpreter of a test that imports
torch or executorch writes one line to the file named by TRTET_TORCH_WITNESS, so that an
unmarked test whose children load ExecuTorch fails (see lanes.py). It imports nothing
and changes no import."""

import os
import sys

_WITNESS = os.environ.get("TRTET_TORCH_WITNESS")


class _Witness:
    @staticmethod
    def find_spec(name, path=None, target=None):
        if name in ("torch", "executorch") and _WITNESS:
            line = f"{name} (pid {os.getpid()}: {' '.join(sys.argv)[:300]!r})\n"
            try:
                fd = os.open(_WITNESS, os.O_WRONLY | os.O_APPEND | os.O_NOFOLLOW)
                try:
                    os.write(fd, line.encode("utf-8", "replace"))
                finally:
                    os.close(fd)
            except OSError:
                pass
        return None


if _WITNESS:
    sys.meta_path.insert(0, _Witness)
