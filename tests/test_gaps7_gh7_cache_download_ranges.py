"""A range longer than a piece (``remote.download.ranges``): a bad piece retried from itself,
a piece whose sha256 is not the signed one refused at once, and nothing of it staged.

``RangeDownload._one_range`` (trtet_store.remote.download.ranges) hands a range of more
than :data:`PIECE_SIZE` over in pieces (``pieces_of``) as they arrive and check
(``chunks_ok`` by xxh3, ``sha256_ok`` by a signed manifest's sha256). Two states no other
test of this module sets up:

- a byte flipped in the middle of a range (the loopback proxy's ``flip``): the bad piece
  fails its chunk digests (``_BadPiece``), and the range is retried from that piece, not
  from its start and not given up on;
- a signed program whose manifest (the xxh3 forger's, signed by the team key) names a
  middle piece's bytes by another sha256: ``ProgramSignatureError`` at once (no network
  fault makes that, so no retry), and the pieces already journaled are discarded with
  the staging (``stage.discard``), never resumed.

The bucket writer is boto3 on SeaweedFS.
"""

from __future__ import annotations

import base64
import hashlib
import json
import os
from pathlib import Path
from typing import Any

import pytest
import xxhash
from attacker import tree
from keyed import with_keys
from tcp_proxy import Fault
from test_fetch_support import MiB, engine_bytes, put_program

import trtet_store
from trtet_store.remote.checksum import crc64nvme
from trtet_store.remote.download import ranges
from trtet_store.remote.download.ranges import PIECE_SIZE, pieces_of
from trtet_store.remote.download.receive import fetch
from trtet_store.remote.errors import ProgramSignatureError
from trtet_store.remote.manifest import SIGNATURE_DOMAIN
from trtet_store.testing.s3server import S3Endpoint

RANGE = 3 * PIECE_SIZE  # 12 MiB: three pieces


