"""Publish a real program to a real S3 server (SeaweedFS), and read it back with plain boto3.

The program has stubbed TensorRT engines (staged blobs, read in place) in the
``.pte`` and XNNPACK weights in a ``.ptd``. What is in the bucket must be
byte for byte what ``save_program`` writes, HeadObject's full-object
CRC64NVME must be ours, no local file may be written on the way (peak disk
on the staging filesystem, polled with statvfs), and memory must not grow
with the program.
"""

from __future__ import annotations

import gc
import os
import tracemalloc
from pathlib import Path

import xxhash
from test_fetch_support import assert_nothing_under  # noqa: F401 (test_publish_refusals)

import trtet_store
from trtet_store.bench.measure import (
    PeakDiskMonitor,
    peak_rss_bytes,
    reset_peak_rss,
    return_freed_buffers,
)
from trtet_store.io.units import MiB
from trtet_store.remote import Manifest, manifest_key
from trtet_store.remote.checksum import crc64nvme
from trtet_store.remote.manifest import crc64nvme_b64
from trtet_store.testing.stub_tensorrt import FakeBuilder, installed, linear_relu


def build_program(store: trtet_store.BlobStore, sizes: tuple[int, ...],
                  seeds: tuple[int, ...], ptd: bool = True):
    """A stubbed TensorRT program (engines staged in ``store``), XNNPACK weights in cpu.ptd."""
    from executorch.backends.xnnpack.partition.xnnpack_partitioner import XnnpackPartitioner
    from executorch.exir import ExecutorchBackendConfig

    module, inputs = linear_relu()
    builder = FakeBuilder(engine_sizes=sizes, seeds=seeds, cpu_tail=16 if ptd else 0)
    kwargs = {"partitioners": [XnnpackPartitioner()], "external_weights": "cpu"} if ptd else {}
    with installed(builder):
        edge = trtet_store.export_program(module, arg_inputs=inputs, store=store, **kwargs)
    return edge.to_executorch(ExecutorchBackendConfig(segment_alignment=4096))


def file_xxh3(path: Path) -> str:
    h = xxhash.xxh3_128()
    with open(path, "rb") as f:
        while chunk := f.read(8 * MiB):
            h.update(chunk)
    return h.hexdigest()


def object_xxh3(client, bucket: str, key: str) -> tuple[str, int]:
    """xxh3-128 and CRC64NVME of an object, streamed with plain boto3 GetObject."""
    h, crc = xxhash.xxh3_128(), 0
    body = client.get_object(Bucket=bucket, Key=key)["Body"]
    while chunk := body.read(8 * MiB):
        h.update(chunk)
        crc = crc64nvme(chunk, crc)
    return h.hexdigest(), crc


def saved_digests(program, directory: Path) -> dict[str, Path]:
    """``save_program``'s output files, by name."""
    directory.mkdir(parents=True, exist_ok=True)
    trtet_store.save_program(program, directory / "model.pte")
    return {p.name: p for p in directory.iterdir()}


def _publish_measured(program, url, s3env, mnt: Path, part_size: int):
    """Publish, polling free space on ``mnt``; the peak of the Python heap and of RSS.

    The heap's peak (``tracemalloc``: every part buffer is a ``bytearray``) is what
    the test bounds: it counts this publish's allocations and nothing else. Peak
    RSS growth is kept beside it, an upper bound only: pages an earlier publish
    (or test) frees during this one are reused by it and hide its growth (CI saw
    growth 0.03 MiB for 2 x 8 MiB and for 2 x 256 MiB engines, 48 MiB for 2 x 64).
    """
    gc.collect()
    reset_peak_rss()
    before = peak_rss_bytes()
    tracemalloc.start()
    try:
        heap_before = tracemalloc.get_traced_memory()[0]
        with PeakDiskMonitor(mnt) as disk:
            report = trtet_store.publish(program, url, endpoint_url=s3env.endpoint.url,
                                         part_size=part_size, concurrency=4,
                                         journal_dir=mnt / "journal",
                                         progress=lambda p: disk.sample())
        heap = tracemalloc.get_traced_memory()[1] - heap_before
    finally:
        tracemalloc.stop()
    return report, disk.peak_extra_bytes, heap, peak_rss_bytes() - before


