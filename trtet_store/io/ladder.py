"""The placement ladder and the free-space budget: which placement each payload gets, and
whether the write fits, decided before anything is created.

Functions of the outputs (destination, layout) and the caller's wishes
(placements allowed, ``consume``, the move's budget); nothing here writes a
byte (the capability probes try their call on scratch files). See DESIGN.md,
"Placements, best first" and step 2 of "The transaction".
"""

from __future__ import annotations

import logging
import os
import stat
from collections.abc import Collection, Iterable, Sequence
from pathlib import Path

from trtet_store.io import fs, transfer
from trtet_store.io.blobstore import Blob
from trtet_store.io.errors import InsufficientSpaceError, PlacementUnavailable
from trtet_store.io.journal import PayloadPlan
from trtet_store.io.layout import Extent, ExternalFile, Layout
from trtet_store.io.units import MiB, round_up

log = logging.getLogger("trtet_store.writer")

PLACEMENTS = ("clone", "insert", "move", "copy")
# Room for the journal, directory entries and per-file block rounding, on top
# of what the placements themselves need.
SLACK_BYTES = MiB

#: One output's payloads, each with the plan chosen for it.
Planned = list[tuple[Extent, PayloadPlan]]


def source_path(piece: Blob | ExternalFile) -> Path:
    """The absolute path of a payload's source file (how the journal names it)."""
    return Path(piece.path).absolute()


def choose_placements(outputs: Sequence[tuple[Path, Layout]], *, allowed: Collection[str],
                      consume: bool, chunk_size: int) -> list[Planned]:
    """Pick, per payload, the best placement allowed, and say why.

    Parameters
    ----------
    outputs : sequence of (pathlib.Path, Layout)
        Each destination with its layout.
    allowed : collection of str
        The rungs of :data:`PLACEMENTS` the caller allows (copy always is).
    consume : bool
        Whether blobs may be moved or inserted (and so used up).
    chunk_size : int
        The move's peak-disk budget (three steps of a third of it).

    Returns
    -------
    list of Planned
        Per output, in order: each payload extent with its plan.
    """
    uses: dict[str, int] = {}
    for _, layout in outputs:
        for ext in layout.payloads:
            key = os.fspath(source_path(ext.piece))
            uses[key] = uses.get(key, 0) + 1
    chosen = []
    for dest, layout in outputs:
        plans: Planned = []
        for ext in layout.payloads:
            piece = ext.piece
            n_uses = uses[os.fspath(source_path(piece))]
            placement, reason = _choose(dest, ext, n_uses, allowed, consume)
            digest_chunk, digests = _digests(piece)
            plan = PayloadPlan(
                source=os.fspath(source_path(piece)), offset=ext.offset, size=ext.size,
                source_offset=piece.offset if isinstance(piece, ExternalFile) else 0,
                placement=placement, reason=reason, chunk_size=digest_chunk,
                chunk_digests=list(digests) if digests is not None else None,
                step=transfer.move_step(chunk_size, digest_chunk),
                identity=list(piece.identity) if isinstance(piece, Blob) else None,
                consumed=placement in ("move", "insert") or (
                    placement == "clone" and consume and isinstance(piece, Blob)
                    and not piece.shared and n_uses == 1))
            plans.append((ext, plan))
            log.info("%s: piece %d (%d bytes from %s) by %s: %s", dest, ext.index,
                     ext.size, plan.source, placement, reason)
        _choose_host(dest, plans, allowed)
        moves = [p for _, p in plans if p.placement == "move"]
        if moves and fs.online_discard(dest.parent):
            for plan in moves:
                plan.reason += ("; the filesystem is mounted with online discard, so every "
                                "byte the move frees is also discarded, which takes the disk "
                                "time a copy does not spend (nodiscard and a periodic fstrim "
                                "avoid it)")
            log.info("%s: %d move(s) on a filesystem mounted with online discard: freeing "
                     "the sources will cost the disk time", dest, len(moves))
        for ext, plan in plans:
            if plan.placement in ("clone", "insert") and isinstance(ext.piece, Blob):
                # A zero-copy placement never reads the payload: the file
                # must still be the one sealed (checked again as it is placed).
                ext.piece.check_identity()
        chosen.append(plans)
    return chosen


