"""The S3 test server, as the tests import it: :mod:`trtet_store.bench.s3server`.

The launcher (``weed mini`` on free loopback ports, polled until it answers,
stopped by its pid, its sockets removed, a signature-checked credentials
file) lives in the tooling wing so that ``benchmarks/`` can use it without
importing ``tests/``. The fixtures in ``conftest.py`` (``s3_server``, ``s3``,
``s3env``) import it from here and turn a server that cannot start into a
failure (never a skip).
"""

from trtet_store.bench.s3server import (
    ACCESS_KEY,
    REGION,
    SECRET_KEY,
    WEED_VERSION,
    S3Endpoint,
    S3Server,
    S3ServerError,
    free_ports,
    running_server,
    weed_binary,
)

__all__ = ["ACCESS_KEY", "REGION", "SECRET_KEY", "WEED_VERSION", "S3Endpoint", "S3Server",
           "S3ServerError", "free_ports", "running_server", "weed_binary"]
