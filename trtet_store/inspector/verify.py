"""verify(): the runtime's structural checks, the ``.pte``/``.ptd`` cross-check, engine digests."""

from __future__ import annotations

import os
import re
from collections.abc import Iterable
from pathlib import Path
from typing import Any

from trtet_store.inspector.model import Inspection, Problem, VerifyResult
from trtet_store.inspector.read import inspect_file
from trtet_store.inspector.runtime_probe import run_program

#: Bytes of a delegate blob (not TensorRT) searched for the ``.ptd`` keys it
#: names: XNNPACK writes its flatbuffer, which holds the keys, first.
DELEGATE_SCAN_LIMIT = 16 << 20


def parse_engine_digest(text: str) -> str:
    """An xxh3-128 digest as ``--engine-digest`` and ``engine_digests`` take it.

    Accepts the 32 hex digits, in either case, or a named-data key
    ``<digest>_trt_engine`` (the keys of ``CompileReport.engines``).

    Raises
    ------
    ValueError
        If ``text`` is not 32 hex digits (with or without the suffix).
    """
    if not isinstance(text, str):
        raise ValueError(f"engine digest {text!r} is not a string")
    stem = text.strip().lower().removesuffix("_trt_engine")
    if len(stem) != 32 or any(c not in "0123456789abcdef" for c in stem):
        raise ValueError(f"engine digest {text!r} is not an xxh3-128 digest (32 hex digits, "
                         "as CompileReport.engines lists them)")
    return stem


def verify(
    path: os.PathLike | str,
    *,
    data: os.PathLike | str | None = None,
    run: bool = False,
    engine_digests: Iterable[str] | None = None,
) -> VerifyResult:
    """Check a ``.pte`` (with its ``.ptd`` files) or a ``.ptd`` for structural soundness.

    Every TensorRT delegate blob gets the checks torch-tensorrt 2.14.0's
    ``deserialize_engine`` (and so its runtime) makes: magic, metadata past the
    header and inside the blob, a 16-aligned engine offset past the metadata,
    the engine inside the blob; and its JSON metadata is checked against what
    the runtime reads of it (every field by name, type and order, the bindings
    against the delegate's call). Each engine's bytes are read once (streamed)
    for its xxh3-128 digest, which must match its named-data key
    (``<digest>_trt_engine``) and, when given, ``engine_digests``; every digest
    computed is in :attr:`VerifyResult.engines`. Nothing in the file records
    the digest of an inline engine (the runtime reads every byte we could put
    it in), so without ``engine_digests`` a changed engine byte is found only
    by comparing those digests with the build's.

    A ``.pte`` that needs data from ``.ptd`` files (engine keys, external
    tensors, and the named data its delegates refer to) says so in
    :attr:`VerifyResult.external_data`: which keys, and which ``.ptd`` holds
    each, from ``data`` or, without it, from the ``.ptd`` files next to it.

    Args:
        path: The file to check.
        data: The ``.ptd`` the ``.pte`` reads external data from; it is
            checked too, and every engine key and external tensor the
            ``.pte`` names must be found in it (or in the ``.pte``). Without
            it, the ``.ptd`` files next to the ``.pte`` are looked at.
        engine_digests: The xxh3-128 digests the engines must have (e.g. the
            keys of ``CompileReport.engines``, with or without
            ``_trt_engine``); an engine whose digest is not among them is an
            error.
        run: Also load the program with the ExecuTorch runtime
            (``Runtime.get().load_program`` with full verification) and load
            every method whose delegates' backends are registered in this
            runtime (others are reported as skipped). This runs in a child
            process, so a file that crashes the runtime is reported as such
            (with the signal and the step) instead of killing the caller.
            Only ``data`` is given to the runtime.

    Returns:
        The findings; :attr:`VerifyResult.ok` is False on any error.

    Raises:
        FileNotFoundError: A file does not exist.
        ValueError: ``run`` or ``data`` given for a ``.ptd``, or an
            ``engine_digests`` entry that is not an xxh3-128 digest.
    """
    expected = None if engine_digests is None else {
        parse_engine_digest(d) for d in ([engine_digests] if isinstance(engine_digests, str)
                                         else engine_digests)}
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
        found = _external_data(main, ptd, result)
        _check_engines(main, found, result, expected)
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