def test_round_trip_of_a_program_with_two_256_mib_engines(s3env, make_fs, here_fs):
    mnt = make_fs("ext4", 1400)
    part = 16 * MiB
    heap, growth = {}, {}
    # Freed part buffers go back to the kernel, so one run's growth is not hidden
    # by pages an earlier run left resident in the heap.
    assert return_freed_buffers()
    # The first, small program loads boto3, botocore's service model, awscrt and the
    # export path once: memory they keep is not the program's. It is checked like the rest.
    for size in (8 * MiB, 64 * MiB, 256 * MiB):
        with trtet_store.BlobStore(mnt / f"staging-{size}") as store:
            program = build_program(store, (size, size), (1, 2))
            url = f"s3://{s3env.bucket}/models/{size}/model.pte"
            report, peak_disk, heap[size], growth[size] = _publish_measured(
                program, url, s3env, mnt, part)

            # No local output: the staging filesystem grew by the journal at most.
            assert peak_disk <= 2 * MiB, peak_disk
            assert not (mnt / "journal").exists() or not any((mnt / "journal").iterdir())

            # The bytes save_program writes, and HeadObject's checksum is ours.
            saved = saved_digests(program, here_fs / f"saved-{size}")
        assert sorted(saved) == ["cpu.ptd", "model.pte"]
        prefix = f"models/{size}/"
        names = {o.name: o for o in report.objects}
        assert sorted(names) == sorted(saved)
        for name, path in saved.items():
            key = prefix + name
            digest, crc = object_xxh3(s3env.client, s3env.bucket, key)
            assert digest == file_xxh3(path), name
            head = s3env.client.head_object(Bucket=s3env.bucket, Key=key, ChecksumMode="ENABLED")
            assert head["ContentLength"] == path.stat().st_size
            assert head["ChecksumCRC64NVME"] == names[name].crc64nvme == crc64nvme_b64(crc)
            assert head["ChecksumType"] == "FULL_OBJECT"
            path.unlink()
        assert report.bytes_sent == report.bytes_total == sum(
            o.size for o in report.objects)
        assert report.bytes_copied == 0 and report.checksum == names["model.pte"].crc64nvme
        assert report.objects[0].parts == -(-names["model.pte"].size // part)

        # The manifest names what is there, and every engine at its place.
        body = s3env.client.get_object(Bucket=s3env.bucket,
                                       Key=manifest_key(prefix + "model.pte"))["Body"].read()
        manifest = Manifest.from_json(body)
        assert [o.key for o in manifest.objects] == [prefix + "model.pte", prefix + "cpu.ptd"]
        for o in manifest.objects:
            head = s3env.client.head_object(Bucket=s3env.bucket, Key=o.key)
            assert head["ETag"].strip('"') == o.etag and head["ContentLength"] == o.size
        engines = [p for p in manifest.objects[0].pieces if p.kind == "file"]
        assert [p.size for p in engines] == [size, size]
        assert_nothing_under_uploads(s3env, prefix)
    # Memory is parts in flight, not the program: concurrency + 1 part buffers
    # and the same within a part for 4x the size.
    print("peak heap by engine size:", {k // MiB: v / MiB for k, v in heap.items()})
    print("peak RSS growth by engine size:", {k // MiB: v / MiB for k, v in growth.items()})
    assert heap[256 * MiB] <= 5 * part + 16 * MiB, heap  # + the reader's 8 MiB window
    assert abs(heap[256 * MiB] - heap[64 * MiB]) <= part, heap
    assert growth[256 * MiB] <= 5 * part + 64 * MiB, growth


def assert_nothing_under_uploads(s3, prefix: str) -> None:
    uploads = s3.client.list_multipart_uploads(Bucket=s3.bucket, Prefix=prefix)
    assert uploads.get("Uploads", []) == []


def test_local_files_round_trip_and_an_empty_object(s3env, tmp_path):
    pte = tmp_path / "a.pte"
    pte.write_bytes(os.urandom(11 * MiB + 7))
    empty = tmp_path / "empty.ptd"
    empty.write_bytes(b"")
    url = f"s3://{s3env.bucket}/files/m.pte"
    report = trtet_store.publish([pte, empty], url, endpoint_url=s3env.endpoint.url,
                                 part_size=5 * MiB, journal_dir=s3env.journal_dir)
    got = s3env.client.get_object(Bucket=s3env.bucket, Key="files/m.pte")["Body"].read()
    assert got == pte.read_bytes()
    assert s3env.client.get_object(Bucket=s3env.bucket,
                                   Key="files/empty.ptd")["Body"].read() == b""
    assert [o.parts for o in report.objects] == [3, 1]
    assert report.bytes_sent == 11 * MiB + 7


def test_pieces_from_bytes_a_blob_and_a_file_range(s3env, here_fs):
    """An object made of io pieces: inline bytes, a staged blob read in place, a file's range."""
    from trtet_store.io import ExternalFile
    from trtet_store.remote.upload.send import publish_sources
    from trtet_store.remote.upload.source import ObjectSource

    big = here_fs / "weights.bin"
    data = os.urandom(9 * MiB + 3)
    big.write_bytes(data)
    with trtet_store.BlobStore(here_fs / "staging") as store:
        with store.writer() as w:
            w.write(os.urandom(7 * MiB + 1))
        blob = w.blob
        head = b"header" * 1000
        pieces = [head, blob, ExternalFile.range(big, 1234, 6 * MiB), b"", b"tail"]
        report = publish_sources([ObjectSource("m.pte", pieces)],
                                 f"s3://{s3env.bucket}/pieces/m.pte",
                                 endpoint_url=s3env.endpoint.url, part_size=5 * MiB,
                                 journal_dir=s3env.journal_dir)
        expected = head + Path(blob.path).read_bytes() + data[1234:1234 + 6 * MiB] + b"tail"
    got = s3env.client.get_object(Bucket=s3env.bucket, Key="pieces/m.pte")["Body"].read()
    assert got == expected and report.bytes_sent == len(expected)
    body = s3env.client.get_object(Bucket=s3env.bucket,
                                   Key=manifest_key("pieces/m.pte"))["Body"].read()
    pieces_meta = Manifest.from_json(body).objects[0].pieces
    assert [(p.kind, p.size) for p in pieces_meta] == [
        ("inline", len(head)), ("file", 7 * MiB + 1), ("file", 6 * MiB), ("inline", 0),
        ("inline", 4)]
    assert pieces_meta[2].xxh3 == xxhash.xxh3_128_hexdigest(data[1234:1234 + 6 * MiB])
    assert list(pieces_meta[2].chunks) == [
        xxhash.xxh3_64_intdigest(data[1234 + i:1234 + min(i + MiB, 6 * MiB)])
        for i in range(0, 6 * MiB, MiB)]
