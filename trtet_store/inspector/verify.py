"""verify(): the runtime's structural checks, the ``.pte``/``.ptd`` cross-check, engine digests."""

from __future__ import annotations

import os
from collections.abc import Iterable
from pathlib import Path

from trtet_store.inspector.model import Inspection, Problem, VerifyResult
from trtet_store.inspector.read import inspect_file
from trtet_store.inspector.runtime_probe import run_program


def verify(
    path: os.PathLike | str,
    *,
    data: os.PathLike | str | None = None,
    run: bool = False,
    engine_digests: Iterable[str] | None = None,
) -> VerifyResult:
    """Check a ``.pte`` (with its ``.ptd``) or a ``.ptd`` for structural soundness.

    Every TensorRT delegate blob gets the checks torch-tensorrt 2.14.0's
    ``deserialize_engine`` (and so its runtime) makes: magic, metadata past the
    header and inside the blob, a 16-aligned engine offset past the metadata,
    the engine inside the blob, JSON metadata. Each engine's bytes are read
    once (streamed) for its xxh3-128 digest, which must match its named-data
    key (``<digest>_trt_engine``) and, when given, ``engine_digests``.

    Args:
        path: The file to check.
        data: The ``.ptd`` the ``.pte`` reads external data from; it is
            checked too, and every engine key and external tensor the
            ``.pte`` names must be found in it (or in the ``.pte``).
        engine_digests: The xxh3-128 digests the engines must have (e.g. the
            keys of ``CompileReport.engines`` without ``_trt_engine``); an
            engine whose digest is not among them is an error.
        run: Also load the program with the ExecuTorch runtime
            (``Runtime.get().load_program`` with full verification) and load
            every method whose delegates' backends are registered in this
            runtime (others are reported as skipped). This runs in a child
            process, so a file that crashes the runtime is reported as such
            (with the signal and the step) instead of killing the caller.

    Returns:
        The findings; :attr:`VerifyResult.ok` is False on any error.

    Raises:
        FileNotFoundError: A file does not exist.
        ValueError: ``run`` or ``data`` given for a ``.ptd``.
    """
    main = inspect_file(path)
    result = VerifyResult([main])
    if main.kind == "ptd" and (run or data is not None):
        raise ValueError("--data and --run apply to a .pte; a .ptd is checked on its own")
    ptd: Inspection | None = None
    if data is not None:
        ptd = inspect_file(data)
        result.files.append(ptd)
        if ptd.kind != "ptd":
            result.problems.append(Problem("error", f"{data} is not a .ptd"))
    if main.kind == "pte":
        _cross_check(main, ptd, result)
        _check_engines(main, ptd, result,
                       None if engine_digests is None else set(engine_digests))
    if run and main.kind == "pte":
        result.runtime = run_program(main, ptd, result)
    return result


def _digest_range(path: Path, offset: int, size: int, *, sha256: bool = False) -> tuple[str, str]:
    """xxh3-128 (and SHA-256 when asked, else "") of ``size`` bytes of ``path`` at ``offset``."""
    import hashlib

    import xxhash

    h, sha = xxhash.xxh3_128(), hashlib.sha256() if sha256 else None
    with open(path, "rb") as f:
        f.seek(offset)
        left = size
        while left:
            part = f.read(min(left, 8 << 20))
            if not part:
                raise ValueError(f"{path} ends {left} bytes early")
            h.update(part)
            if sha is not None:
                sha.update(part)
            left -= len(part)
    return h.hexdigest(), sha.hexdigest() if sha is not None else ""


def _key_digest(key: str) -> str | None:
    """The content digest a named engine key carries: ``<xxh3-128 or SHA-256 hex>_trt_engine``."""
    stem = key.removesuffix("_trt_engine")
    if len(stem) in (32, 64) and all(c in "0123456789abcdef" for c in stem):
        return stem
    return None


def _check_engines(pte: Inspection, ptd: Inspection | None, result: VerifyResult,
                   expected: set[str] | None) -> None:
    named = {d["key"]: (ins, d) for ins in ([pte] + ([ptd] if ptd else []))
             for d in ins.named_data if "absolute_offset" in d}
    for d in pte.delegates:
        engine = d.get("tensorrt", {}).get("engine")
        if not engine:
            continue
        where = f"delegate {d['plan']}/{d['index']} ({d['id']})"
        if engine["layout"] == "inline":
            if "file_offset" not in engine or (
                    engine["blob_offset"] + engine["size"] > d.get("size", 0)
                    or engine["file_offset"] + engine["size"] > pte.file_size):
                continue  # in the flatbuffer, or past its blob or file (an error already)
            digest, _ = _digest_range(pte.path, engine["file_offset"], engine["size"])
        else:
            found = named.get(engine["key"])
            if found is None or found[1]["absolute_offset"] + found[1]["size"] > \
                    found[0].file_size:
                continue  # reported by _cross_check, or past the end of its file
            # Ours key engines by xxh3-128, Torch-TensorRT's by SHA-256.
            stored = _key_digest(engine["key"])
            digest, sha = _digest_range(found[0].path, found[1]["absolute_offset"],
                                        found[1]["size"],
                                        sha256=stored is not None and len(stored) == 64)
            if stored is not None and stored not in (digest, sha):
                result.problems.append(Problem(
                    "error", f"{where}: engine {engine['key']!r} has digest "
                    f"{sha or digest}: its bytes are not the ones it was stored under"))
        engine["xxh3_128"] = digest
        if expected is not None and digest not in expected:
            result.problems.append(Problem(
                "error", f"{where}: engine digest {digest} is not one of the expected engines"))


def _cross_check(pte: Inspection, ptd: Inspection | None, result: VerifyResult) -> None:
    known = set(pte.keys) | (ptd.keys if ptd is not None else set())
    for what, key in pte.wanted_keys():
        if key in known:
            continue
        if ptd is None:
            result.problems.append(
                Problem(
                    "warning",
                    f"{what} {key!r} is not in the .pte; it must come from a .ptd "
                    "(pass --data to check it)",
                )
            )
        else:
            result.problems.append(
                Problem("error", f"{what} {key!r} is in neither the .pte nor {ptd.path.name}")
            )


#: Loads the program in a child process: a bad file can crash the 1.5.1 runtime
#: (XNNPACK's load_method segfaults without its .ptd), which must not take the
#: verifier down with it. Prints one JSON event per line; the last is the result.
