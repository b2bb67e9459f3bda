"""A SIGKILL at each phase of ``publish_set`` and inside ``fetch_set`` (issue 47: never a torn set).

The child (``tests/sets_kill_child.py``) is a real process killed with
SIGKILL at the step named: inside a blob's upload (parts sent), right
before the set manifest, right after it (before the clean-up), and inside a
blob's download. After each: the set a reader follows is whole (the previous
version, or the new one once its manifest committed), and running the same
call again finishes it, sending or downloading only what was not done
(counted by the proxy).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from sets_helpers import write, xxh

from trtet_store.io.units import MiB
from trtet_store.remote.upload.config import PublishConfig
from trtet_store.sets import fetch_set, publish_set

HERE = Path(__file__).resolve().parent
SHARED, OWN, NEW = 6 * MiB, MiB + 17, 12 * MiB + 5


def run_child(job: dict) -> subprocess.CompletedProcess:
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(HERE.parent), str(HERE)])}
    return subprocess.run([sys.executable, str(HERE / "sets_kill_child.py"), json.dumps(job)],
                          capture_output=True, text=True, timeout=300, env=env)


def bucket_keys(s3, prefix: str) -> dict[str, int]:
    listed = s3.client.list_objects_v2(Bucket=s3.bucket, Prefix=prefix).get("Contents", [])
    return {o["Key"]: o["Size"] for o in listed}


@pytest.mark.parametrize("phase", ["blobs", "manifest", "cleanup"])
def test_a_publish_killed_at_each_phase_leaves_a_whole_set_and_resumes(s3env, here_fs,
                                                                      proxy, phase):
    url = f"s3://{s3env.bucket}/rel/"
    shared = write(here_fs / "src" / "foundation.ptd", SHARED, 1)
    v1 = {"a": [str(write(here_fs / "v1" / "a" / "model.pte", OWN, 2)), str(shared)],
          "b": [str(write(here_fs / "v1" / "b" / "model.pte", OWN, 3)), str(shared)]}
    cfg = PublishConfig(journal_dir=s3env.journal_dir, part_size=5 << 20, concurrency=1)
    publish_set(v1, url, endpoint_url=s3env.endpoint.url, config=cfg)
    old_b = xxh(Path(v1["b"][0]))
    # v2: member b's engine rebuilt (a bigger file, three parts)
    v2 = {"a": v1["a"], "b": [str(write(here_fs / "v2" / "b" / "model.pte", NEW, 4)),
                              str(shared)]}
    child = run_child({"op": "publish", "phase": phase, "members": v2, "url": url,
                       "endpoint": s3env.endpoint.url, "journal_dir": str(s3env.journal_dir),
                       "if_exists": "replace", "after": 5 * MiB})
    assert child.stdout.strip() == "killed" and child.returncode == -9, child.stderr[-2000:]

    # A reader follows a whole set: v1 until the manifest committed, v2 after.
    committed = phase == "cleanup"
    dest = here_fs / "reader"
    dest.mkdir()
    fetch_set(url, dest / "b", "b", endpoint_url=s3env.endpoint.url)
    want = v2["b"] if committed else v1["b"]
    for f in want:
        assert (dest / "b" / Path(f).name).read_bytes() == Path(f).read_bytes()

    # Again: only what the killed publish did not send goes up, and the clean-up is done.
    proxy.reset()
    report = publish_set(v2, url, endpoint_url=proxy.endpoint_url, config=cfg,
                         if_exists="replace")
    sent = proxy.upstream
    if phase == "blobs":  # the first part (5 MiB) of the new engine was kept by the server
        assert sent <= NEW - 5 * MiB + MiB, sent
    else:
        assert sent <= MiB, sent
    assert report.removed == [old_b]
    keys = bucket_keys(s3env, "rel/")
    assert not [k for k in keys if old_b in k]
    assert sum(keys.values()) <= SHARED + OWN + NEW + MiB
    uploads = s3env.client.list_multipart_uploads(Bucket=s3env.bucket, Prefix="rel/")
    assert uploads.get("Uploads", []) == []
    fetch_set(url, dest / "b2", "b", endpoint_url=s3env.endpoint.url)
    for f in v2["b"]:
        assert (dest / "b2" / Path(f).name).read_bytes() == Path(f).read_bytes()


def test_a_fetch_killed_inside_a_download_resumes_it(s3env, here_fs, proxy):
    url = f"s3://{s3env.bucket}/rel/"
    shared = write(here_fs / "src" / "foundation.ptd", SHARED, 1)
    pte = write(here_fs / "src" / "a" / "model.pte", OWN, 2)
    publish_set({"a": [pte, shared]}, url, endpoint_url=s3env.endpoint.url,
                config=PublishConfig(journal_dir=s3env.journal_dir))
    machine = here_fs / "machine"
    machine.mkdir()
    # model.pte's blob (2 ranges), then 2 ranges of foundation.ptd's: killed there.
    child = run_child({"op": "fetch", "phase": "download", "url": url, "member": "a",
                       "dest": str(machine / "a"), "endpoint": s3env.endpoint.url,
                       "after": 4})
    assert child.stdout.strip() == "killed" and child.returncode == -9, child.stderr[-2000:]
    assert os.listdir(machine / "a") == []  # nothing placed, nothing torn
    proxy.reset()
    report = fetch_set(url, machine / "a", "a", endpoint_url=proxy.endpoint_url,
                       concurrency=1, range_size=MiB)
    got = proxy.downstream
    assert got <= SHARED - 2 * MiB + MiB, got  # foundation's first 2 MiB were kept
    assert report.bytes_in_store == OWN
    assert (machine / "a" / "model.pte").read_bytes() == pte.read_bytes()
    assert (machine / "a" / "foundation.ptd").read_bytes() == shared.read_bytes()
    # ext4: the blob downloaded by the killed fetch was the store's before this one began, so
    # it stays there (copied into place); the one this fetch downloaded was moved into place,
    # and the store keeps a reference to its file.
    store = machine / ".trtet-blobs"
    assert sorted(os.listdir(store)) == sorted([xxh(pte), ".trtet-moving", ".trtet-seals"])
    assert os.listdir(store / ".trtet-moving") == []
    assert sorted(os.listdir(store / ".trtet-seals")) == sorted([xxh(pte), xxh(shared)])
    seal = json.loads((store / ".trtet-seals" / xxh(shared)).read_text())
    assert seal["ref"] == str(machine / "a" / "foundation.ptd")
    assert report.placed == {"copy": OWN, "move": SHARED}
