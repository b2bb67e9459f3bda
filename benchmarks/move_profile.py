#!/usr/bin/env python3
"""Where a move's and a copy's time goes, phase by phase and call by call, beside the floor.

Each engine system call goes through ``trtet_store.io.fs.calls`` (as
tests/faults.py wraps them for fault injection); this harness wraps every
entry with a timer, and the write transaction's steps (``validate`` ...
``place``, ``publish``, ``release``) with a phase label, so each call's time
is booked to the step it ran in. Digesting is timed by wrapping the
``chunk_digest`` that :mod:`trtet_store.io.transfer` verifies with. Nothing
in ``trtet_store.io`` is changed to measure it. Where the transfer runs
work in a background thread, the time the caller waits for it is booked as
``wait for the background``.

Methods, alternating in each repeat (the order reversed every other one):

- ``floor``: each staged payload streamed once into one new file, 8 MiB
  ``pread``/``pwrite`` windows, writeback started per window
  (``sync_file_range(WRITE)``), one ``fdatasync``: benchmarks/write_floor.py's
  floor, through ``fs.calls`` so its calls are timed the same way;
- ``plain``: the same stream without write-behind;
- ``move`` / ``copy``: ``write_file(out, [header, *blobs], consume=...,
  placements=(method,))``, then an ``fsync`` of the output, as
  ../shared/tools/floor_vs_move.py times them.

The floor of a run set is the faster of the two streams' medians. The header
is ``--header`` bytes (default 128, ExecuTorch's alignment: no placement can
share extents, so every method reads and writes every byte). Blobs are
staged fresh for every method and run (the store writes them behind and
drops them); *uncached* drops them from the page cache again (and the loop
image under them, where there is one) before the method; *cached* reads them
in. Per (phase, call): the median over the repeats of the seconds spent
inside that call, and its count; ``rest`` is a phase's wall time minus its
calls (Python, memory copies of ``bytes`` joins, and what the calls do not
cover). Calls made in another thread are listed as ``call [thread]``; their
time overlaps the main thread's.

Standard library, ``trtet_store.io`` and xxhash only (``--filesystems``
makes dedicated loop filesystems with ``trtet_store.testing.loopfs``, as root).

    sudo .venv/bin/python benchmarks/move_profile.py /mnt/disk/dir          # a directory
    sudo .venv/bin/python benchmarks/move_profile.py --filesystems ext4,xfs --size-mib 512
"""

from __future__ import annotations

import argparse
import contextlib
import ctypes
import json
import os
import statistics
import sys
import threading
import time
from collections import defaultdict
from collections.abc import Callable, Iterator
from pathlib import Path

from trtet_store.bench.methods import set_cached
from trtet_store.io import BlobStore, fs, transfer, write_file
from trtet_store.io.transaction import Transaction
from trtet_store.io.units import MiB

WINDOW = 8 * MiB
METHODS = ("floor", "plain", "move", "copy")
STEPS = ("validate", "lock_destinations", "choose_placements", "preflight", "digest_sources",
         "sync_sources", "write_journal", "create_temps", "place", "publish", "release")
PHASE_ORDER = ("stream", *STEPS, "after", "-")
WALL = "[wall]"

_libc = ctypes.CDLL(None, use_errno=True)


def syncfs(path: Path) -> None:
    """Write back the filesystem holding ``path`` (not the whole machine's, as sync would)."""
    fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY)
    try:
        if _libc.syncfs(fd) != 0:
            err = ctypes.get_errno()
            raise OSError(err, os.strerror(err))
    finally:
        os.close(fd)


