"""A stand-in for the TensorRT build, for machines without a GPU (tests and benchmarks).

It replaces exactly one function, ``trtet_store.export.tensorrt.build_engines``
(the seam): the real module is exported, run eagerly for its output specs,
and replaced by a chain of engine placeholder nodes. Each "engine" is random
bytes streamed into the blob store in 1 MiB pieces, as the real builder
streams its engines, with a state record shaped like torch-tensorrt 2.14.0's
(:func:`engine_record`), read by the real :func:`~trtet_store.export.tensorrt.engine_state`.
Everything after the seam runs for real. Install it with :func:`installed`.

Given ``timing_cache_path`` (the engine cache's private copy) and made with
``keep_timing=True``, :class:`FakeBuilder` does what TensorRT does with it:
loads it (a cache made for another key is ignored, as TensorRT ignores a header
that is not its own), times the tactics it lacks (``tactic_seconds`` each,
counted in ``timed``) and rewrites the file; its ``combine`` and
``count_entries`` are the timing-cache seam's (the format: :data:`TIMING_MAGIC`).
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from typing import Any

import torch
import xxhash

from trtet_store.export.tensorrt import (
    BuildResult,
    engine_state,
    register_engine,
    trt_engine_op,
)
from trtet_store.io import Blob, BlobStore
from trtet_store.io.units import MiB

#: Fields of torch-tensorrt 2.14.0's serialized engine record (SERIALIZATION_LEN).
RECORD_LEN = 13


def engine_record(*, inputs: Sequence[str] = ("input_0",),
                  outputs: Sequence[str] = ("output_0",), aliased_io: str = "",
                  requires_output_allocator: bool = False, device_id: int = 0,
                  serialized_metadata: str = "", target_platform: str = "linux_x86_64",
                  hardware_compatible: bool = False) -> list[str]:
    """An engine state record as ``get_engine_info_from_state(metadata_only=True)`` gives it.

    Indices and encodings as in torch-tensorrt 2.14.0's
    ``_serialized_engine_layout``: binding names and device joined by ``%``,
    flags as ``"0"``/``"1"``, ``aliased_io`` as ``out@in@kind`` records joined
    by ``%``, and the engine slot empty (metadata only).
    """
    record = [""] * RECORD_LEN
    record[0] = "10"  # ABI version
    record[1] = "fake_engine"
    record[2] = f"{device_id}%8%9%0%Fake GPU"
    record[3] = ""  # the engine: not in a metadata-only record
    record[4] = "%".join(inputs)
    record[5] = "%".join(outputs)
    record[6] = "1" if hardware_compatible else "0"
    record[7] = serialized_metadata
    record[8] = target_platform
    record[9] = "1" if requires_output_allocator else "0"
    record[10] = "static"
    record[11] = "0"
    record[12] = aliased_io
    return record


def stage_fake_engine(store: BlobStore, size: int, seed: int) -> tuple[Blob, str]:
    """Stream ``size`` pseudo-random bytes into ``store``; the blob and their xxh3-128."""
    h = xxhash.xxh3_128()
    rnd = xxhash.xxh3_128(seed=seed)
    with store.writer() as w:
        left = size
        while left:
            rnd.update(b"more")
            n = min(left, MiB)
            part = (rnd.digest() * (n // 16 + 1))[:n]
            w.write(part)
            h.update(part)
            left -= n
    return w.blob, h.hexdigest()


@dataclass
class FakeBuilder:
    """Callable with the seam's signature; records what it built.

    ``seeds`` give each engine's content (equal seeds: identical engines, with
    identical metadata); by default engine ``i`` has seed ``i``. ``record``
    gives each engine's state record. ``cpu_tail`` leaves a linear layer of
    that many features after the engines, as a partial TensorRT compile leaves
    operators for other partitioners (XNNPACK).
    """

    engine_sizes: tuple[int, ...] = (4 << 20,)
    seeds: tuple[int, ...] | None = None
    record: dict = field(default_factory=dict)  # engine_record(**record) for every engine
    built: list = field(default_factory=list)  # (engine, xxh3-128 of the bytes written)
    seconds: float = 0.0  # spent staging engines
    cpu_tail: int = 0
    # The timing cache (see timing_tactics), kept only with keep_timing (off by default, so
    # that other tests' caches hold what they did): each tactic it lacks costs this much.
    keep_timing: bool = False
    tactic_seconds: float = 0.0
    tactics_per_layer: int = 4
    timed: list = field(default_factory=list)  # per build: tactics timed (its cache lacked)
    warm: list = field(default_factory=list)  # per build: tactics its cache held already
    mismatched: list = field(default_factory=list)  # headers of caches for another key

    def __call__(self, exported_program, arg_inputs, kwarg_inputs, store, settings):
        start = time.monotonic()
        if self.keep_timing and settings.get("timing_cache_path"):
            self._time_tactics(exported_program, settings)
        out = exported_program.module()(*arg_inputs, **(kwarg_inputs or {}))
        seeds = self.seeds or tuple(range(len(self.engine_sizes)))
        engines = []
        for i, (size, seed) in enumerate(zip(self.engine_sizes, seeds, strict=True)):
            fields = {"serialized_metadata": f"fake-engine-{seed}", **self.record}
            state = engine_state(engine_record(**fields), name=f"engine {i}")  # before staging
            blob, digest = stage_fake_engine(store, size, seed)
            engine = register_engine(blob, state, [(tuple(out.shape), out.dtype)])
            engines.append(engine)
            self.built.append((engine, digest))
        self.seconds += time.monotonic() - start
        ids = [e.engine_id for e in engines]
        op = trt_engine_op()
        features = out.shape[-1]
        tail = torch.nn.Linear(features, self.cpu_tail) if self.cpu_tail else None

        class Engines(torch.nn.Module):
            def __init__(self) -> None:
                super().__init__()
                self.tail = tail

            def forward(self, x: torch.Tensor) -> torch.Tensor:
                y = x
                for engine_id in ids:
                    y = op([y], engine_id)[0]
                return y if self.tail is None else self.tail(y)

        return BuildResult(torch.export.export(Engines(), tuple(arg_inputs), strict=False),
                           engines)


    def _time_tactics(self, exported_program, settings) -> None:
        """What TensorRT does with ``timing_cache_path``: load, time what it lacks, rewrite."""
        from trtet_store.export import timing_cache

        path = settings["timing_cache_path"]
        header = timing_cache.timing_key(timing_cache.timing_facts(settings))
        with open(path, "rb") as f:
            data = f.read()
        have: dict[str, str] = {}
        if data:
            theirs, entries = parse_timing_cache(data)
            if theirs != header:  # TensorRT ignores a cache of another device (a warning)
                self.mismatched.append(theirs)
            else:
                have = entries
        wanted = list(dict.fromkeys(timing_tactics(exported_program, self.tactics_per_layer)))
        missing = [t for t in wanted if t not in have]
        self.timed.append(len(missing))
        self.warm.append(len(wanted) - len(missing))
        if missing and self.tactic_seconds:
            time.sleep(self.tactic_seconds * len(missing))
        for t in missing:
            have[t] = xxhash.xxh3_64_hexdigest(f"{header}|{t}|{time.monotonic_ns()}".encode())[:8]
        with open(path, "wb") as f:  # as Torch-TensorRT rewrites its timing_cache_path
            f.write(write_timing_cache(header, have))

    @staticmethod
    def combine(base: bytes, learned: bytes, *, ignore_mismatch: bool = False) -> bytes:
        """The stub's ``ITimingCache.combine``: ``base`` with ``learned``'s tactics added
        (``base``'s kept where both have one); headers that differ are refused unless
        ``ignore_mismatch`` (then ``learned``'s tactics join under ``base``'s header)."""
        from trtet_store.export.timing_cache import MergeRefused

        mine, have = parse_timing_cache(base)
        theirs, more = parse_timing_cache(learned)
        if mine != theirs and not ignore_mismatch:
            raise MergeRefused(f"timing cache header mismatch: {mine} vs {theirs}")
        return write_timing_cache(mine, {**more, **have})

    @staticmethod
    def count_entries(data: bytes) -> int:
        return len(parse_timing_cache(data)[1]) if data else 0


#: The stub's timing cache: a text file. First line this magic, second ``header <key>``
#: (the timing key of the device, TensorRT and flags it was made for, as TensorRT's own
#: header), then one ``<tactic> <choice>`` line per entry, sorted by tactic (8 hex digits
#: of xxh3-64 each). Two builds of one tactic may choose differently (random: identical
#: GPUs write different bytes), so caches are merged by tactic, never by bytes.
TIMING_MAGIC = "trtet-fake-timing-cache 1"


def parse_timing_cache(data: bytes) -> tuple[str, dict[str, str]]:
    """``(header, {tactic: choice})`` of a stub timing cache; ValueError when it is not one."""
    lines = data.decode("ascii").split("\n")
    if len(lines) < 3 or lines[0] != TIMING_MAGIC or not lines[1].startswith("header ") \
            or lines[-1] != "":
        raise ValueError("not a fake timing cache")
    entries = {}
    for line in lines[2:-1]:
        tactic, _, choice = line.partition(" ")
        if len(tactic) != 16 or len(choice) != 8:
            raise ValueError(f"not a fake timing cache entry: {line!r}")
        entries[tactic] = choice
    return lines[1].removeprefix("header "), entries


def write_timing_cache(header: str, entries: dict[str, str]) -> bytes:
    body = "".join(f"{t} {c}\n" for t, c in sorted(entries.items()))
    return f"{TIMING_MAGIC}\nheader {header}\n{body}".encode("ascii")


def timing_tactics(exported_program: Any, per_layer: int = 4) -> list[str]:
    """The tactics a build of ``exported_program`` times: ``per_layer`` per operator, named
    by its target and output shape, as TensorRT keys a timing by the layer's signature
    (identical layers, in one model or two, share their tactics)."""
    out = []
    for node in exported_program.graph.nodes:
        if node.op != "call_function":
            continue
        val = node.meta.get("val")
        shape = tuple(val.shape) if hasattr(val, "shape") else None
        for k in range(per_layer):
            out.append(xxhash.xxh3_64_hexdigest(f"{node.target}|{shape}|{k}".encode()))
    return out


def linear_relu() -> tuple[torch.nn.Module, tuple[torch.Tensor]]:
    """The small model every TensorRT test compiles."""
    torch.manual_seed(0)
    module = torch.nn.Sequential(torch.nn.Linear(16, 16), torch.nn.ReLU()).eval()
    return module, (torch.randn(2, 16),)


#: What starts every engine :class:`FakeRefitter` writes, before the new weights' digest.
REFIT_MAGIC = b"trtet-fake-refit\0"
_REFIT_HEADER = len(REFIT_MAGIC) + 32  # the magic, then an xxh3-128 hex digest


def weights_digest(exported_program: Any) -> str:
    """xxh3-128 of a program's tensors (names and bytes, in name order): the refit's input."""
    h = xxhash.xxh3_128()
    for name, value in sorted({**exported_program.state_dict,
                               **exported_program.constants}.items()):
        if isinstance(value, torch.Tensor):
            h.update(name.encode() + b"\0")
            h.update(memoryview(value.detach().cpu().contiguous().view(torch.uint8).numpy()
                                ).cast("B"))
    return h.hexdigest()


@dataclass
class FakeRefitter:
    """Callable with the refit seam's signature (:func:`~trtet_store.export.tensorrt.refit_engine`).

    The engine it writes is :data:`REFIT_MAGIC`, the new weights' digest
    (:func:`weights_digest`), then the structure engine's bytes (without the
    header of an earlier fake refit), streamed a MiB at a time: a test
    computes what a refit must produce with :meth:`expected`. ``fail``: raise
    :class:`~trtet_store.export.tensorrt.RefitError` with that text instead
    (as a refit that left a weight unset), before writing anything.
    ``corrupt``: write the engine with another weights digest in its header
    (bytes that fail :meth:`check`, as an engine refit with the wrong weights).
    ``hook``: called with the writer once the header is written (a test's
    barrier, e.g. to SIGKILL the process mid-refit).

    Stripping: the stub's engines are random bytes with no weights to take
    out, so the stub never strips; a structure entry is the engine as built
    (see :mod:`trtet_store.export.engine_refit`).
    """

    fail: str | None = None
    corrupt: bool = False
    hook: Any = None
    refits: list = field(default_factory=list)  # (engine path, weights digest)

    def __call__(self, engine_path, exported_program, arg_inputs, kwarg_inputs, settings,
                 writer) -> None:
        from trtet_store.export.tensorrt import RefitError

        if self.fail is not None:
            raise RefitError(self.fail)
        digest = weights_digest(exported_program)
        with open(engine_path, "rb") as f:
            head = f.read(_REFIT_HEADER)
            writer.write(REFIT_MAGIC + (digest[::-1] if self.corrupt else digest).encode())
            if self.hook is not None:
                self.hook(writer)
            if not head.startswith(REFIT_MAGIC):
                writer.write(head)
            while chunk := f.read(MiB):
                writer.write(chunk)
        self.refits.append((str(engine_path), digest))

    @staticmethod
    def check(engine_path: Any, exported_program: Any) -> str | None:
        """The stub's :func:`~trtet_store.export.tensorrt.check_refit`: the header names
        the program's weights (reads the header only)."""
        with open(engine_path, "rb") as f:
            head = f.read(_REFIT_HEADER)
        if not head.startswith(REFIT_MAGIC):
            return "no fake refit header"
        if head[len(REFIT_MAGIC):].decode(errors="replace") != weights_digest(exported_program):
            return "its header names other weights than the export's"
        return None

    @staticmethod
    def expected(structure_engine: bytes, exported_program: Any) -> bytes:
        """The engine a refit of ``structure_engine`` with the program's weights writes."""
        body = structure_engine[_REFIT_HEADER:] \
            if structure_engine.startswith(REFIT_MAGIC) else structure_engine
        return REFIT_MAGIC + weights_digest(exported_program).encode() + body


