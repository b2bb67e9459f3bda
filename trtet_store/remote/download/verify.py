"""Fetched bytes checked: each range against the manifest's chunk digests, each object's
full-object checksum combined from its ranges' and reused pieces' CRCs.

A range is checked as it arrives (a bad one is fetched again) and again when
a resume finds it staged; an object's checksum once all its ranges are in.
"""

from __future__ import annotations

import hashlib

from trtet_store.io import chunk_digest
from trtet_store.remote.checksum import b64_to_int, crc_functions, int_to_b64
from trtet_store.remote.download.plan import (
    ObjectPlan,
    ObjectSpec,
    Range,
    Reuse,
    Run,
    expected_chunks,
    expected_sha256,
)
from trtet_store.remote.download.staging import Staging
from trtet_store.remote.errors import FetchVerificationError


def chunks_ok(spec: ObjectSpec, rng: Range, view: memoryview) -> bool:
    """Every manifest chunk inside ``rng`` has its digest in ``view`` (the range's bytes)."""
    for off, size, digest in expected_chunks(spec, rng.offset, rng.end):
        if chunk_digest(view[off - rng.offset: off - rng.offset + size]) != digest:
            return False
    return True


def sha256_ok(spec: ObjectSpec, rng: Range, view: memoryview) -> bool:
    """A signed spec: every chunk inside ``rng`` has its signed sha256 in ``view``.

    True for a spec not signed (nothing to check). A signed chunk without a
    sha256 (a piece with none) is not ok.
    """
    if not spec.signed:
        return True
    shas = expected_sha256(spec, rng.offset, rng.end)
    if sum(size for _, size, _ in shas) != rng.size:
        return False
    for off, size, digest in shas:
        if hashlib.sha256(view[off - rng.offset: off - rng.offset + size]).hexdigest() != digest:
            return False
    return True


def staged_ok(spec: ObjectSpec, stage: Staging, run: Run, rng: Range, crc: int) -> bool:
    """A range an earlier fetch journaled: trusted only if its bytes still check."""
    data = stage.read(run, rng)
    if len(data) != rng.size:
        return False
    compute, _ = crc_functions(spec.checksum[0] if spec.checksum else "crc64nvme")
    view = memoryview(data)
    return compute(data) == crc and chunks_ok(spec, rng, view) and sha256_ok(spec, rng, view)


def check_crc(bucket: str, plan: ObjectPlan, done: dict) -> None:
    """The full-object checksum, combined in order from every segment's, equals the expected.

    ``done``: the CRC of each downloaded range by ``(obj, offset, size)``;
    reused pieces bring their own. A ``FetchVerificationError`` otherwise.
    """
    spec = plan.spec
    if spec.checksum is None:
        return
    _, combine = crc_functions(spec.checksum[0])
    crc = None
    for seg in plan.segments():
        parts = ([(seg.crc, seg.size)] if isinstance(seg, Reuse) else
                 [(done[(r.obj, r.offset, r.size)], r.size) for r in seg.ranges])
        for value, size in parts:
            crc = value if crc is None else combine(crc, value, size)
    if crc is None:
        compute, _ = crc_functions(spec.checksum[0])
        crc = compute(b"")
    if crc != b64_to_int(spec.checksum[1]):
        ours = int_to_b64(crc, spec.checksum[0])
        raise FetchVerificationError(
            f"s3://{bucket}/{spec.key}: the {spec.checksum[0]} of the bytes fetched is "
            f"{ours}, the object's is {spec.checksum[1]}; nothing local was changed")