def _choose_host(dest: Path, plans: Planned, allowed: Collection[str]) -> None:
    """Let the largest movable payload become the output file itself (insert).

    Renaming it into place and inserting room for what precedes it moves no
    payload byte at all; it needs a block-aligned offset and a filesystem
    that inserts ranges (ext4, XFS).
    """
    movable = [p for _, p in plans if p.placement == "move"]
    if not movable or "insert" not in allowed:
        return
    host = max(movable, key=lambda p: p.size)
    bs = fs.block_size(dest.parent)
    if host.offset % bs:
        host.reason += (f"; no insert: offset {host.offset} is not a multiple of the "
                        f"{bs}-byte block (export with segment_alignment=4096)")
        return
    try:
        why = fs.probe_insert_range(dest.parent)
    except PlacementUnavailable as exc:
        host.reason += f"; no insert: {exc.reason}"
        return
    host.placement = "insert"
    host.reason = f"the largest payload hosts the file: {why}; {host.reason}"
    # The file takes the destination's mode and owner; a rollback gives these back.
    st = os.stat(host.source)
    host.host_mode = [stat.S_IMODE(st.st_mode), st.st_uid, st.st_gid]
    log.info("%s: %s becomes the output file (insert)", dest, host.source)


def _choose(dest: Path, ext: Extent, uses: int, allowed: Collection[str],
            consume: bool) -> tuple[str, str]:
    """The best placement allowed for one payload, with why, and why not better.

    Ladder, best first: clone (shares blocks, needs a reflink filesystem
    and a block-aligned offset), move (needs consume and one filesystem),
    copy. Capabilities are found by trying, never predicted.
    """
    piece = ext.piece
    source = source_path(piece)
    bs = fs.block_size(dest.parent)
    if "clone" not in allowed:
        no_clone = "no clone: not among the placements allowed"
    elif ext.offset % bs:
        no_clone = (f"no clone: offset {ext.offset} is not a multiple of the {bs}-byte "
                    "block (export with segment_alignment=4096)")
    elif isinstance(piece, ExternalFile) and piece.offset % bs:
        no_clone = (f"no clone: the range starts at {piece.offset} in {source}, not a "
                    f"multiple of the {bs}-byte block")
    else:
        try:
            return "clone", fs.probe_clone(source, dest.parent)
        except PlacementUnavailable as exc:
            no_clone = f"no clone: {exc.reason}"
    if isinstance(piece, ExternalFile):
        return "copy", f"not owned by a blob store, so only copied; {no_clone}"
    if piece.shared:
        return "copy", f"the blob's file is shared with its owner (a cache), never consumed; " \
                       f"{no_clone}"
    if not consume:
        return "copy", f"consume=False: sources are left intact; {no_clone}"
    if uses > 1:
        return "copy", f"the blob is used more than once, so it must survive; {no_clone}"
    if "move" not in allowed:
        return "copy", f"move is not among the placements allowed; {no_clone}"
    unchanged = piece.identity_matches()
    try:
        why, placement = fs.probe_same_filesystem(source, dest.parent), "move"
    except PlacementUnavailable as exc:
        why, placement = exc.reason, "copy"
    if unchanged:
        piece.reseal()  # the probe's own link and unlink changed only its ctime
    return placement, f"{why}; {no_clone}"


def _digests(piece: Blob | ExternalFile) -> tuple[int, Sequence[int] | None]:
    if isinstance(piece, Blob):
        # An adopted blob has none until a placement that reads it asks (digest_sources).
        return piece.chunk_size, piece.chunk_digests if piece.has_digests else None
    return piece.chunk_size, piece.chunk_digests


