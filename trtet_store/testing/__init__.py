"""Fixtures tests and benchmarks share: the S3 server, the stub TensorRT builder, loop filesystems.

:mod:`.s3server` (SeaweedFS on 127.0.0.1), :mod:`.stub_tensorrt` (the one
seam where a TensorRT build is replaced) and :mod:`.loopfs` (dedicated
ext4/XFS/btrfs loop filesystems and tmpfs). They may import :mod:`trtet_store.io`
and :mod:`trtet_store.export`; only ``bench/``, ``tests/`` and
``benchmarks/`` import them, never the product.
"""
