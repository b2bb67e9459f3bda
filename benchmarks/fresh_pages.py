#!/usr/bin/env python3
"""What a page the guest freed a while ago costs to touch again, on a VM that reports free pages.

A Firecracker VM (this one and the device) runs with free page reporting
(``/sys/module/page_reporting``): memory the guest frees is, after a while,
handed back to the host, and the guest's next use of it faults in the host.
So a method that reuses pages it just freed (a move truncates its source as
it goes; dropping written-back pages behind a stream) writes into cheap
pages, and one that takes fresh page cache pays the host's faults, and the
floor's own time depends on how long the machine's free memory has lain
idle. This measures that: SIZE_MIB of anonymous memory touched (one write
per page), freed, and touched again after waiting each of WAITS seconds;
alternating waits, medians. Standard library only.

usage: python3 fresh_pages.py [SIZE_MIB=1024] [REPEAT=5] [WAITS=0,0.5,3,10]
"""
import mmap
import statistics
import sys
import time
from pathlib import Path

SIZE = (int(sys.argv[1]) if len(sys.argv) > 1 else 1024) << 20
REPEAT = int(sys.argv[2]) if len(sys.argv) > 2 else 5
WAITS = [float(w) for w in (sys.argv[3] if len(sys.argv) > 3 else "0,0.5,3,10").split(",")]
PAGE = mmap.PAGESIZE


def touch() -> float:
    """Map SIZE bytes, write one byte per page, unmap; seconds for the writes."""
    m = mmap.mmap(-1, SIZE)
    ones = b"\1" * (SIZE // PAGE)
    t = time.perf_counter()
    m[::PAGE] = ones
    took = time.perf_counter() - t
    m.close()
    return took


def reporting() -> str:
    """The kernel's free page reporting settings, as one line."""
    d = Path("/sys/module/page_reporting/parameters")
    if not d.is_dir():
        return "free page reporting: not in this kernel"
    return "free page reporting: " + ", ".join(
        f"{p.name}={p.read_text().strip()}" for p in sorted(d.iterdir()))


runs: dict[float, list[float]] = {w: [] for w in WAITS}
for r in range(REPEAT):
    for w in WAITS if r % 2 == 0 else WAITS[::-1]:
        touch()  # the pages are in the guest's free lists now
        time.sleep(w)
        runs[w].append(touch())
        print(f"repeat {r + 1} wait {w:g} s: {runs[w][-1]:.2f} s", flush=True)
print(reporting())
for w, ts in runs.items():
    print(f"after {w:g} s idle: median {statistics.median(ts):.2f} s, fastest {min(ts):.2f} s "
          f"for {SIZE >> 20} MiB, runs {[round(t, 2) for t in ts]}")
