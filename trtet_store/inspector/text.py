"""The findings as readable text."""

from __future__ import annotations

from trtet_store.inspector.model import Inspection, VerifyResult, show_bytes
from trtet_store.io.units import GiB, KiB, MiB


def _size(n: int | None) -> str:
    if n is None:
        return "-"
    for unit, div in (("GiB", GiB), ("MiB", MiB), ("KiB", KiB)):
        if n >= div:
            return f"{n} ({n / div:.1f} {unit})"
    return str(n)


def format_inspection(ins: Inspection) -> str:
    """The layout as readable text."""
    lines = [f"{ins.path}: {ins.kind}, {_size(ins.file_size)} bytes"]
    if ins.header:
        lines.append("header:")
        for k, v in ins.header.items():
            shown = show_bytes(v) if isinstance(v, bytes) else v
            lines.append(f"  {k}: {shown}")
    if ins.program:
        lines.append("program: " + ", ".join(f"{k}={v}" for k, v in ins.program.items()))
    for p in ins.plans:
        lines.append(
            f"plan {p['name']!r}: {p['inputs']} inputs, {p['outputs']} outputs, "
            f"{p['instructions']} instructions, {p['delegates']} delegates, "
            f"operators {p['operators'] or '[]'}"
        )
    if ins.segments:
        lines.append("segments:")
        lines.append(f"  {'#':>3}  {'absolute':>14}  {'size':>14}  {'page':>4}  used by")
        for s in ins.segments:
            lines.append(
                f"  {s['index']:>3}  {s['absolute_offset']:>14}  {s['size']:>14}  "
                f"{'yes' if s['page_aligned'] else 'no':>4}  {', '.join(s['used_by']) or '-'}"
            )
    if ins.named_data:
        lines.append("named data:")
        for d in ins.named_data:
            extra = ""
            if "tensor_layout" in d:
                tl = d["tensor_layout"]
                extra = f" {tl['scalar_type']}{tl['sizes']}"
            lines.append(
                f"  {d['key']}: segment {d['segment_index']}, at {d.get('absolute_offset', '?')}, "
                f"{_size(d.get('size'))} bytes{extra}"
            )
    if ins.delegates:
        lines.append("delegates:")
        for d in ins.delegates:
            lines.append(
                f"  {d['plan']}/{d['index']}: {d['id']}, {d['location']} {d['data_index']}, "
                f"{_size(d.get('size'))} bytes"
                + (f" at {d['absolute_offset']}" if "absolute_offset" in d else "")
            )
            if d["compile_specs"]:
                specs = ", ".join(f"{k}={v}" for k, v in d["compile_specs"].items())
                lines.append(f"    compile specs: {specs}")
            trt = d.get("tensorrt")
            if trt:
                h = trt.get("header", {})
                lines.append(
                    f"    TensorRT blob {show_bytes(h.get('magic', b''))}: metadata "
                    f"{h.get('metadata_size')} B at {h.get('metadata_offset')}, engine "
                    f"{h.get('engine_size')} B at {h.get('engine_offset')}"
                )
                engine = trt.get("engine", {})
                digest = f", xxh3-128 {engine['xxh3_128']}" if "xxh3_128" in engine else ""
                if engine.get("layout") == "inline":
                    where = (f"at file offset {engine['file_offset']} (aligned to "
                             f"{engine['alignment']})" if "file_offset" in engine else "")
                    lines.append(f"    engine: inline, {_size(engine['size'])} bytes "
                                 f"{where}{digest}")
                elif engine.get("layout") == "named":
                    lines.append(f"    engine: named data {engine['key']!r} (in a .ptd; no "
                                 f"released runtime reads this layout){digest}")
                meta = trt.get("metadata")
                if isinstance(meta, dict):
                    for k, v in meta.items():
                        lines.append(f"      {k}: {v}")
    if ins.external_tensors:
        lines.append(f"external tensors (in a .ptd): {', '.join(ins.external_tensors)}")
    if ins.problems:
        lines.append("problems:")
        lines += [f"  {p.severity}: {p.message}" for p in ins.problems]
    else:
        lines.append("problems: none")
    return "\n".join(lines)


def format_verify(result: VerifyResult) -> str:
    """The verification as readable text, one line per finding."""
    lines = []
    for ins in result.files:
        status = "ok" if not ins.errors else f"{len(ins.errors)} error(s)"
        lines.append(f"{ins.path}: {ins.kind}, {ins.file_size} bytes: {status}")
        lines += [f"  {p.severity}: {p.message}" for p in ins.problems]
    lines += _external_data_lines(result)
    lines += _engine_lines(result)
    lines += [f"{p.severity}: {p.message}" for p in result.problems]
    if result.runtime is not None:
        rt = result.runtime
        if rt.get("loaded"):
            lines.append("runtime: program loaded")
            for name, state in rt.get("methods", {}).items():
                lines.append(f"  method {name}: {state}")
        else:
            lines.append(f"runtime: not loaded ({rt.get('error') or rt.get('skipped')})")
        if rt.get("loaded") and rt.get("error"):
            lines.append(f"runtime: {rt['error']}")
    lines.append("OK" if result.ok else "FAILED")
    return "\n".join(lines)


def _external_data_lines(result: VerifyResult) -> list[str]:
    """What the ``.pte`` needs from ``.ptd`` files, and where each key was found."""
    ext = result.external_data
    if not ext:
        return []
    needed = ext["needed"]
    lines = [f"external data: the program needs {len(needed)} key(s) from .ptd files"]
    for e in needed:
        where = (f"in {e['found_in'].name}" if e["found_in"] is not None
                 else "NOT FOUND in the .ptd files looked at")
        if "sha256" in e:
            where += f", sha256 {e['sha256']}" + (" (its key)" if e["sha256"] == e["key"]
                                                   else " (NOT its key)")
        lines.append(f"  {e['key']} ({e['what']}): {where}")
    files = ext["files"]
    if files:
        lines.append("  looked at: " + ", ".join(
            f"{f['path'].name} ({f['how']}, holds {f['holds']})" for f in files))
    else:
        lines.append("  no .ptd next to it")
    if not files or files[0]["how"] != "given":
        lines.append("  (pass --data FILE.ptd to check another file, and to load it with --run)")
    lines.append("  complete: the runtime finds every key in these files" if ext["complete"]
                 else "  incomplete: the runtime cannot load the program with these files")
    return lines


def _engine_lines(result: VerifyResult) -> list[str]:
    """Every engine digest computed, so that it can be compared with the build's."""
    if not result.engines:
        return []
    lines = ["engines (xxh3-128 of the bytes read; compare with CompileReport.engines, or "
             "pass --engine-digest):"]
    for e in result.engines:
        check = {None: "", True: ", expected", False: ", NOT an expected digest"}[e["expected"]]
        sha = f", sha256 {e['sha256']}" if "sha256" in e else ""
        lines.append(f"  {e['delegate']}: {e['layout']} in {e['file'].name} at {e['offset']}, "
                     f"{_size(e['size'])} bytes, xxh3-128 {e['xxh3_128']}{sha}{check}")
    return lines
