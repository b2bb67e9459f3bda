"""Shared machinery of the crash tests: a scenario, a way to die, and the checks after recovery.

A :class:`Scenario` is a write described by seeds and sizes only, so a child
process (a subprocess for the kill tests, a fork for the power cuts) can
build it and the parent can compute what the outputs and the blobs must hold
without sharing any object with the child.

Run as a script, this module is the kill tests' child: it stages the blobs,
prints ``ready``, writes, and prints ``done`` (or ``failed``); the parent
SIGKILLs it at a random moment.

:func:`check_recovered` is every crash test's verdict: each destination holds
its old content or the complete new one (all outputs agreeing), every blob's
bytes exist exactly once (in its source, or moved into a published output),
and no temp, journal, lock or pin file is left.
"""

from __future__ import annotations

import errno
import fcntl
import json
import logging
import os
import random
import re
import struct
import sys
import traceback
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from pathlib import Path

_ROOT = Path(__file__).resolve().parent.parent
if str(_ROOT) not in sys.path:  # when run as a script
    sys.path.insert(0, str(_ROOT))

from digests import digest, file_digest  # noqa: E402
from faults import WrappedCalls  # noqa: E402

MiB = 1 << 20

# -- the shutdown ioctl ("power cut") --------------------------------------------
#
# include/uapi/linux/ext4.h:   #define EXT4_IOC_SHUTDOWN _IOR('X', 125, __u32)
#                              #define EXT4_GOING_FLAGS_NOLOGFLUSH 0x2
# fs/xfs/libxfs/xfs_fs.h:      #define XFS_IOC_GOINGDOWN _IOR('X', 125, uint32_t)
#                              #define XFS_FSOP_GOING_FLAGS_NOLOGFLUSH 0x2
# (One number for both, also F2FS_IOC_SHUTDOWN and EXFAT_IOC_SHUTDOWN.)
_IOC_READ = 2
_IOC_NRSHIFT, _IOC_TYPESHIFT, _IOC_SIZESHIFT, _IOC_DIRSHIFT = 0, 8, 16, 30


def _ior(type_: str, nr: int, size: int) -> int:
    return ((_IOC_READ << _IOC_DIRSHIFT) | (ord(type_) << _IOC_TYPESHIFT)
            | (nr << _IOC_NRSHIFT) | (size << _IOC_SIZESHIFT))


FS_IOC_SHUTDOWN = _ior("X", 125, 4)  # == EXT4_IOC_SHUTDOWN == XFS_IOC_GOINGDOWN
GOING_FLAGS_NOLOGFLUSH = 2
assert FS_IOC_SHUTDOWN == 0x8004587D


def power_cut(mountpoint: os.PathLike | str) -> None:
    """Shut the filesystem down without flushing its log: what is not durable is lost.

    From here on every call on the filesystem fails with EIO; unmount and
    mount it again to see what a machine would find after losing power.
    """
    fd = os.open(mountpoint, os.O_RDONLY | os.O_DIRECTORY)
    try:
        fcntl.ioctl(fd, FS_IOC_SHUTDOWN, struct.pack("I", GOING_FLAGS_NOLOGFLUSH))
    finally:
        os.close(fd)


# -- content -----------------------------------------------------------------------


def content(seed: int, size: int) -> bytes:
    """Reproducible pseudo-random bytes."""
    return random.Random(seed).randbytes(size)






def tampered(data: bytes) -> bytes:
    """``data`` with its first bytes changed, same length: a source changed after staging."""
    mark = b"tampered after staging"
    return mark[: len(data)] + data[len(mark):]


# -- scenarios -----------------------------------------------------------------------


