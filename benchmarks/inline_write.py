"""A file written from memory: io's write_file against one stream and one fsync.

What a safetensors (or any) save of in-memory tensors costs in
``trtet_store.io`` alone, beside the floor of the same bytes written by
``write`` and synced once (what ``safetensors.torch.save_file`` plus an
``fsync`` does). The pieces are ``memoryview`` slices of one buffer, 8 MiB
each, as :mod:`trtet_store.formats` hands in-memory tensors to the writer.
Needs only ``trtet_store.io`` and xxhash (no torch), so it runs on any Linux
machine with the package on ``PYTHONPATH``::

    PYTHONPATH=. python3 benchmarks/inline_write.py DIR [--size-mib 2048] [--repeat 5]

Methods alternate; medians and fastest runs are printed with their ratio.
"""

from __future__ import annotations

import argparse
import os
import statistics
import time
from pathlib import Path

from trtet_store.io import write_file

MiB = 1 << 20
SLICE = 8 * MiB


def stream(path: Path, header: bytes, data: memoryview) -> None:
    with open(path, "wb") as f:
        f.write(header)
        f.write(data)
        f.flush()
        os.fsync(f.fileno())


def ours(path: Path, header: bytes, data: memoryview) -> None:
    pieces = [header, *(data[i:i + SLICE] for i in range(0, len(data), SLICE))]
    write_file(path, pieces)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("directory", type=Path)
    p.add_argument("--size-mib", type=int, default=2048)
    p.add_argument("--repeat", type=int, default=5)
    args = p.parse_args()
    args.directory.mkdir(parents=True, exist_ok=True)
    data = memoryview(bytearray(os.urandom(MiB)) * args.size_mib)
    header = b"{" + b" " * 126 + b"}"
    methods = {"stream + fsync": stream, "io write_file": ours}
    times: dict[str, list[float]] = {m: [] for m in methods}
    for _ in range(args.repeat):
        for name, fn in methods.items():
            path = args.directory / "out.bin"
            with open("/proc/sys/vm/drop_caches", "w") as f:
                os.sync()
                f.write("1")
            start = time.perf_counter()
            fn(path, header, data)
            times[name].append(time.perf_counter() - start)
            os.unlink(path)
    base = times["stream + fsync"]
    for name, runs in times.items():
        print(f"{name:16s} median {statistics.median(runs):6.2f} s  fastest {min(runs):6.2f} s  "
              f"ratio {statistics.median(runs) / statistics.median(base):.2f}x "
              f"(fastest {min(runs) / min(base):.2f}x)  runs {' '.join(f'{t:.2f}' for t in runs)}")


if __name__ == "__main__":
    main()
