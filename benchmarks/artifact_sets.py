"""Artifact sets (issue 47): bytes in the bucket, on the wire and on disk; per program vs set.

On one SeaweedFS ``weed mini`` on loopback, every request through the
counting proxy (``trtet_store.testing.proxy``: bytes each way, not the
client's own count), with stub files of random bytes standing in for the
programs (``--foundation`` shared, ``--own`` per member):

(a) four LoRA members sharing a foundation ``.ptd``: the bucket's bytes when
    each is published under its own prefix (today) and as one set; then the
    disk used by fetching all four, on XFS (reflinks) and on ext4 (four copies);
(b) three GPU kinds (engines ``--own`` each, shared CPU data ``--foundation``):
    the bucket's bytes, per-program vs set;
(c) a re-publish after one member's engine is rebuilt: bytes sent;
(d) a machine holding member A fetches member B: bytes received;
(e) ``fetch_set`` of one member against ``fetch`` of the same program
    published alone, alternating, ``--repeat`` times: median time ratio.
(f) the same two, each once in a process of its own: peak RSS (the child's
    ``ru_maxrss``) and peak extra disk (``statvfs`` used bytes of the mount,
    sampled every 5 ms while it runs, less the bytes before): the issue's
    bounds are ``fetch``'s RSS and the member's new bytes + 64 MiB.

Disk is ``statvfs`` used bytes on a dedicated loop filesystem (as root), so
shared extents count once::

    sudo .venv/bin/python benchmarks/artifact_sets.py [--foundation 1G] [--own 64M] [--repeat 3]

``--parts`` runs some parts only (``--parts e``: only the sm90 program is
published), ``--fs`` the filesystems of (a), (e) and (f). The issue's (e) is a
member of 2 x 1 GiB: ``--foundation 1G --own 1G --parts e``. Each (e) run
prints its time, the bytes this process read (``rchar``) and made the disk
read, and ``fetch_set``'s download and placement seconds.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import shutil
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

import trtet_store
from trtet_store.bench.config import size_arg
from trtet_store.remote.upload.config import PublishConfig
from trtet_store.testing.loopfs import FilesystemFactory
from trtet_store.testing.proxy import CountingProxy
from trtet_store.testing.s3server import running_server

MiB = 1 << 20


def write(path: Path, size: int, seed: int) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    rnd = random.Random(seed)
    with open(path, "wb") as f:
        left = size
        while left:
            n = min(64 * MiB, left)
            f.write(rnd.randbytes(n))
            left -= n
    return path


def held(client, bucket: str, prefix: str) -> int:
    return sum(o["Size"] for page in client.get_paginator("list_objects_v2").paginate(
        Bucket=bucket, Prefix=prefix) for o in page.get("Contents", []))


def used(path: Path) -> int:
    st = os.statvfs(path)
    return (st.f_blocks - st.f_bfree) * st.f_frsize


def settled_used(path: Path) -> int:
    """``used`` once the filesystem has finished freeing what was removed before.

    XFS frees a removed file's extents in the background (deferred inode
    inactivation): read at once, ``before`` would still count a previous
    run's files, and their release would hide this run's growth.
    """
    os.sync()
    last, same = used(path), 0
    while same < 3:
        time.sleep(0.1)
        now = used(path)
        same, last = (same + 1, now) if now == last else (0, now)
    return last


def _target(got: int, bound: int) -> str:
    return f"<= {mib(bound)}: {'met' if got <= bound else 'MISSED'}"


def mib(n: float) -> str:
    return f"{n / MiB:,.1f} MiB"


def io_counts() -> tuple[int, int]:
    """This process's (rchar, read_bytes): bytes its read calls returned, and bytes it made
    the disk read (all threads; the server's own reads are another process's)."""
    got = dict(line.split(": ") for line in Path("/proc/self/io").read_text().splitlines())
    return int(got["rchar"]), int(got["read_bytes"])


def _time_ratio(bucket: str, endpoint: str, mnt: Path, fstype: str,
                repeat: int) -> tuple[str, str, str, str]:
    """(e): ``fetch_set`` of sm90 (an empty store) against ``fetch`` of it alone, alternating."""
    url1 = f"s3://{bucket}/gpu-per/sm90/model.pte"
    times: dict[str, list[float]] = {"fetch": [], "fetch_set": []}
    for i in range(repeat):
        for kind in times:
            out = mnt / f"e-{kind}-{i}"
            out.mkdir()
            os.sync()  # the previous run's writeback is not this one's
            rchar, disk = io_counts()
            start = time.monotonic()
            if kind == "fetch":
                trtet_store.fetch(url1, out / "model.pte", endpoint_url=endpoint)
                phases = ""
            else:
                rep = trtet_store.fetch_set(f"s3://{bucket}/gpu/", out / "m", "sm90",
                                            store=out / "store", endpoint_url=endpoint)
                phases = (f" (download {rep.seconds_download:.2f} s, place "
                          f"{rep.seconds_place:.2f} s: {rep.placed})")
            took = time.monotonic() - start
            times[kind].append(took)
            rchar2, disk2 = io_counts()
            print(f"  (e) {fstype} run {i} {kind}: {took:.2f} s, read {mib(rchar2 - rchar)} "
                  f"(disk {mib(disk2 - disk)}){phases}", flush=True)
            shutil.rmtree(out)
    fs, f = statistics.median(times["fetch_set"]), statistics.median(times["fetch"])
    return (f"(e) fetch_set / fetch time, {fstype}, {repeat} runs", "", f"{fs / f:.2f}x",
            f"<= 1.10x: {'met' if fs / f <= 1.10 else 'MISSED'} (medians {fs:.2f} s / "
            f"{f:.2f} s; fastest {min(times['fetch_set']):.2f} s / "
            f"{min(times['fetch']):.2f} s)")


#: (f): one fetch in a fresh interpreter, printing its own peak RSS (ru_maxrss, KiB).
_CHILD = """
import json, resource, sys, trtet_store
kind, url, out, endpoint = sys.argv[1:5]
if kind == "fetch":
    trtet_store.fetch(url, out + "/model.pte", endpoint_url=endpoint)