def test_pieces_of_cuts_a_long_range_on_the_chunk_grid() -> None:
    from trtet_store.remote.download.plan import ObjectSpec, Range
    from trtet_store.remote.manifest import PieceEntry

    size = RANGE + MiB + 7
    piece = PieceEntry(0, size, "file", "0" * 32, tuple(range(size // MiB + 1)))
    spec = ObjectSpec("m.pte", "p/m.pte", size, "e", None, (piece,), MiB)
    whole = Range(0, 0, 0, RANGE)
    cut = ranges.pieces_of(spec, whole)
    assert [(r.offset, r.size) for r in cut] == [(0, PIECE_SIZE), (PIECE_SIZE, PIECE_SIZE),
                                                 (2 * PIECE_SIZE, PIECE_SIZE)]
    assert pieces_of(spec, Range(0, 0, RANGE, MiB + 7)) == [Range(0, 0, RANGE, MiB + 7)]
    assert pieces_of(spec, Range(0, 0, 0, PIECE_SIZE)) == [Range(0, 0, 0, PIECE_SIZE)]


def _ranged(key: str, offset: int):
    def match(m) -> bool:
        return (m.request is not None and m.target.split("?")[0].endswith(key)
                and m.request.headers.get("range", "").startswith(f"bytes={offset}-"))
    return match


def _asks(seen: list) -> Fault:
    """A rule that never fires: it notes each request's (path, Range header)."""
    def note(m) -> bool:
        seen.append((m.target.split("?")[0], m.headers.get("range")))
        return False
    return Fault("request", "flip", at=1 << 40, match=note)


def test_a_piece_that_fails_its_digests_is_retried_from_itself(s3, here_fs, tcp_proxy):
    """One byte flipped in the second piece of the second range: that range is retried once,
    asking only from the bad piece on; the program is placed whole and right."""
    data = engine_bytes(701, 2 * RANGE + MiB + 3)
    put_program(s3.client, s3.bucket, "p", {"model.pte": (data, [len(data)])})
    seen: list = []
    proxy = tcp_proxy(s3.endpoint.url, [
        Fault("response", "flip", at=PIECE_SIZE + 12345, match=_ranged("p/model.pte", RANGE)),
        _asks(seen)])
    dest = here_fs / "model.pte"
    client = S3Endpoint(proxy.url).client(retries={"max_attempts": 1}, read_timeout=5)
    report = fetch(f"s3://{s3.bucket}/p/model.pte", dest, client=client, range_size=RANGE,
                   concurrency=1, attempts=2)
    assert len(proxy.fired) == 1
    assert dest.read_bytes() == data
    assert report.retries == 1, report
    # The flipped piece and what follows it again, not the range's first (checked) piece:
    # under a range more than the program.
    assert len(data) + PIECE_SIZE <= report.bytes_downloaded < len(data) + 2 * PIECE_SIZE, \
        report.bytes_downloaded
    ask = [r for _, r in seen if r]
    assert f"bytes={RANGE + PIECE_SIZE}-{2 * RANGE - 1}" in ask, ask
    assert sorted(os.listdir(here_fs)) == ["model.pte"]


# --- signed: a middle piece's sha256 is not the signed one -----------------------------------

@pytest.fixture
def env(s3env: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Any:
    with_keys(s3env, tmp_path, monkeypatch)
    s3env.url = f"s3://{s3env.bucket}/m/model.pte"
    return s3env


def test_a_piece_whose_sha256_is_not_the_signed_one_is_refused_at_once_and_not_staged(
        env: Any, here_fs: Path, tcp_proxy: Any) -> None:
    src = here_fs / "src"
    src.mkdir()
    (src / "model.pte").write_bytes(engine_bytes(711, MiB + 5))
    honest = engine_bytes(712, RANGE - MiB + 9)  # one range of three pieces (the last short)
    (src / "cpu.ptd").write_bytes(honest)
    trtet_store.publish([os.fspath(src / "model.pte"), os.fspath(src / "cpu.ptd")], env.url,
                        endpoint_url=env.endpoint.url, journal_dir=env.journal_dir,
                        signing_key=env.keys / "team.key")
    # The forger's bytes differ in one chunk of the second piece; the manifest's xxh3, CRC
    # and ETag fields are theirs, its sha256 fields the publisher's; signed by the team key.
    evil = bytearray(honest)
    evil[PIECE_SIZE + MiB + 100] ^= 0xFF
    evil = bytes(evil)
    mkey = "m/model.pte.trtet.json"
    doc = json.loads(env.client.get_object(Bucket=env.bucket, Key=mkey)["Body"].read())
    o = doc["objects"][1]
    env.client.put_object(Bucket=env.bucket, Key=o["key"], Body=evil,
                          ChecksumAlgorithm="CRC64NVME")
    o["etag"] = env.client.head_object(Bucket=env.bucket, Key=o["key"])["ETag"].strip('"')
    o["crc64nvme"] = base64.b64encode(crc64nvme(evil).to_bytes(8, "big")).decode()
    o["pieces"][0]["xxh3"] = xxhash.xxh3_128_hexdigest(evil)
    o["pieces"][0]["chunks"] = [xxhash.xxh3_64_intdigest(evil[i:i + MiB])
                                for i in range(0, len(evil), MiB)]
    assert o["sha256"] == hashlib.sha256(honest).hexdigest()
    from trtet_store.remote.keys import load_signing_key
    from trtet_store.remote.signing import sign_document

    bare = {k: v for k, v in doc.items() if k != "signatures"}
    env.client.put_object(Bucket=env.bucket, Key=mkey, Body=sign_document(
        bare, load_signing_key(env.keys / "team.key"), SIGNATURE_DOMAIN))

    out = here_fs / "out"
    out.mkdir()
    seen: list = []
    proxy = tcp_proxy(env.endpoint.url, [_asks(seen)])
    client = S3Endpoint(proxy.url).client(retries={"max_attempts": 1}, read_timeout=5)
    with pytest.raises(ProgramSignatureError) as caught:
        trtet_store.fetch(env.url, out / "model.pte", client=client, range_size=RANGE,
                          concurrency=1, attempts=3,
                          trusted_keys=[env.keys / "team.key.pub"])
    text = str(caught.value)
    assert f"m/cpu.ptd bytes {PIECE_SIZE}-{2 * PIECE_SIZE - 1}: their sha256 is not the " \
        "one the signed manifest names" in text, text
    # Refused at once: the .ptd's range asked for once, never retried.
    asks = [r for path, r in seen if path.endswith("m/cpu.ptd") and r]
    assert len(asks) == 1, asks
    # Nothing placed; the first piece (which checked) not kept staged for a resume.
    assert [n for n in tree(out) if n.endswith((".run", ".journal", ".blob"))] == []
    assert os.listdir(out) in ([], [".trtet-staging"]), os.listdir(out)


def test_a_piece_bad_on_every_attempt_gives_up_and_changes_nothing(s3, here_fs, tcp_proxy):
    """The same byte flipped on each of the two attempts: FetchVerificationError naming the
    range and the attempts; nothing placed."""
    from trtet_store.remote.errors import FetchVerificationError

    data = engine_bytes(702, 2 * RANGE + MiB + 3)
    put_program(s3.client, s3.bucket, "p", {"model.pte": (data, [len(data)])})
    proxy = tcp_proxy(s3.endpoint.url, [
        Fault("response", "flip", at=PIECE_SIZE + 12345, match=_ranged("p/model.pte", RANGE)),
        Fault("response", "flip", at=12345,
              match=_ranged("p/model.pte", RANGE + PIECE_SIZE))])
    dest = here_fs / "model.pte"
    client = S3Endpoint(proxy.url).client(retries={"max_attempts": 1}, read_timeout=5)
    with pytest.raises(FetchVerificationError) as caught:
        fetch(f"s3://{s3.bucket}/p/model.pte", dest, client=client, range_size=RANGE,
              concurrency=1, attempts=2)
    assert not isinstance(caught.value, ProgramSignatureError)
    assert f"bytes {RANGE}-{2 * RANGE - 1} did not match the manifest's chunk digests in 2 " \
        "attempts" in str(caught.value), caught.value
    assert len(proxy.fired) == 2
    assert not dest.exists()