@dataclass
class Scenario:
    """A write described by seeds and sizes.

    ``outputs`` maps an output name to its pieces: ``["bytes", seed, size]``,
    ``["blob", i]`` (blob ``i`` of ``blobs``) or ``["ext", name]`` (a user
    file, never consumed, kept outside the staging and output directories).
    ``old`` gives the content each output has before the write (absent if
    not named). ``pristine``, when set, is a directory whose ``blob-<i>``
    files hold the blobs' bytes (large blobs are generated once, not per run).
    """

    blobs: list[tuple[int, int]]  # (seed, size)
    outputs: dict[str, list[list]]
    old: dict[str, tuple[int, int]] = field(default_factory=dict)  # name -> (seed, size)
    externals: dict[str, tuple[int, int]] = field(default_factory=dict)
    store_chunk: int = 64 << 10
    write_chunk: int = 256 << 10
    consume: bool = True
    pristine: str | None = None
    tamper: int | None = None  # index of a blob changed after staging

    def to_json(self) -> str:
        return json.dumps(asdict(self))

    @classmethod
    def from_json(cls, text: str) -> Scenario:
        raw = json.loads(text)
        raw["blobs"] = [tuple(b) for b in raw["blobs"]]
        raw["old"] = {k: tuple(v) for k, v in raw["old"].items()}
        raw["externals"] = {k: tuple(v) for k, v in raw["externals"].items()}
        return cls(**raw)

    # -- what the parent knows -------------------------------------------------

    def blob_bytes(self, i: int) -> bytes:
        seed, size = self.blobs[i]
        if self.pristine:
            data = Path(self.pristine, f"blob-{i}").read_bytes()
            assert len(data) == size
        else:
            data = content(seed, size)
        return tampered(data) if self.tamper == i else data

    def staged_digests(self) -> list[str]:
        """The digest of each blob's file as staged (after any tampering)."""
        return [digest(self.blob_bytes(i)) for i in range(len(self.blobs))]

    def new_content(self) -> dict[str, bytes]:
        """What each output holds after an uninterrupted write."""
        out = {}
        for name, pieces in self.outputs.items():
            parts = []
            for p in pieces:
                if p[0] == "bytes":
                    parts.append(content(p[1], p[2]))
                elif p[0] == "blob":
                    parts.append(self.blob_bytes(p[1]))
                else:
                    parts.append(content(*self.externals[p[1]]))
            out[name] = b"".join(parts)
        return out

    def old_content(self) -> dict[str, bytes | None]:
        return {name: content(*self.old[name]) if name in self.old else None
                for name in self.outputs}

    def moved_blobs(self) -> set[int]:
        """Blobs a consuming write on one filesystem moves (used once, consume=True)."""
        if not self.consume:
            return set()
        uses: dict[int, int] = {}
        for pieces in self.outputs.values():
            for p in pieces:
                if p[0] == "blob":
                    uses[p[1]] = uses.get(p[1], 0) + 1
        return {i for i, n in uses.items() if n == 1}

    # -- setting the scene ---------------------------------------------------------

    def install(self, root: Path) -> tuple[Path, Path, Path]:
        """Fresh ``staging``, ``out`` and ``user`` directories under ``root``, old outputs in place.

        Returns (staging, out, user).
        """
        root.mkdir(parents=True, exist_ok=True)
        dirs = []
        for name in ("staging", "out", "user"):
            d = root / name
            if d.exists():
                for p in d.iterdir():
                    p.unlink()
            else:
                d.mkdir()
            dirs.append(d)
        staging, out, user = dirs
        for name, (seed, size) in self.old.items():
            (out / name).write_bytes(content(seed, size))
        for name, (seed, size) in self.externals.items():
            (user / name).write_bytes(content(seed, size))
        return staging, out, user

    def stage(self, staging: Path):
        """Make the store and its blobs (in the process that will write). Returns (store, blobs)."""
        from trtet_store import BlobStore

        store = BlobStore(staging, chunk_size=self.store_chunk)
        blobs = []
        for i, (seed, size) in enumerate(self.blobs):
            if self.pristine:
                with store.writer() as w, open(Path(self.pristine, f"blob-{i}"), "rb") as f:
                    while part := f.read(4 * MiB):
                        w.write(part)
                blob = w.blob
            else:
                blob = store.put(content(seed, size))
            blobs.append(blob)
        if self.tamper is not None:
            path = blobs[self.tamper].path
            data = Path(path).read_bytes()
            with open(path, "r+b") as f:
                f.write(tampered(data)[:64])
        return store, blobs

    def write(self, out: Path, user: Path, blobs, **kwargs):
        """Run the write (``write_files``) of this scenario."""
        from trtet_store import ExternalFile, write_files

        outputs = []
        for name, pieces in self.outputs.items():
            built = []
            for p in pieces:
                if p[0] == "bytes":
                    built.append(content(p[1], p[2]))
                elif p[0] == "blob":
                    built.append(blobs[p[1]])
                else:
                    built.append(ExternalFile.of(user / p[1]))
            outputs.append((out / name, built))
        return write_files(outputs, consume=self.consume, chunk_size=self.write_chunk, **kwargs)


