#!/usr/bin/env python3
"""What freeing a source costs on a disk, alone: the part of a move that the floor never pays.

A move frees every byte it copies (it truncates its source step by step);
the floor of benchmarks/floor_vs_move.py frees nothing. This times, on the
directory given, a synced 2 GiB file cut in 98 steps of 21 MiB (a move's
steps at the default budget), each cut followed by an ``fdatasync`` of a
second file that grows by 4 KiB (so each commits the journal, as a move's
step sync does), uncached and cached; the same syncs without the cuts; and
the unlink of a 2 GiB file. Standard library only.

    python3 benchmarks/free_cost.py DIR [REPEAT=1]
"""
import os
import sys
import time

MiB = 1 << 20
SIZE, STEP = 2048 * MiB, 21 * MiB
BUF = os.urandom(8 * MiB)


def make(path: str) -> int:
    fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_TRUNC, 0o644)
    for off in range(0, SIZE, len(BUF)):
        os.pwrite(fd, BUF, off)
    os.fsync(fd)
    return fd


def run(d: str, cut: bool, cached: bool) -> tuple[float, float, int]:
    """Seconds in the cuts and in the committing syncs, and the number of steps."""
    a, b = os.path.join(d, "a.bin"), os.path.join(d, "b.bin")
    fa = make(a)
    if not cached:
        os.posix_fadvise(fa, 0, 0, os.POSIX_FADV_DONTNEED)
    fb = os.open(b, os.O_RDWR | os.O_CREAT | os.O_TRUNC, 0o644)
    os.sync()
    cuts = syncs = 0.0
    length, n = SIZE, 0
    while length > 0:
        start = max(0, length - STEP)
        if cut:
            t = time.perf_counter()
            os.ftruncate(fa, start)
            cuts += time.perf_counter() - t
        t = time.perf_counter()
        os.pwrite(fb, b"x" * 4096, n * 4096)
        os.fdatasync(fb)
        syncs += time.perf_counter() - t
        length, n = start, n + 1
    os.close(fa)
    os.close(fb)
    os.unlink(a)
    os.unlink(b)
    os.sync()
    return cuts, syncs, n


def main() -> None:
    d = sys.argv[1]
    repeat = int(sys.argv[2]) if len(sys.argv) > 2 else 1
    os.makedirs(d, exist_ok=True)
    for r in range(repeat):
        for cut in (True, False):
            for cached in (False, True):
                cuts, syncs, n = run(d, cut, cached)
                print(f"repeat {r + 1} {'cut + sync' if cut else 'sync only '} "
                      f"{'cached  ' if cached else 'uncached'}: {n} steps, cuts {cuts:.3f} s, "
                      f"committing syncs {syncs:.3f} s", flush=True)
    path = os.path.join(d, "u.bin")
    os.close(make(path))
    os.sync()
    t = time.perf_counter()
    os.unlink(path)
    print(f"unlink of 2 GiB: {time.perf_counter() - t:.3f} s")


if __name__ == "__main__":
    main()