def payload_need(plans: Iterable[PayloadPlan], block: int) -> int:
    """Extra disk the payloads of one output need at the peak, each by its plan.

    A copy needs its whole payload; a clone one block (a tail shorter than a
    block is written); the moves of one output one move's peak (they run one
    after another), plus two blocks each. An insert is budgeted as the move
    it falls back to: inserting can still fail at placement where the probe
    said it works (it is tried on a scratch file, and a cache can be wrong),
    and refusing now costs one step (``chunk_size``) of free space, where a
    fallback without its room would fill the disk mid-write. A clone's
    fallback to a copy is not budgeted here (it would need the whole payload
    for a placement that needs none); :func:`trtet_store.io.place.place_payload`
    checks its room before copying a byte.
    """
    plans = list(plans)
    n = sum(round_up(p.size, block) for p in plans if p.placement == "copy")
    n += block * sum(1 for p in plans if p.placement == "clone")  # an unaligned tail
    movers = [p for p in plans if p.placement in ("move", "insert")]
    if movers:
        n += transfer.move_peak(max(p.step for p in movers)) + 2 * block * len(movers)
    return n


def preflight(outputs: Sequence[tuple[Path, Layout]], plans: Sequence[Planned], *,
              consume: bool) -> None:
    """Fail before anything is created if the placements cannot fit.

    Every byte the write may need on each destination filesystem is counted:
    the inline bytes (an insert's header among them), each payload by its
    placement (:func:`payload_need`, which budgets an insert as the move it
    may fall back to), and :data:`SLACK_BYTES`. The old destination stays
    until the rename, so it is not counted as free.

    A clone that falls back to a copy at placement (FICLONERANGE refused
    after all: EOPNOTSUPP, EXDEV, ...) is not budgeted as a copy: that would
    refuse, on a disk with room for the clone, the placement whose point is
    that it needs no room. Instead the fallback checks the room it needs
    before copying a byte, and raises the same :class:`InsufficientSpaceError`;
    the transaction then rolls back, leaving sources and destinations as
    they were (see :func:`trtet_store.io.place.place_payload`).

    Raises
    ------
    InsufficientSpaceError
        With the bytes needed and available on the first filesystem short of room.
    """
    need: dict[int, tuple[int, Path]] = {}
    for (dest, layout), planned in zip(outputs, plans, strict=True):
        bs = fs.block_size(dest.parent)
        n = sum(round_up(e.size, bs) for e in layout.inline)
        n += payload_need((p for _, p in planned), bs)
        dev = os.stat(dest.parent).st_dev
        prev, _ = need.get(dev, (SLACK_BYTES, dest))
        need[dev] = (prev + n, dest)
    for needed, dest in need.values():
        available = fs.free_bytes(dest.parent)
        if needed > available:
            raise InsufficientSpaceError(needed, available, dest, space_hint(plans, consume))


def still_needed(dest_dir: Path, pending: Iterable[tuple[Path, Iterable[PayloadPlan]]]) -> int:
    """Room the payloads not placed yet still need on ``dest_dir``'s filesystem, with slack.

    What a placement's fallback must leave free for the rest of the write.
    ``pending`` gives, per output (its destination), the plans still to place;
    an insert among them is already in place (hosting happens first) and
    needs nothing more.
    """
    dev = os.stat(dest_dir).st_dev
    n = SLACK_BYTES
    for dest, plans in pending:
        if os.stat(dest.parent).st_dev == dev:
            n += payload_need((p for p in plans if p.placement != "insert"),
                              fs.block_size(dest.parent))
    return n


def space_hint(plans: Sequence[Planned], consume: bool) -> str | None:
    """What would make the write fit, if anything: never advice it already follows."""
    copied = [(ext, p) for planned in plans for ext, p in planned
              if p.placement == "copy" and isinstance(ext.piece, Blob)]
    if not copied:
        return None
    if not consume:
        return "consume=True needs only one chunk extra"
    return ("the blobs are copied because they are on another filesystem than the output; "
            "stage them on the output's filesystem to move them")