def _check_engines(pte: Inspection, ptds: list[Inspection], result: VerifyResult,
                   expected: set[str] | None) -> None:
    named = {d["key"]: (ins, d) for ins in [pte, *ptds]
             for d in ins.named_data if "absolute_offset" in d}
    for d in pte.delegates:
        engine = d.get("tensorrt", {}).get("engine")
        if not engine:
            continue
        where = f"delegate {d['plan']}/{d['index']} ({d['id']})"
        record: dict[str, Any] = {"delegate": f"{d['plan']}/{d['index']}",
                                  "layout": engine["layout"]}
        if engine["layout"] == "inline":
            if "file_offset" not in engine or (
                    engine["blob_offset"] + engine["size"] > d.get("size", 0)
                    or engine["file_offset"] + engine["size"] > pte.file_size):
                continue  # in the flatbuffer, or past its blob or file (an error already)
            digest, _ = _digest_range(pte.path, engine["file_offset"], engine["size"])
            record.update({"file": pte.path, "offset": engine["file_offset"],
                           "size": engine["size"]})
        else:
            found = named.get(engine["key"])
            if found is None or found[1]["absolute_offset"] + found[1]["size"] > \
                    found[0].file_size:
                continue  # reported by _external_data, or past the end of its file
            # Ours key engines by xxh3-128, Torch-TensorRT's by SHA-256.
            stored = _key_digest(engine["key"])
            digest, sha = _digest_range(found[0].path, found[1]["absolute_offset"],
                                        found[1]["size"],
                                        sha256=stored is not None and len(stored) == 64)
            record.update({"key": engine["key"], "file": found[0].path,
                           "offset": found[1]["absolute_offset"], "size": found[1]["size"]})
            if sha:
                record["sha256"] = sha
            if stored is not None and stored not in (digest, sha):
                result.problems.append(Problem(
                    "error", f"{where}: engine {engine['key']!r} has digest "
                    f"{sha or digest}: its bytes are not the ones it was stored under"))
        engine["xxh3_128"] = digest
        record["xxh3_128"] = digest
        record["expected"] = None if expected is None else digest in expected
        result.engines.append(record)
        if expected is not None and digest not in expected:
            result.problems.append(Problem(
                "error", f"{where}: engine digest {digest} is not one of the expected engines"))


#: How XNNPACK names a weight it keeps as named data: the SHA-256 hex digest
#: of its bytes (``executorch/backends/xnnpack/operators/node_visitor.py``),
#: stored in its flatbuffer as a string (u32 length 64, the digits, a NUL).
_XNNPACK_KEY = re.compile(rb"\x40\x00\x00\x00([0-9a-f]{64})\x00")
XNNPACK_ID = "XnnpackBackend"


def _delegate_refs(pte: Inspection, candidates: set[str]) -> dict[str, str]:
    """Named-data keys the delegate blobs (not TensorRT's) refer to: key -> which delegate.

    ExecuTorch delegates refer to named data by key from inside their own
    blob. XNNPACK's keys are read out of its flatbuffer (SHA-256 digests);
    for other backends the keys a ``.ptd`` offers (``candidates``) are looked
    for, verbatim. Only the first :data:`DELEGATE_SCAN_LIMIT` bytes of each
    delegate segment are read.
    """
    refs: dict[str, str] = {}
    with open(pte.path, "rb") as f:
        for d in pte.delegates:
            if "tensorrt" in d or "absolute_offset" not in d:
                continue
            size = min(d.get("size", 0), DELEGATE_SCAN_LIMIT)
            blob = os.pread(f.fileno(), size, d["absolute_offset"])
            what = f"named data of delegate {d['plan']}/{d['index']} ({d['id']})"
            if d["id"] == XNNPACK_ID:
                for m in _XNNPACK_KEY.finditer(blob):
                    refs.setdefault(m.group(1).decode(), what)
            for key in candidates - set(refs):
                if key.encode() in blob:
                    refs[key] = what
    return refs


def _check_xnnpack_weight(key: str, holder: Inspection, result: VerifyResult) -> str | None:
    """An XNNPACK weight's bytes against its key, their SHA-256: the .ptd is this program's.

    Returns the SHA-256 computed (None when the entry is out of its file).
    """
    entry = next(d for d in holder.named_data if d["key"] == key)
    if "absolute_offset" not in entry or entry["absolute_offset"] + entry["size"] > \
            holder.file_size:
        return None  # an error of the .ptd's own already
    _, sha = _digest_range(holder.path, entry["absolute_offset"], entry["size"], sha256=True)
    if sha != key:
        result.problems.append(Problem(
            "error", f"XNNPACK weight {key[:16]}... in {holder.path.name} has SHA-256 "
            f"{sha[:16]}...: its bytes are not the ones the program was built with"))
    return sha