@contextlib.contextmanager
def installed(builder: FakeBuilder, *, refitter: FakeRefitter | None = None
              ) -> Iterator[FakeBuilder]:
    """Put ``builder`` (and ``refitter``) at the seams, skip the CUDA check, for the duration.

    The timing-cache seam too: :func:`trtet_store.export.timing_cache.combine` and
    ``count_entries`` become the builder's (its text format, :data:`TIMING_MAGIC`).
    """
    from trtet_store.export import tensorrt, timing_cache

    saved = (tensorrt.build_engines, tensorrt.check_available, tensorrt.refit_engine,
             tensorrt.check_refit)
    timing_saved = (timing_cache.combine, timing_cache.count_entries)
    tensorrt.build_engines, tensorrt.check_available = builder, lambda: None
    # The stub's seam whatever the builder (a test's own callable keeps no timing cache).
    timing_cache.combine = FakeBuilder.combine
    timing_cache.count_entries = FakeBuilder.count_entries
    if refitter is not None:
        tensorrt.refit_engine, tensorrt.check_refit = refitter, refitter.check
    try:
        yield builder
    finally:
        (tensorrt.build_engines, tensorrt.check_available, tensorrt.refit_engine,
         tensorrt.check_refit) = saved
        timing_cache.combine, timing_cache.count_entries = timing_saved
