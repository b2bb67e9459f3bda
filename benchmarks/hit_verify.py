#!/usr/bin/env python3
"""What ``EngineCache(verify="full")`` costs per GiB of engine: one read and digest of each hit.

``verify="seal"`` (the default) reads nothing: a hit whose file identity is
the one it was sealed with is served as it is. ``"full"`` reads and digests
every hit's bytes again (io's ``digest_fd``, as ``BlobCache.get`` does). This
times that read of a 1 GiB file on DIR, uncached (the page cache dropped, as
for an entry written long ago) and cached, alternating, and prints the
medians with the fastest beside them. Run as root (it drops the page cache).

    python3 benchmarks/hit_verify.py DIR [RUNS=5]
"""
import os
import statistics
import sys
import time

from trtet_store.io import digest_fd

GiB = 1 << 30


def main() -> None:
    directory, runs = sys.argv[1], int(sys.argv[2]) if len(sys.argv) > 2 else 5
    path = os.path.join(directory, "hit_verify.bin")
    block = os.urandom(8 << 20)
    with open(path, "wb") as f:
        for _ in range(GiB // len(block)):
            f.write(block)
        os.fsync(f.fileno())
    times: dict[str, list[float]] = {"uncached": [], "cached": []}
    try:
        for _ in range(runs):
            for how in times:
                if how == "uncached":
                    os.sync()
                    with open("/proc/sys/vm/drop_caches", "w") as f:
                        f.write("3\n")
                fd = os.open(path, os.O_RDONLY)
                try:
                    t = time.perf_counter()
                    digest_fd(fd, 1 << 20)
                    times[how].append(time.perf_counter() - t)
                finally:
                    os.close(fd)
    finally:
        os.unlink(path)
    print(f"verify='full', extra per GiB of hit ({runs} alternating runs; median, fastest):")
    print("verify='seal': 0 s (no byte read)")
    for how, ts in times.items():
        print(f"verify='full', {how}: {statistics.median(ts):.2f} s ({min(ts):.2f} s)")


if __name__ == "__main__":
    main()
