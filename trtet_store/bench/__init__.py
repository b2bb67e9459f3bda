"""Peak-disk benchmark: ExecuTorch's own save against trtet_store, side by side.

The benchmark builds a real ExecuTorch program whose delegates carry large
file-backed payloads (engine-sized blobs staged in a :class:`~trtet_store.io.BlobStore`,
handed to ExecuTorch as ``FileBackedData`` named data), then writes it with
each method on one filesystem, in one run:

``executorch``
    ExecuTorch's ``program.save(pte)`` plus ``write_tensor_data_to_file(dir)``
    (a Python read/write copy, no fsync, errors in ``save`` only logged).
``copy``, ``clone``
    trtet_store's transactional write with ``consume=False`` (the payloads
    stay intact), limited to that placement.
``move``, ``insert``
    The same with ``consume=True``, the payloads staged as owned blobs on the
    output's filesystem (a move goes back to front, one chunk at a time; an
    insert renames a payload into place and makes room for the header).

A zero-copy placement the filesystem cannot do (clone on ext4, insert on
btrfs) is tried once, reported as ``unavailable`` with the io layer's reason,
and not repeated.

Per method and repeat it records peak extra disk (``statvfs`` polled in a
thread, sampled after every step), bytes written (``/proc/self/io``), wall
seconds (and seconds until the data is durable), and peak RSS. As root it
measures on a dedicated loop-mounted filesystem (or tmpfs) of the chosen type,
made for the run and torn down afterwards; otherwise, or with
``filesystem="here"``, in a temporary directory on the current filesystem,
and the result says so.

Library code only: :mod:`trtet_store.cli` is the command line. Heavy imports
(torch, executorch, matplotlib) happen inside the functions that need them.

Example::

    from trtet_store import bench
    result = bench.run_bench(bench.BenchConfig(payload_size=64 << 20, repeat=1))
    print(bench.format_table(result))
    bench.write_json(result, "bench.json")
    bench.plot(result, "bench.png")
"""

from __future__ import annotations

from trtet_store.bench.config import (
    BACKEND_ID,
    CONSUMING,
    FILESYSTEMS,
    LAYOUTS,
    METHOD_LABELS,
    METHODS,
    PTD_TAG,
    PTE_NAME,
    BenchConfig,
    BenchError,
    BenchProgress,
    ProgressFn,
    add_arguments,
    comma_list,
    format_size,
    parse_size,
    require_root,
)
from trtet_store.bench.plot import plot
from trtet_store.bench.program import build_program
from trtet_store.bench.report import format_failures, format_table, write_json
from trtet_store.bench.results import METRICS, RUN_FIELDS, BenchFilesystem, BenchResult, RunResult
from trtet_store.bench.runner import run_bench
from trtet_store.bench.where import bench_filesystem

__all__ = [
    "BACKEND_ID",
    "CONSUMING",
    "FILESYSTEMS",
    "LAYOUTS",
    "METHODS",
    "METHOD_LABELS",
    "METRICS",
    "PTD_TAG",
    "PTE_NAME",
    "RUN_FIELDS",
    "BenchConfig",
    "BenchError",
    "BenchFilesystem",
    "BenchProgress",
    "BenchResult",
    "ProgressFn",
    "RunResult",
    "add_arguments",
    "bench_filesystem",
    "build_program",
    "comma_list",
    "format_failures",
    "format_size",
    "format_table",
    "parse_size",
    "plot",
    "require_root",
    "run_bench",
    "write_json",
]