class Profile:
    """Seconds and counts per (phase, call) while installed."""

    def __init__(self) -> None:
        self.seconds: dict[tuple[str, str], float] = defaultdict(float)
        self.counts: dict[tuple[str, str], int] = defaultdict(int)
        self.phase = "-"
        self._main = threading.main_thread()

    def book(self, name: str, seconds: float) -> None:
        if threading.current_thread() is not self._main:
            name += " [thread]"
        key = (self.phase, name)
        self.seconds[key] += seconds
        self.counts[key] += 1

    def _timed(self, name: str, real: Callable) -> Callable:
        def call(*args, **kwargs):
            t0 = time.perf_counter()
            try:
                return real(*args, **kwargs)
            finally:
                self.book(name, time.perf_counter() - t0)
        return call

    @contextlib.contextmanager
    def phase_of(self, phase: str) -> Iterator[None]:
        outer, self.phase = self.phase, phase
        t0 = time.perf_counter()
        try:
            yield
        finally:
            self.seconds[(phase, WALL)] += time.perf_counter() - t0
            self.counts[(phase, WALL)] += 1
            self.phase = outer

    def _step(self, name: str, real: Callable) -> Callable:
        def step(tx, *args, **kwargs):
            with self.phase_of(name):
                return real(tx, *args, **kwargs)
        return step

    @contextlib.contextmanager
    def installed(self) -> Iterator[Profile]:
        saved_calls = {name: getattr(fs.calls, name) for name in fs.NAMES}
        saved_steps = {name: getattr(Transaction, name) for name in STEPS}
        saved_digest = transfer.chunk_digest
        # Where the transfer runs work in background threads, the time the
        # caller waits for it (their own calls are booked "[thread]"): the
        # copy's _Behind.wait, the move's _MoveStages.wait_for_room and finish.
        waits = [(cls, name) for cls, name in ((getattr(transfer, "_Behind", None), "wait"),
                                              (getattr(transfer, "_MoveStages", None),
                                               "wait_for_room"),
                                              (getattr(transfer, "_MoveStages", None), "finish"))
                 if cls is not None and hasattr(cls, name)]
        saved_waits = [getattr(cls, name) for cls, name in waits]
        try:
            for (cls, name), real in zip(waits, saved_waits, strict=True):
                setattr(cls, name, self._timed("wait for the background", real))
            for name, real in saved_calls.items():
                setattr(fs.calls, name, self._timed(name, real))
            for name, real in saved_steps.items():
                setattr(Transaction, name, self._step(name, real))
            transfer.chunk_digest = self._timed("digest", saved_digest)
            yield self
        finally:
            for name, real in saved_calls.items():
                setattr(fs.calls, name, real)
            for name, real in saved_steps.items():
                setattr(Transaction, name, real)
            transfer.chunk_digest = saved_digest
            for (cls, name), real in zip(waits, saved_waits, strict=True):
                setattr(cls, name, real)

    def table(self) -> dict[str, dict[str, float]]:
        """``{"phase / call": {"s": seconds, "n": count}}``, with each phase's ``rest``."""
        rows: dict[str, dict[str, float]] = {}
        for phase in sorted({p for p, _ in self.seconds}, key=_phase_rank):
            keys = sorted((k for k in self.seconds if k[0] == phase and k[1] != WALL),
                          key=lambda k: -self.seconds[k])
            wall = self.seconds.get((phase, WALL))
            for key in keys:
                rows[f"{phase} / {key[1]}"] = {"s": self.seconds[key], "n": self.counts[key]}
            if wall is not None:
                inside = sum(self.seconds[k] for k in keys if not k[1].endswith("[thread]"))
                rows[f"{phase} / rest"] = {"s": wall - inside, "n": 0}
                rows[f"{phase} / {WALL}"] = {"s": wall, "n": self.counts[(phase, WALL)]}
        return rows


def _phase_rank(phase: str) -> int:
    return PHASE_ORDER.index(phase) if phase in PHASE_ORDER else len(PHASE_ORDER)