def kill_scenario(pristine: Path | None = None, *, scale: int = MiB,
                  aligned: bool = False) -> Scenario:
    """The kill tests' write: two outputs from five blobs (64 MiB at the default scale)
    and a user file, small chunks so that there are hundreds of chunk boundaries.

    Unaligned, every blob is moved. Aligned, model.pte's 4 KiB header lets its
    largest blob host it (insert) where the filesystem can insert ranges.
    """
    sizes = [20 * scale + 123, 17 * scale + 4097, 13 * scale, 9 * scale + 1, 5 * scale + 77]
    return Scenario(
        blobs=[(100 + i, n) for i, n in enumerate(sizes)],
        outputs={
            "model.pte": [["bytes", 1, 4096 if aligned else 4000], ["blob", 0],
                          ["bytes", 2, 3000], ["blob", 1],
                          ["ext", "user.bin"], ["bytes", 3, 100]],
            "model.ptd": [["bytes", 4, 64], ["blob", 2], ["blob", 3], ["bytes", 5, 17],
                          ["blob", 4]],
        },
        old={"model.pte": (7, 5000), "model.ptd": (8, 70_000)},
        externals={"user.bin": (9, scale + 5)},
        store_chunk=64 << 10,
        write_chunk=256 << 10,
        pristine=os.fspath(pristine) if pristine else None,
    )


def write_pristine(scn: Scenario, directory: Path) -> None:
    directory.mkdir(parents=True, exist_ok=True)
    for i, (seed, size) in enumerate(scn.blobs):
        (directory / f"blob-{i}").write_bytes(content(seed, size))


# -- the verdict ------------------------------------------------------------------------

_BLOB = re.compile(r"^[0-9a-f]{16}-(\d+)\.blob$")


class Broken(AssertionError):
    """A crash test found an invariant broken."""


def blob_files(staging: Path) -> dict[int, Path]:
    """The dead child's blob files by index (its store numbers them 1, 2, ... in order)."""
    found = {}
    for p in staging.iterdir():
        m = _BLOB.match(p.name)
        if m:
            found[int(m.group(1)) - 1] = p
    return found


def check_recovered(scn: Scenario, staging: Path, out: Path, user: Path, *,
                    staged: list[str] | None = None,
                    new: dict[str, str] | None = None,
                    where: str = "") -> str:
    """Assert the invariants after ``recover()``; return ``"old"`` or ``"new"``.

    ``staged`` are the blobs' digests as staged and ``new`` the digests of an
    uninterrupted write's outputs (computed from the scenario when omitted).
    """
    staged = staged if staged is not None else scn.staged_digests()
    if new is None:
        new = {k: digest(v) for k, v in scn.new_content().items()}
    old = {k: (digest(v) if v is not None else None) for k, v in scn.old_content().items()}

    def fail(msg: str) -> None:
        raise Broken(f"{where}: {msg}")

    states = {}
    for name in scn.outputs:
        path = out / name
        got = file_digest(path) if path.exists() else None
        if got == new[name]:
            states[name] = "new"
        elif got == old[name]:
            states[name] = "old"
        else:
            size = path.stat().st_size if path.exists() else None
            fail(f"TORN: {name} is neither old nor new ({size} bytes)")
    if len(set(states.values())) != 1:
        fail(f"outputs disagree (one published without the other): {states}")
    state = next(iter(states.values()))

    leftovers = sorted(p.name for p in out.iterdir()
                       if p.name not in scn.outputs and p.name != "lost+found")
    if leftovers:
        fail(f"left in the output directory: {leftovers}")
    pins = sorted(p.name for p in staging.iterdir() if p.name.startswith(".trtet-pin-"))
    if pins:
        fail(f"pins left in the staging directory: {pins}")

    files = blob_files(staging)
    moved = scn.moved_blobs()
    for i in range(len(scn.blobs)):
        # A moved blob lives in the published output or in its source, never
        # both and never neither; a copied blob always keeps its source.
        must_be_in_source = not (state == "new" and i in moved)
        if i not in files:
            if must_be_in_source:
                fail(f"LOST: blob {i}'s source is gone and the outputs are {state}")
            continue
        if not must_be_in_source:
            fail(f"blob {i} was moved into the published output, but its source "
                 f"({files[i].stat().st_size} bytes) is still there: its bytes exist twice")
        if file_digest(files[i]) != staged[i]:
            fail(f"LOST: blob {i}'s source is {files[i].stat().st_size} of "
                 f"{scn.blobs[i][1]} bytes, not as staged (outputs {state})")
    for name, (seed, size) in scn.externals.items():
        if file_digest(user / name) != digest(content(seed, size)):
            fail(f"user file {name} changed")
    return state


