"""``publish_set`` at scale and under races (issue 47): requests per blob, the clean-up, the prune.

Against the real SeaweedFS server. Requests are counted by a recording
pass-through proxy (``tests/conditions_proxy.py`` with nothing ignored): what
the server was asked, never the client's own report. The races are set up
with hooks placed between two steps of one publisher, never left to timing.
"""

from __future__ import annotations

import random
from collections import Counter
from pathlib import Path

from conditions_proxy import ConditionsProxy

from trtet_store.remote.upload.config import PublishConfig
from trtet_store.sets import publish_set

SMALL = 4096 + 17  # a blob of one part


def write(path: Path, size: int, seed: int) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(random.Random(seed).randbytes(size))
    return path


def recording_proxy(s3) -> ConditionsProxy:
    e = s3.endpoint
    return ConditionsProxy(e.url, access_key=e.access_key, secret_key=e.secret_key,
                           region=e.region)


def reads(proxy: ConditionsProxy) -> Counter:
    """The proxy's GETs by kind: a listing (objects or uploads) or an object's GET."""
    kinds: Counter = Counter()
    for seen in proxy.seen():
        if seen.method != "GET":
            continue
        query = seen.target.partition("?")[2]
        listing = "list-type=" in query or "uploads" in query.split("&") or \
            not seen.target.partition("?")[0].strip("/").count("/")
        kinds["list" if listing else "get"] += 1
    return kinds


# --- 1. requests per blob --------------------------------------------------------------------


def _publish_n_blobs(s3env, root: Path, n: int) -> Counter:
    members = {f"m{i}": [write(root / f"m{i}" / "model.pte", SMALL, 100 * n + i)]
               for i in range(n)}
    with recording_proxy(s3env) as proxy:
        publish_set(members, f"s3://{s3env.bucket}/n{n}/", endpoint_url=proxy.url,
                    config=PublishConfig(journal_dir=s3env.journal_dir))
        return reads(proxy)


def test_a_set_publish_reads_a_constant_number_of_objects_per_blob(s3env, tmp_path):
    # The 12-blob set is published after the 3-blob one, under another prefix: each
    # blob's folder holds only its own set's blobs.
    few = _publish_n_blobs(s3env, tmp_path / "few", 3)
    many = _publish_n_blobs(s3env, tmp_path / "many", 12)
    # A constant per blob, plus the set's own: the per-blob figure cannot grow with the
    # count. A scan of blobs/ per blob (a LIST, then a GET of every blob manifest there)
    # is 3 + 3 GETs for 3 blobs and 12 + 66 for 12.
    for kind in ("list", "get"):
        assert many[kind] / 12 <= few[kind] / 3, (kind, few, many)
    assert many["get"] - few["get"] <= 9 * 2, (few, many)  # <= 2 GETs per added blob
    assert many["list"] - few["list"] <= 9 * 1, (few, many)  # <= 1 listing per added blob
