"""The TensorRT delegate blob's codecs: round trip and refusals, as ExecuTorch tests its headers."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from trtet_store.export import trt_blob

names = st.text(st.characters(blacklist_categories=("Cs",)), max_size=12)
bindings = st.builds(trt_blob.IOBinding, names, st.sampled_from(["", "float32", "int64"]),
                     st.lists(st.integers(0, 1 << 20), max_size=4).map(tuple), st.booleans())
metadata = st.builds(
    trt_blob.BlobMetadata,
    io_bindings=st.lists(bindings, max_size=5).map(tuple),
    aliased_io=st.lists(st.tuples(names, names, st.sampled_from(["kv_cache_update", "user"])),
                        max_size=2).map(tuple),
    hardware_compatible=st.booleans(), device_id=st.integers(0, 15),
    serialized_metadata=names, target_platform=names,
    engine_key=st.none() | st.text("0123456789abcdef", min_size=32, max_size=32))


@given(meta=metadata, engine=st.binary(max_size=300),
       alignment=st.sampled_from([16, 64, 4096]))
def test_encode_then_decode_gives_back_what_went_in(meta, engine, alignment):
    blob = trt_blob.encode(meta, engine, alignment=alignment)
    header, got_meta, got_engine = trt_blob.decode(blob)
    assert (got_meta, got_engine) == (meta, engine)
    assert header.engine_offset % alignment == 0
    assert header.magic == (trt_blob.MAGIC_ALIASED_IO if meta.aliased_io else trt_blob.MAGIC)
    assert trt_blob.BlobHeader.from_bytes(header.to_bytes()) == header
    assert trt_blob.prefix(meta, len(engine), alignment=alignment) == blob[:header.engine_offset]


@pytest.mark.parametrize(("field", "value", "message"), [
    ("magic", b"TRXX", "magic"),
    ("engine_offset", 40, "16-byte aligned"),
    ("metadata_offset", 8, "overlaps"),
    ("metadata_size", 1 << 20, "overlaps"),
])
def test_a_bad_header_is_refused(field, value, message):
    good = trt_blob.BlobHeader.from_bytes(trt_blob.encode(trt_blob.BlobMetadata(), b"x" * 64))
    bad = trt_blob.BlobHeader(**{**vars(good), field: value})
    with pytest.raises(ValueError, match=message):
        trt_blob.BlobHeader.from_bytes(bad.to_bytes())


def test_short_blobs_and_engines_past_the_end_are_refused():
    with pytest.raises(ValueError, match="shorter than its header"):
        trt_blob.BlobHeader.from_bytes(b"TR01")
    blob = trt_blob.encode(trt_blob.BlobMetadata(), b"e" * 100)
    with pytest.raises(ValueError, match="past the end"):
        trt_blob.decode(blob[:-1])
    with pytest.raises(ValueError, match="multiple of 16"):
        trt_blob.prefix(trt_blob.BlobMetadata(), 1, alignment=24)
