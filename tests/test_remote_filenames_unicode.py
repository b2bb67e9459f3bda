"""A program's file names hold no character that can split a line or spoof a name.

The name tests of test_program_names.py cover ``\\n``, NUL, an escape and a C1
control. Unicode has more: the line and paragraph separators U+2028/U+2029
(a log reader or a terminal breaks a line at them), the bidirectional
overrides and isolates U+202A-U+202E, U+2066-U+2069 and the marks
U+200E/U+200F/U+061C (``x\\u202edtp.ptd`` shows as another name), zero-width
characters and the byte-order mark (two names that look the same), and lone
surrogates (what ``os.fsdecode`` makes of a byte that is not UTF-8). Each is
refused by the one rule (:mod:`trtet_store.remote.filenames`), for a
``.ptd`` name and the program's own name alike, by publish before any request
and by fetch from a manifest a bucket writer wrote before any object byte is
downloaded, in one line with the name quoted (escaped).
"""

from __future__ import annotations

import hashlib
import json
import os
import unicodedata
from pathlib import Path

import pytest
from attacker import listing
from test_fetch_support import MiB, b64crc, piece_entries

import trtet_store
from trtet_store.remote import FileNameError
from trtet_store.remote.download.receive import fetch
from trtet_store.remote.filenames import check_program_names, name_problem, plain_name_problem
from trtet_store.remote.manifest import manifest_key

#: Every character the rule refuses beyond the C0/C1 controls, by what it is.
SPOOFS = {
    "line-separator": "\u2028",
    "paragraph-separator": "\u2029",
    "next-line": "\x85",
    "lre": "\u202a", "rle": "\u202b", "pdf": "\u202c", "lro": "\u202d", "rlo": "\u202e",
    "lri": "\u2066", "rli": "\u2067", "fsi": "\u2068", "pdi": "\u2069",
    "lrm": "\u200e", "rlm": "\u200f", "alm": "\u061c",
    "zwsp": "\u200b", "zwnj": "\u200c", "zwj": "\u200d", "word-joiner": "\u2060",
    "bom": "\ufeff", "soft-hyphen": "\xad",
    "lone-high-surrogate": "\ud800", "lone-low-surrogate": "\udfff",
    "fsdecoded-byte": os.fsdecode(b"\xff"),  # '\udcff'
}


@pytest.mark.parametrize("case", sorted(SPOOFS))
def test_every_rule_refuses_the_character(case):
    ch = SPOOFS[case]
    for name in (f"gpu{ch}.ptd", f"{ch}gpu.ptd", f"gpu.ptd{ch}"):
        for why in (name_problem(name), name_problem(name, program=True),
                    plain_name_problem(name)):
            assert why is not None and "control character" in why, (case, name, why)
            assert f"U+{ord(ch):04X}" in why, why
            assert why.isprintable(), why
        with pytest.raises(FileNameError) as err:
            check_program_names(["model.pte", name], "s3://b/p/model.pte")
        message = str(err.value)
        # One printable line, the name quoted with the character escaped.
        assert repr(name) in message and message.isprintable(), message
        assert ch not in message
        with pytest.raises(FileNameError):
            check_program_names([name.replace(".ptd", ".pte")], "s3://b/p/x.pte")


def test_names_in_other_scripts_still_pass():
    """The rule refuses what cannot be shown, not what is not ASCII."""
    for name in ("modèle.ptd", "模型.ptd", "нейросеть.ptd", "a b.ptd", "😀.ptd", "ﬁ.ptd"):
        assert name_problem(name) is None, name
        assert plain_name_problem(name) is None, name
    check_program_names(["modèle.pte", "模型.ptd"], "s3://b/p/modèle.pte")
    # Every assigned character of these categories is refused, and none other.
    refused = {"Cc", "Cf", "Zl", "Zp", "Cs"}
    for code in range(0x10000):
        ch = chr(code)
        if ch in "/\\":
            continue
        bad = name_problem(f"a{ch}.ptd") is not None
        assert bad == (unicodedata.category(ch) in refused), (hex(code), bad)