def collect_dead_store(staging: Path) -> None:
    """A new store keeps the dead one's blobs as orphans; removing them leaves only its lock."""
    from trtet_store import BlobStore

    with BlobStore(staging) as store:
        store.remove_orphans()  # explicit: orphans are never removed behind the user's back
        left = sorted(p.name for p in staging.iterdir())
        mine = f".store-{store.token}.lock"
        if left != [mine]:
            raise Broken(f"a new store left {left} in the staging directory")


# -- dying at a chosen system call ---------------------------------------------------------


class CallHook(WrappedCalls):
    """Wrap every call in ``fs.calls``; run ``action(n, name)`` before call number ``at``.

    ``at`` is one call number or a set of them. ``action`` may end the
    process (``os._exit``), cut the power, or raise (which the call then does).
    """

    def __init__(self, at: int | set[int] | None,
                 action: Callable[[int, str], None]) -> None:
        self.at = {at} if isinstance(at, int) else set(at or ())
        self.action = action
        self.count = 0
        self.names: list[str] = []

    def _wrap(self, name: str, real: Callable) -> Callable:
        def call(*args, **kwargs):
            self.count += 1
            self.names.append(name)
            if self.count in self.at:
                self.action(self.count, name)
            return real(*args, **kwargs)

        return call


def die(*_: object) -> None:
    """End this process now, like SIGKILL: no cleanup, no finally, no rollback."""
    os._exit(86)


def in_child(fn: Callable[[], None]) -> int:
    """Run ``fn`` in a forked child; return its exit status (86 = died on purpose)."""
    sys.stdout.flush()
    sys.stderr.flush()
    pid = os.fork()
    if pid == 0:  # pragma: no cover - the child
        code = 0
        try:
            logging.disable(logging.CRITICAL)
            fn()
        except BaseException:
            traceback.print_exc()
            code = 1
        finally:
            sys.stdout.flush()
            sys.stderr.flush()
            os._exit(code)
    _, status = os.waitpid(pid, 0)
    return os.waitstatus_to_exitcode(status)


def journal_state(out: Path) -> str | None:
    """The state recorded in the (single) journal in ``out``, if any, before recovery."""
    from trtet_store.io import journal

    found = journal.journals_in(out)
    if not found:
        return None
    try:
        return journal.read(found[0])[1]
    except (OSError, ValueError) as exc:
        return f"unreadable ({exc.__class__.__name__})"


# -- the kill tests' child ------------------------------------------------------------------


def _child_main(argv: list[str]) -> int:  # pragma: no cover - runs in a subprocess
    scn = Scenario.from_json(Path(argv[0]).read_text())
    root = Path(argv[1])
    staging, out, user = root / "staging", root / "out", root / "user"

    class Announce(logging.Handler):
        def emit(self, record: logging.LogRecord) -> None:
            if "rolling back" in record.getMessage():
                print("rollback", flush=True)

    logging.getLogger("trtet_store.writer").addHandler(Announce(logging.WARNING))
    logging.getLogger("trtet_store.writer").setLevel(logging.WARNING)
    _store, blobs = scn.stage(staging)
    for blob in blobs:  # built long ago: the kills should land in the write, not in its sync
        fd = os.open(blob.path, os.O_RDONLY)
        os.fdatasync(fd)
        os.close(fd)
    print("ready", flush=True)
    try:
        scn.write(out, user, blobs)
    except OSError as exc:
        print(f"failed {exc.errno} {errno.errorcode.get(exc.errno, '?')}", flush=True)
        # Leave like a killed child would: the store's exit handlers would
        # release the blobs, and the parent wants to see them restored.
        os._exit(3)
    print("done", flush=True)
    return 0


if __name__ == "__main__":  # pragma: no cover
    sys.exit(_child_main(sys.argv[1:]))