def _beside(pte: Inspection) -> list[Inspection]:
    """The ``.ptd`` files next to ``pte``, inspected (headers only); others are passed over."""
    found = []
    for p in sorted(pte.path.parent.glob("*.ptd")):
        try:
            ins = inspect_file(p)
        except OSError:
            continue  # vanished, or a directory named *.ptd
        if ins.kind == "ptd":
            found.append(ins)
    return found


def _external_data(pte: Inspection, given: Inspection | None,
                   result: VerifyResult) -> list[Inspection]:
    """What ``pte`` needs from ``.ptd`` files and where it is; returns the ``.ptd`` files used.

    With ``given`` (``--data``) only that file counts; a key it lacks is an
    error. Without it, the ``.ptd`` files next to the ``.pte`` are looked at:
    a key none of them holds is an error when there are some (they are not
    this program's data), a warning when there are none (the data may live
    elsewhere).
    """
    candidates = [given] if given is not None else _beside(pte)
    how = "given" if given is not None else "next to it"
    needed = [(what, key) for what, key in pte.wanted_keys() if key not in pte.keys]
    offered = {key for c in candidates for key in c.keys} - pte.keys
    listed = {key for _, key in needed}
    refs = {k: w for k, w in _delegate_refs(pte, offered - listed).items()
            if k not in pte.keys and k not in listed}
    needed += [(what, key) for key, what in sorted(refs.items(), key=lambda kv: kv[1])]
    if not needed:
        return [given] if given is not None else []
    entries, used = [], []
    for what, key in needed:
        holder = next((c for c in candidates if key in c.keys), None)
        entries.append({"what": what, "key": key,
                        "found_in": holder.path if holder is not None else None})
        if holder is not None and all(u is not holder for u in used):
            used.append(holder)
        if holder is None:
            _report_missing(pte, given, candidates, what, key, result)
        elif key in pte.external_layouts:
            _check_layout(key, pte.external_layouts[key], holder, result)
        elif what.endswith(f"({XNNPACK_ID})"):
            sha = _check_xnnpack_weight(key, holder, result)
            if sha is not None:
                entries[-1]["sha256"] = sha  # every digest computed is shown
    for c in used:
        if all(f is not c for f in result.files):
            result.files.append(c)  # its own structure is checked too
    result.external_data = {
        "needed": entries,
        "files": [{"path": c.path, "how": how,
                   "holds": sum(1 for e in entries if e["found_in"] == c.path)}
                  for c in candidates],
        "complete": all(e["found_in"] is not None for e in entries),
    }
    return used if given is None else [given]


def _report_missing(pte: Inspection, given: Inspection | None, candidates: list[Inspection],
                    what: str, key: str, result: VerifyResult) -> None:
    if given is not None:
        result.problems.append(
            Problem("error", f"{what} {key!r} is in neither the .pte nor {given.path.name}"))
    elif candidates:
        names = ", ".join(c.path.name for c in candidates)
        result.problems.append(Problem(
            "error", f"{what} {key!r} is not in the .pte nor in any .ptd next to it "
            f"({names}): these files are not this program's data, and the runtime cannot "
            "load it with them (pass --data to check another .ptd)"))
    else:
        result.problems.append(Problem(
            "warning", f"{what} {key!r} is not in the .pte; it must come from a .ptd, and "
            "none is next to it (pass --data to check it)"))


def _check_layout(key: str, want: dict[str, Any], holder: Inspection,
                  result: VerifyResult) -> None:
    """An external tensor's layout in the ``.ptd`` against what the program expects."""
    entry = next(d for d in holder.named_data if d["key"] == key)
    got = entry.get("tensor_layout")
    if got is None:
        result.problems.append(Problem(
            "error", f"external tensor {key!r} in {holder.path.name} has no tensor layout"))
    elif (got["scalar_type"], list(got["sizes"])) != (want["scalar_type"], want["sizes"]):
        result.problems.append(Problem(
            "error", f"external tensor {key!r} is {got['scalar_type']}{got['sizes']} in "
            f"{holder.path.name}, but the program expects {want['scalar_type']}"
            f"{want['sizes']}: the .ptd is not this program's data"))


#: Loads the program in a child process: a bad file can crash the 1.5.1 runtime
#: (XNNPACK's load_method segfaults without its .ptd), which must not take the
#: verifier down with it. Prints one JSON event per line; the last is the result.