def test_publish_refuses_an_undecodable_file_name_before_any_request(s3env, tmp_path, proxy):
    pte = tmp_path / "model.pte"
    pte.write_bytes(os.urandom(MiB))
    # A file whose name is not UTF-8 on disk: Python names it with a lone surrogate.
    raw = os.path.join(os.fsencode(tmp_path), b"gpu\xff.ptd")
    with open(raw, "wb") as f:
        f.write(b"weights")
    ptd = Path(os.fsdecode(raw))
    for other in (ptd, tmp_path / "gpu\u202eexe.ptd", tmp_path / "a\u2028b.ptd"):
        other.write_bytes(b"weights")
        with pytest.raises(FileNameError, match="control character") as err:
            trtet_store.publish([pte, other], f"s3://{s3env.bucket}/p/model.pte",
                                endpoint_url=proxy.endpoint_url, journal_dir=s3env.journal_dir)
        assert repr(other.name) in str(err.value) and str(err.value).isprintable()
    assert (proxy.upstream, proxy.downstream) == (0, 0)  # not one request


OBJECT = 4 * MiB


def plant_manifest(s3, prefix: str, names: list[str]) -> str:
    """Objects of OBJECT random bytes and a manifest naming them ``names``, as a bucket writer.

    The manifest (JSON, ``\\u`` escapes) gives each the key ``prefix/name``;
    an object is written there when the key can be sent (a lone surrogate
    cannot be), else at a plain key: a fetch refuses before any HEAD anyway.
    The manifest is the one of ``prefix/model.pte``, whatever ``names[0]`` is.
    """
    objects = []
    for i, name in enumerate(names):
        data = os.urandom(OBJECT)
        key = f"{prefix}/{name}"
        try:
            key.encode()
            put = key
        except UnicodeEncodeError:
            put = f"{prefix}/o{i}"
        etag = s3.client.put_object(Bucket=s3.bucket, Key=put, Body=data,
                                    ChecksumAlgorithm="CRC64NVME")["ETag"].strip('"')
        md5 = hashlib.md5(data).hexdigest()  # noqa: S324 - S3's part ETag
        objects.append({"name": name, "key": key, "size": len(data), "etag": etag,
                        "crc64nvme": b64crc(data), "part_size": 5 * MiB,
                        "parts": [{"number": 1, "offset": 0, "size": len(data), "etag": md5,
                                   "crc64nvme": b64crc(data), "md5": md5}],
                        "pieces": [p.to_dict() for p in piece_entries(data, [OBJECT])]})
    doc = {"format": "trtet-store-manifest", "version": 1, "program": names[0],
           "chunk_size": MiB, "objects": objects}
    s3.client.put_object(Bucket=s3.bucket, Key=manifest_key(f"{prefix}/model.pte"),
                         Body=json.dumps(doc).encode())
    return f"s3://{s3.bucket}/{prefix}/model.pte"


@pytest.mark.parametrize("case", ["line-separator", "paragraph-separator", "rlo", "fsi",
                                  "zwj", "lone-high-surrogate", "fsdecoded-byte"])
def test_fetch_refuses_a_manifest_name_with_it_before_downloading(s3env, here_fs, proxy, case):
    ch = SPOOFS[case]
    (here_fs / ".bashrc").write_bytes(b"# the user's own\n")
    name = f"cpu{ch}.ptd"
    url = plant_manifest(s3env, f"evil-{case}", ["model.pte", "gpu.ptd", name])
    before = listing(here_fs)
    with pytest.raises(FileNameError, match="control character") as err:
        fetch(url, here_fs / "model.pte", endpoint_url=proxy.endpoint_url)
    assert repr(name) in str(err.value) and str(err.value).isprintable()
    assert proxy.downstream < OBJECT // 4, proxy.downstream  # the manifest, no object
    assert listing(here_fs) == before  # nothing written, nothing left
    # The program's own name too.
    url = plant_manifest(s3env, f"evil0-{case}", [f"model{ch}.pte", "gpu.ptd"])
    proxy.reset()
    with pytest.raises(FileNameError, match="control character"):
        fetch(url, here_fs / "model.pte", endpoint_url=proxy.endpoint_url)
    assert proxy.downstream < OBJECT // 4, proxy.downstream
    assert listing(here_fs) == before