def stage(store: BlobStore, payloads: int, size: int, seed: bytes) -> list:
    """``payloads`` blobs of ``size`` bytes, every window different (no dedup can flatter)."""
    blobs = []
    for i in range(payloads):
        with store.writer() as w:
            for k in range(size // WINDOW):
                w.write(seed[:16] + i.to_bytes(4, "little") + k.to_bytes(8, "little")
                        + seed[28:])
        blobs.append(w.blob)
    return blobs


def stream(prof: Profile, blobs: list, out: Path, header: int, behind: bool) -> None:
    """The floor: every payload streamed once behind ``header`` bytes, one fdatasync."""
    c = fs.calls
    with prof.phase_of("stream"):
        fd = c.open(os.fspath(out), os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644)
        try:
            fs.pwrite_all(fd, b"H" * header, 0)
            off = header
            for b in blobs:
                src = c.open(os.fspath(b), os.O_RDONLY)
                try:
                    pos = 0
                    while data := c.pread(src, WINDOW, pos):
                        fs.pwrite_all(fd, data, off)
                        if behind:
                            c.sync_file_range(fd, off, len(data), fs.SYNC_FILE_RANGE_WRITE)
                        off += len(data)
                        pos += len(data)
                finally:
                    c.close(src)
            c.fdatasync(fd)
        finally:
            c.close(fd)


def place(prof: Profile, blobs: list, out: Path, header: int, method: str,
          chunk: int | None) -> None:
    write_file(out, [b"H" * header, *blobs], consume=method == "move", placements=(method,),
               chunk_size=chunk)
    with prof.phase_of("after"):
        fd = fs.calls.open(os.fspath(out), os.O_RDONLY)
        fs.calls.fsync(fd)
        fs.calls.close(fd)


def run_set(d: Path, *, methods: tuple[str, ...], cached: bool, size: int, payloads: int,
            repeat: int, header: int, chunk: int | None,
            log: Callable[[str], None] = print) -> dict:
    """Every method ``repeat`` times, alternating, in ``d``: seconds and profiles per run."""
    seed = os.urandom(WINDOW)
    runs: dict[str, list[dict]] = {m: [] for m in methods}
    with BlobStore(d / "staging") as store:
        for r in range(repeat):
            order = methods if r % 2 == 0 else tuple(reversed(methods))
            for m in order:
                blobs = stage(store, payloads, size, seed)
                out = d / f"out-{m}.bin"
                set_cached([Path(b.path) for b in blobs], cached)
                syncfs(d)
                prof = Profile()
                with prof.installed():
                    t0 = time.perf_counter()
                    if m in ("floor", "plain"):
                        stream(prof, blobs, out, header, behind=m == "floor")
                    else:
                        place(prof, blobs, out, header, m, chunk)
                    seconds = time.perf_counter() - t0
                runs[m].append({"seconds": seconds, "profile": prof.table()})
                log(f"  {'cached' if cached else 'uncached'} {m}: {seconds:.2f} s")
                os.unlink(out)
                for b in blobs:
                    with contextlib.suppress(Exception):
                        b.close()
                syncfs(d)
    return runs


def summarize(runs: dict[str, list[dict]]) -> dict:
    """Medians per method and per (phase, call), the floor and the ratios to it."""
    med = {m: statistics.median(r["seconds"] for r in rs) for m, rs in runs.items() if rs}
    fastest = {m: min(r["seconds"] for r in rs) for m, rs in runs.items() if rs}
    streams = [m for m in ("floor", "plain") if m in med]
    floor = min(med[m] for m in streams) if streams else None
    floor_fastest = min(fastest[m] for m in streams) if streams else None
    profile: dict[str, dict[str, dict[str, float]]] = {}
    for m, rs in runs.items():
        keys = dict.fromkeys(k for r in rs for k in r["profile"])
        profile[m] = {k: {"s": statistics.median(r["profile"].get(k, {"s": 0.0})["s"] for r in rs),
                          "n": rs[0]["profile"].get(k, {"n": 0})["n"]} for k in keys}
    return {"median_s": med, "fastest_s": fastest, "floor_s": floor,
            "floor_fastest_s": floor_fastest,
            "ratio": {m: med[m] / floor for m in med} if floor else {},
            "fastest_ratio": {m: fastest[m] / floor_fastest for m in fastest}
            if floor_fastest else {},
            "every_run_s": {m: [round(r["seconds"], 3) for r in rs] for m, rs in runs.items()},
            "profile": profile}


def print_summary(label: str, s: dict) -> None:
    print(f"\n### {label}\n")
    print("| method | median s | x floor | fastest s | x fastest floor | every run, s |")
    print("|---|---|---|---|---|---|")
    for m, t in s["median_s"].items():
        print(f"| {m} | {t:.2f} | {s['ratio'].get(m, 0):.2f}x | {s['fastest_s'][m]:.2f} "
              f"| {s['fastest_ratio'].get(m, 0):.2f}x "
              f"| {' '.join(f'{x:.2f}' for x in s['every_run_s'][m])} |")
    methods = [m for m in ("move", "copy", "floor", "plain") if m in s["profile"]]
    keys = list(dict.fromkeys(k for m in methods for k in s["profile"][m]))
    keys.sort(key=lambda k: _phase_rank(k.split(" / ")[0]))
    print("\n| phase / call | " + " | ".join(f"{m} s (calls)" for m in methods) + " |")
    print("|---|" + "---|" * len(methods))
    walls = {k.split(" / ")[0]: max(s["profile"][m].get(k, {"s": 0.0})["s"] for m in methods)
             for k in keys if k.endswith(WALL)}
    for k in keys:
        if walls.get(k.split(" / ")[0], 1.0) < 0.0005:
            continue  # a step that took no time worth a row
        cells = []
        for m in methods:
            v = s["profile"][m].get(k)
            if v is None or (v["s"] < 0.0005 and k.split(" / ")[1] not in (WALL, "rest")):
                cells.append("")
            else:
                cells.append(f"{v['s']:.3f}" + (f" ({v['n']})" if v["n"] else ""))
        if any(cells):
            print(f"| {k} | " + " | ".join(cells) + " |")


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("dir", nargs="?", type=Path, help="a directory on the disk to measure")
    p.add_argument("--filesystems", default="",
                   help="comma list (ext4,xfs): dedicated loop filesystems instead of DIR (root)")
    p.add_argument("--cache", default="uncached,cached")
    p.add_argument("--methods", default=",".join(METHODS))
    p.add_argument("--size-mib", type=int, default=1024)
    p.add_argument("--payloads", type=int, default=2)
    p.add_argument("--repeat", type=int, default=5)
    p.add_argument("--header", type=int, default=128)
    p.add_argument("--chunk-mib", type=int, default=None, help="chunk_size (the move's budget)")
    p.add_argument("--json", type=Path, default=None)
    args = p.parse_args(argv)
    methods = tuple(m for m in args.methods.split(",") if m)
    if unknown := set(methods) - set(METHODS):
        p.error(f"unknown methods {sorted(unknown)}")
    if not args.dir and not args.filesystems:
        p.error("give a directory or --filesystems")
    kw = dict(methods=methods, size=args.size_mib * MiB, payloads=args.payloads,
              repeat=args.repeat, header=args.header,
              chunk=args.chunk_mib * MiB if args.chunk_mib else None)
    results = {}
    states = [c for c in args.cache.split(",") if c]
    if args.filesystems:
        from trtet_store.testing import loopfs
        with loopfs.FilesystemFactory() as factory:
            for fstype in args.filesystems.split(","):
                mib = 3 * args.payloads * args.size_mib + 1024
                for state in states:
                    mnt = factory.make(fstype, mib)
                    try:
                        print(f"== {fstype} (loop), {state}", flush=True)
                        results[f"{fstype} {state}"] = summarize(
                            run_set(mnt, cached=state == "cached", **kw))
                    finally:
                        factory.release(mnt)
    else:
        args.dir.mkdir(parents=True, exist_ok=True)
        for state in states:
            print(f"== {args.dir}, {state}", flush=True)
            results[f"{args.dir} {state}"] = summarize(
                run_set(args.dir, cached=state == "cached", **kw))
    for label, s in results.items():
        print_summary(f"{label}: {args.payloads} x {args.size_mib} MiB, header {args.header}, "
                      f"medians of {args.repeat}", s)
    if args.json:
        args.json.write_text(json.dumps(results, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