else:
    trtet_store.fetch_set(url, out + "/m", "sm90", store=out + "/store", endpoint_url=endpoint)
print(json.dumps({"maxrss": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024}))
"""


def _peaks(bucket: str, endpoint: str, mnt: Path, fstype: str,
           member: int) -> list[tuple[str, str, str, str]]:
    """(f): peak RSS and peak extra disk of ``fetch_set`` and ``fetch`` of the sm90 program."""
    got: dict[str, tuple[int, int]] = {}
    for kind, url in (("fetch", f"s3://{bucket}/gpu-per/sm90/model.pte"),
                      ("fetch_set", f"s3://{bucket}/gpu/")):
        out = mnt / f"f-{kind}"
        out.mkdir()
        before, peak, done = settled_used(mnt), [0], threading.Event()

        def sample(before: int = before, peak: list[int] = peak,
                   done: threading.Event = done) -> None:
            while not done.wait(0.005):
                peak[0] = max(peak[0], used(mnt) - before)

        sampler = threading.Thread(target=sample, daemon=True)
        sampler.start()
        try:
            proc = subprocess.run([sys.executable, "-c", _CHILD, kind, url, str(out),
                                   endpoint], capture_output=True, text=True, check=True)
        finally:
            done.set()
            sampler.join()
        rss = json.loads(proc.stdout.strip().splitlines()[-1])["maxrss"]
        got[kind] = (rss, peak[0])
        print(f"  (f) {fstype} {kind}: peak RSS {mib(rss)}, peak extra disk {mib(peak[0])}",
              flush=True)
        shutil.rmtree(out)
    (rss_set, disk_set), (rss_one, _) = got["fetch_set"], got["fetch"]
    bound = member + 64 * MiB
    return [(f"(f) peak RSS, {fstype} (fetch / fetch_set)", mib(rss_one), mib(rss_set),
             f"<= fetch's + 64 MiB: {'met' if rss_set <= rss_one + 64 * MiB else 'MISSED'}"),
            (f"(f) peak extra disk, {fstype} (fetch_set)", "", mib(disk_set),
             _target(disk_set, bound) + " (the member + 64 MiB)")]


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--foundation", type=size_arg, default=1 << 30)
    p.add_argument("--own", type=size_arg, default=64 * MiB)
    p.add_argument("--repeat", type=int, default=3)
    p.add_argument("--parts", default="abcdef",
                   help="which parts to run (letters of a-f; default all)")
    p.add_argument("--fs", default="xfs,ext4", help="filesystems of (a) and (e)")
    args = p.parse_args()
    parts, fstypes = set(args.parts), args.fs.split(",")
    F, E = args.foundation, args.own  # noqa: N806 - the issue's letters (W, E)
    work = Path(tempfile.mkdtemp(prefix="trtet-sets-bench-", dir="/var/tmp"))
    rows: list[tuple[str, str, str, str]] = []
    try:
        with running_server() as server, CountingProxy.for_url(server.endpoint.url) as px:
            os.environ.update(server.endpoint.environ())
            client = server.endpoint.client(read_timeout=300)
            bucket = server.new_bucket("bench")
            cfg = PublishConfig(journal_dir=work / "journal")
            ep = px.endpoint_url
            foundation = write(work / "src" / "foundation.ptd", F, 1)
            lora = {f"lora{i}": [write(work / "src" / f"lora{i}" / "model.pte", E, 10 + i),
                                 foundation] for i in range(4)} if "a" in parts else {}
            # (a) in the bucket
            for name, files in lora.items():
                trtet_store.publish(files, f"s3://{bucket}/per/{name}/model.pte",
                                    endpoint_url=ep, config=cfg)
            if lora:
                per = held(client, bucket, "per/")
                trtet_store.publish_set(lora, f"s3://{bucket}/lora/", endpoint_url=ep,
                                        config=cfg)
                got = held(client, bucket, "lora/")
                rows.append(("(a) bucket, 4 LoRA members", mib(per), mib(got),
                             _target(got, F + 4 * E + MiB)))
            # (a) on disk
            factory = FilesystemFactory()
            try:
                for fstype in fstypes if lora else ():
                    mnt = factory.make(fstype, max(600, 2 * (4 * (F + E)) // MiB + 256))
                    before = used(mnt)
                    report = None
                    for name in lora:
                        report = trtet_store.fetch_set(f"s3://{bucket}/lora/", mnt / name, name,
                                                       endpoint_url=ep)
                    disk = used(mnt) - before
                    how = ", ".join(sorted(report.placed)) if report else ""
                    # The bound: one copy where reflinks share it; without
                    # them (ext4, no links) four copies, the store holding none.
                    cloned = report is not None and set(report.placed) == {"clone"}
                    bound = F + 4 * E + MiB if cloned else 4 * (F + E) + MiB
                    rows.append((f"(a) disk after 4 fetches, {fstype} ({how})",
                                 mib(4 * (F + E)), mib(disk),
                                 f"bound {mib(bound)}: "
                                 f"{'met' if disk <= bound else 'not met'}"))
                    factory.release(mnt)
            finally:
                factory.close()
            # (b) three GPU kinds
            gpus = {f"sm{cc}": trtet_store.SetMember(
                [write(work / "src" / f"sm{cc}" / "model.pte", E, cc), foundation],
                compute_capability=f"{cc // 10}.{cc % 10}")
                for cc in ((80, 89, 90) if parts & set("bcd") else (90,))}
            for name, m in gpus.items():
                trtet_store.publish(m.source, f"s3://{bucket}/gpu-per/{name}/model.pte",
                                    endpoint_url=ep, config=cfg)
            per = held(client, bucket, "gpu-per/")
            trtet_store.publish_set(gpus, f"s3://{bucket}/gpu/", endpoint_url=ep, config=cfg)
            got = held(client, bucket, "gpu/")
            if "b" in parts:
                rows.append(("(b) bucket, 3 GPU kinds", mib(per), mib(got),
                             _target(got, F + 3 * E + MiB)))
            if "c" in parts:  # (c) one engine rebuilt
                write(gpus["sm89"].source[0], E, 999)
                px.reset()
                trtet_store.publish_set(gpus, f"s3://{bucket}/gpu/", endpoint_url=ep,
                                        config=cfg, if_exists="replace")
                sent = px.upstream
                rows.append(("(c) re-publish, one engine rebuilt: sent", "", mib(sent),
                             f"<= {mib(E + MiB)}: {'met' if sent <= E + MiB else 'MISSED'}"))
            if "d" in parts:  # (d) holding A, fetch B
                machine = work / "machine"
                machine.mkdir()
                trtet_store.fetch_set(f"s3://{bucket}/gpu/", machine / "a", "sm80",
                                      endpoint_url=ep)
                px.reset()
                trtet_store.fetch_set(f"s3://{bucket}/gpu/", machine / "b", "sm89",
                                      endpoint_url=ep)
                got = px.downstream
                rows.append(("(d) holding A, fetch B: received", "", mib(got),
                             f"<= {mib(E + MiB)}: {'met' if got <= E + MiB else 'MISSED'}"))
            # (e) fetch_set of one member vs fetch of the same program alone, per filesystem
            factory = FilesystemFactory()
            try:
                for fstype in fstypes if parts & set("ef") else ():
                    mnt = factory.make(fstype, max(600, 4 * (F + E) // MiB + 256))
                    if "e" in parts:
                        rows.append(_time_ratio(bucket, server.endpoint.url, mnt, fstype,
                                                args.repeat))
                    if "f" in parts:
                        rows += _peaks(bucket, server.endpoint.url, mnt, fstype, F + E)
                    factory.release(mnt)
            finally:
                factory.close()
    finally:
        shutil.rmtree(work, ignore_errors=True)
    print(f"\nartifact sets: foundation/shared {mib(F)}, own/engine {mib(E)} each; SeaweedFS on "
          "loopback, bytes through the counting proxy")
    print(f"{'what':<44} {'per program':>14} {'set':>12}  target")
    for what, per, got, target in rows:
        print(f"{what:<44} {per:>14} {got:>12}  {target}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
