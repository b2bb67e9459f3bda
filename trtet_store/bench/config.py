"""What to benchmark: sizes, the method and filesystem names, :class:`BenchConfig`.

Also the command-line options of ``trtet-store bench`` (:func:`add_arguments`)
and the way back from them (:meth:`BenchConfig.from_args`), so the defaults
live here only.
"""

from __future__ import annotations

import argparse
import inspect
import os
import sys
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, NamedTuple

from trtet_store.io.units import PAGE, MiB, format_size, parse_size

#: The methods compared, in table order; ``executorch`` is the baseline of every ratio.
METHODS: tuple[str, ...] = ("executorch", "copy", "clone", "move", "insert")
METHOD_LABELS: dict[str, str] = {
    "executorch": "ExecuTorch save",
    "copy": "trtet_store copy",
    "clone": "trtet_store clone",
    "move": "trtet_store move",
    "insert": "trtet_store insert",
}
#: The methods that use the staged payloads up (``consume=True``).
CONSUMING: frozenset[str] = frozenset({"move", "insert"})
#: ``here`` is a temporary directory on the current filesystem (no mount).
FILESYSTEMS: tuple[str, ...] = ("ext4", "xfs", "btrfs", "tmpfs", "here")
LAYOUTS: tuple[str, ...] = ("split", "pte", "ptd")
#: Named-data tag of the payloads that go to a ``.ptd`` (``engines.ptd``).
PTD_TAG = "engines"
PTE_NAME = "model.pte"
BACKEND_ID = "TrtetBenchBackend"
#: Where ``trtet-store bench`` writes its JSON and plot unless told otherwise.
DEFAULT_OUT_DIR = Path("bench-out")

class BenchProgress(NamedTuple):
    """What a benchmark progress callback receives: ``done`` of ``total`` bytes of ``phase``."""

    phase: str
    done: int
    total: int


#: ``progress(update)`` with a :class:`BenchProgress`; the old
#: ``progress(phase, done, total)`` is still accepted (see :func:`phase_progress`).
ProgressFn = Callable[[BenchProgress], Any] | Callable[[str, int, int], Any]


def phase_progress(callback: ProgressFn | None) -> Callable[[str, int, int], None] | None:
    """A function ``(phase, done, total)`` that calls ``callback`` in the shape it takes.

    The rule of :func:`trtet_store.io.options.progress_caller`, decided once:
    a callable that needs three positional arguments (the old form, kept for
    one release) gets ``(phase, done, total)``; one that can be called with
    one argument gets a :class:`BenchProgress`; one whose signature cannot be
    read is called the old way.
    """
    if callback is None:
        return None
    try:
        inspect.signature(callback).bind(0)
    except TypeError:  # needs more than one argument: the old (phase, done, total)
        return callback  # type: ignore[return-value]
    except ValueError:  # no signature to read: the old way, as before
        return callback  # type: ignore[return-value]
    return lambda phase, done, total: callback(BenchProgress(phase, done, total))  # type: ignore[call-arg]


class BenchError(RuntimeError):
    """The benchmark could not be set up (no space, bad configuration)."""


# --- sizes -------------------------------------------------------------------------




def comma_list(text: str) -> list[str]:
    """Split a comma-separated command-line value (``ext4,xfs``), dropping blanks."""
    return [t.strip() for t in text.split(",") if t.strip()]


def require_root() -> bool:
    """True when running as root; otherwise say on stderr that loop filesystems need it."""
    if os.geteuid() == 0:
        return True
    print("needs root (dedicated loop filesystems)", file=sys.stderr)
    return False




# --- configuration and results ----------------------------------------------------------


@dataclass
class BenchConfig:
    """What to benchmark.

    Attributes:
        payload_size: Bytes per payload (one per delegate, like one TensorRT engine).
        payloads: Number of payloads.
        chunk_size: Bytes per step of trtet_store's move/copy; None for the
            writer's default (``trtet_store.io.writer.DEFAULT_CHUNK_SIZE``).
        filesystem: ``ext4``, ``xfs``, ``btrfs``, ``tmpfs`` (a dedicated
            filesystem, root only), ``here`` (a temp directory on the
            filesystem of ``workdir``), or ``auto`` (as root ext4, then XFS
            where it can be made, so that a first run shows insert and clone;
            else here).
        fs_size: Size of the dedicated filesystem: ``"fit"`` (every method
            fits: the staged payloads plus a full copy of them), ``"tight"``
            (the staged payloads fit once, plus a move's chunk, but not
            twice), or a byte count (used as given).
        repeat: Repetitions of every method; results give median and max.
        methods: Which of :data:`METHODS` to run.
        layout: Where the payloads go: ``split`` (even-numbered ones in the
            ``.pte``, odd ones in ``engines.ptd``), ``pte`` or ``ptd``.
        segment_alignment: ExecuTorch's ``segment_alignment`` (4096 gives
            page-aligned payloads, which zero-copy placements need).
        workdir: Directory for ``here`` runs; default the current directory.
        image_dir: Where loop images live (on a disk, never a tmpfs); default
            ``$TRTET_FS_ROOT`` or ``/var/tmp``.
        verify_outputs: Hash each method's outputs (outside the measured
            window) and check every method wrote the same bytes.
        cached_sources: Read the payloads into the page cache before each
            method (a blob just built and still cached); otherwise each is
            dropped from the cache before each method (an engine built long
            ago), so that a method never reads what the one before it cached.
    """

    payload_size: int = 512 * MiB
    payloads: int = 2
    chunk_size: int | None = None
    filesystem: str = "auto"
    fs_size: str | int = "fit"
    repeat: int = 3
    methods: tuple[str, ...] = METHODS
    layout: str = "split"
    segment_alignment: int = PAGE
    workdir: Path | None = None
    image_dir: Path | None = None
    verify_outputs: bool = True
    cached_sources: bool = False

    def validate(self) -> None:
        """Raise ValueError on an impossible configuration."""
        if self.payload_size <= 0:
            raise ValueError("payload_size must be positive")
        if self.payloads < 1:
            raise ValueError("payloads must be at least 1")
        if self.chunk_size is not None and self.chunk_size <= 0:
            raise ValueError("chunk_size must be positive")
        if self.repeat < 1:
            raise ValueError("repeat must be at least 1")
        if self.filesystem not in (*FILESYSTEMS, "auto"):
            raise ValueError(f"filesystem must be one of {FILESYSTEMS} or 'auto'")
        if self.layout not in LAYOUTS:
            raise ValueError(f"layout must be one of {LAYOUTS}")
        bad = [m for m in self.methods if m not in METHODS]
        if bad or not self.methods:
            raise ValueError(f"methods must be a non-empty subset of {METHODS}, got {bad}")
        if isinstance(self.fs_size, str) and self.fs_size not in ("fit", "tight"):
            raise ValueError("fs_size must be 'fit', 'tight' or a byte count")
        sa = self.segment_alignment
        if sa <= 0 or sa & (sa - 1):
            raise ValueError("segment_alignment must be a power of two")

    @classmethod
    def from_args(cls, ns: argparse.Namespace) -> BenchConfig:
        """The configuration the options of :func:`add_arguments` describe (not validated)."""
        return cls(
            payload_size=ns.payload_size,
            payloads=ns.payloads,
            chunk_size=ns.chunk_size,
            filesystem=ns.filesystem,
            fs_size=ns.fs_size,
            repeat=ns.repeat,
            methods=tuple(m.strip() for m in ns.methods.split(",") if m.strip()),
            layout=ns.layout,
            segment_alignment=ns.segment_alignment,
            workdir=(ns.workdir or ns.out_dir).absolute(),
            verify_outputs=not ns.no_verify,
        )

    @property
    def total_payload_bytes(self) -> int:
        """All payload bytes together."""
        return self.payload_size * self.payloads

    @property
    def effective_chunk_size(self) -> int:
        """The chunk size trtet_store will use: ``chunk_size``, else the writer's default,
        but on a ``tight`` filesystem at most a 16th of the payloads (whole MiB, at least
        one), so that a move's needs stay well below small payloads."""
        from trtet_store.io.writer import DEFAULT_CHUNK_SIZE

        if self.chunk_size:
            return self.chunk_size
        if self.fs_size == "tight":
            return max(MiB, min(DEFAULT_CHUNK_SIZE, self.total_payload_bytes // 16 // MiB * MiB))
        return DEFAULT_CHUNK_SIZE


# --- command-line options --------------------------------------------------------------


def size_arg(text: str) -> int:
    try:
        return parse_size(text)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


def _fs_size_arg(text: str) -> str | int:
    if text in ("fit", "tight"):
        return text
    return size_arg(text)


def _positive_int(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not an integer: {text!r}") from None
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be at least 1, got {value}")
    return value


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """Add the options of ``trtet-store bench`` to ``parser``, defaults from :class:`BenchConfig`.

    :meth:`BenchConfig.from_args` turns the parsed namespace back into a
    configuration; ``out_dir``, ``json``, ``plot`` and ``no_progress`` are
    for the caller (where the report goes, whether bars are drawn).
    """
    from trtet_store.io.writer import DEFAULT_CHUNK_SIZE

    d = BenchConfig()
    # One call per option, defaults read from BenchConfig so they live there only.
    add = parser.add_argument
    add("--payload-size", type=size_arg, default=d.payload_size, metavar="SIZE",
        help=f"bytes per payload, e.g. 512M (default {format_size(d.payload_size)})")
    add("--payloads", type=_positive_int, default=d.payloads, metavar="N",
        help=f"number of payloads, one per delegate (default {d.payloads})")
    add("--chunk-size", type=size_arg, default=d.chunk_size, metavar="SIZE",
        help=f"trtet_store's move/copy step (default {format_size(DEFAULT_CHUNK_SIZE)})")
    add("--filesystem", choices=("auto", *FILESYSTEMS), default=d.filesystem,
        help="dedicated filesystem type (root only), or 'here' for a temp dir on "
        "the current filesystem; auto: ext4, then XFS (a table each) as root, else here")
    add("--fs-size", type=_fs_size_arg, default=d.fs_size, metavar="fit|tight|SIZE",
        help="size of the dedicated filesystem: fit (every method fits), tight "
        "(the payloads fit once, not twice), or a size")
    add("--repeat", type=_positive_int, default=d.repeat, metavar="N",
        help=f"repetitions per method; median and max are reported (default {d.repeat})")
    add("--methods", default=",".join(d.methods), metavar="LIST",
        help=f"comma-separated subset of {','.join(METHODS)}")
    add("--layout", choices=LAYOUTS, default=d.layout,
        help=f"payloads in the .pte, in engines.ptd, or split (default {d.layout})")
    add("--segment-alignment", type=size_arg, default=d.segment_alignment, metavar="N",
        help=f"ExecuTorch segment_alignment (default {d.segment_alignment})")
    # Where the report goes: the caller's, not the configuration's.
    add("--out-dir", type=Path, default=DEFAULT_OUT_DIR, metavar="DIR",
        help=f"where --json and --plot default to (default ./{DEFAULT_OUT_DIR})")
    add("--json", type=Path, default=None, metavar="FILE",
        help="write the results as JSON (default OUT_DIR/bench.json)")
    add("--plot", type=Path, default=None, metavar="FILE",
        help="write a PNG of disk use over time (default OUT_DIR/bench.png)")
    add("--workdir", type=Path, default=None, metavar="DIR",
        help="for --filesystem here: where the temp dir goes (default OUT_DIR)")
    add("--no-verify", action="store_true",
        help="do not hash and compare the outputs of the methods")
    add("--no-progress", action="store_true", help="no progress bars")
