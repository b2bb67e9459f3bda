"""verify --run: the program loaded, and each method run, in a child process."""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
from typing import Any

from trtet_store.inspector.common import RUNTIME_TIMEOUT
from trtet_store.inspector.model import Inspection, Problem, VerifyResult

#: ExecuTorch ScalarType codes of the inputs a probe can make zeros for.
_DTYPES = {0: "uint8", 1: "int8", 2: "int16", 3: "int32", 4: "int64", 5: "float16",
           6: "float32", 7: "float64", 11: "bool", 15: "bfloat16"}


def _emit(**event: Any) -> None:
    print(json.dumps(event), flush=True)


def main(argv: list[str] | None = None) -> int:
    """The child: ``python -m trtet_store.inspector.runtime_probe PTE PTD|'' PLANS_JSON``.

    Prints one JSON event per line, the last being the result. A bad file can
    crash the runtime (1.5.1's XNNPACK ``load_method`` segfaults without its
    ``.ptd``): the parent reads how far it got from the last event.
    """
    pte, ptd, plans_json = argv if argv is not None else sys.argv[1:]
    plans = json.loads(plans_json)
    out: dict[str, Any] = {"loaded": False, "methods": {}, "registered_backends": []}
    try:
        from executorch.runtime import Runtime, Verification

        runtime = Runtime.get()
        _emit(event="load_program")
        # executorch 1.4's runtime loads no .ptd: ask for one only when given.
        extra = {"data_path": ptd} if ptd else {}
        program = runtime.load_program(pte, verification=Verification.InternalConsistency,
                                       **extra)
    except Exception as exc:
        out["error"] = f"{type(exc).__name__}: {exc}"
        _emit(event="result", result=out)
        return 0
    out["loaded"] = True
    try:
        registered = set(runtime.backend_registry.registered_backend_names)
    except Exception:
        registered = set()
    out["registered_backends"] = sorted(registered)
    for name in sorted(program.method_names):
        missing = sorted(set(plans.get(name, [])) - registered)
        if missing:
            out["methods"][name] = {"state": "skipped", "missing_backends": missing}
            continue
        _emit(event="load_method", method=name)
        try:
            method = program.load_method(name)
        except Exception as exc:
            out["methods"][name] = {"state": "failed", "error": f"{type(exc).__name__}: {exc}"}
            continue
        # Run it once on zeros of its input shapes: loading alone never calls a kernel.
        _emit(event="execute", method=name)
        try:
            import torch

            meta = method.metadata
            infos = [meta.input_tensor_meta(i) for i in range(meta.num_inputs())]
            outputs = method.execute([
                torch.zeros(tuple(t.sizes()), dtype=getattr(torch, _DTYPES[int(t.dtype())]))
                for t in infos])
        except Exception as exc:
            out["methods"][name] = {"state": "failed",
                                    "error": f"executing: {type(exc).__name__}: {exc}"}
        else:
            out["methods"][name] = {"state": "executed", "outputs": len(outputs)}
    _emit(event="result", result=out)
    return 0


def _data_hint(pte: Inspection, ptd: Inspection | None) -> str:
    """Why a program may fail without its ``.ptd``, when it is the likely cause."""
    if ptd is not None:
        return ""
    present = pte.keys
    missing = [key for _, key in pte.wanted_keys() if key not in present]
    if missing:
        return (f"; the program reads {len(missing)} entries from a .ptd ({missing[0]!r}"
                f"{', ...' if len(missing) > 1 else ''}): pass --data FILE.ptd")
    # A delegate's external weights are named inside its own blob, out of sight.
    beside = sorted(p.name for p in pte.path.parent.glob("*.ptd"))
    if beside:
        return (f"; if the program keeps data in a .ptd ({', '.join(beside)} is beside it), "
                "pass --data FILE.ptd")
    return ""


def run_program(pte: Inspection, ptd: Inspection | None, result: VerifyResult) -> dict[str, Any]:
    out: dict[str, Any] = {"loaded": False, "methods": {}}
    if pte.errors or (ptd is not None and ptd.errors):
        out["skipped"] = "structural errors: not handing the file to the runtime"
        result.problems.append(Problem("error", "runtime load skipped: structural errors"))
        return out
    plans: dict[str, list[str]] = {}
    for d in pte.delegates:
        plans.setdefault(d["plan"], []).append(d["id"])
    argv = [
        sys.executable,
        "-m",
        "trtet_store.inspector.runtime_probe",
        os.fspath(pte.path),
        os.fspath(ptd.path) if ptd is not None else "",
        json.dumps(plans),
    ]
    try:
        proc = subprocess.run(
            argv, capture_output=True, text=True, timeout=RUNTIME_TIMEOUT, stdin=subprocess.DEVNULL
        )
    except subprocess.TimeoutExpired:
        out["error"] = f"the runtime did not finish within {RUNTIME_TIMEOUT} s"
        result.problems.append(Problem("error", out["error"]))
        return out
    events = []
    for line in proc.stdout.splitlines():
        with contextlib.suppress(ValueError):
            events.append(json.loads(line))
    final = next((e["result"] for e in reversed(events) if e.get("event") == "result"), None)
    if final is None:
        last = events[-1] if events else {"event": "start"}
        where = (
            f"loading method {last['method']!r}"
            if last.get("event") == "load_method"
            else f"executing method {last['method']!r}"
            if last.get("event") == "execute"
            else "loading the program"
            if last.get("event") == "load_program"
            else "starting"
        )
        if proc.returncode < 0:
            try:
                how = signal.Signals(-proc.returncode).name
            except ValueError:
                how = f"signal {-proc.returncode}"
            out["error"] = f"the runtime crashed ({how}) while {where}" + _data_hint(pte, ptd)
            if last.get("event") in ("load_method", "execute"):
                out["loaded"] = True
                out["methods"][last["method"]] = f"crashed ({how})"
        else:
            tail = (proc.stderr.strip().splitlines() or ["no output"])[-1]
            out["error"] = f"the runtime exited with {proc.returncode} while {where}: {tail}"
        result.problems.append(Problem("error", out["error"]))
        return out
    out.update({k: v for k, v in final.items() if k != "methods"})
    if not final.get("loaded"):
        result.problems.append(
            Problem("error", f"the runtime refused the program: {final.get('error')}"
                    + _data_hint(pte, ptd))
        )
        return out
    for name, state in final["methods"].items():
        if state["state"] == "skipped":
            text = (
                f"skipped: backend {', '.join(state['missing_backends'])} not registered in "
                "this runtime"
            )
            result.problems.append(Problem("warning", f"method {name!r} {text}"))
        elif state["state"] == "failed":
            text = state["error"]
            what = "failed" if text.startswith("executing") else "failed to load"
            result.problems.append(Problem(
                "error", f"method {name!r} {what}: {text}{_data_hint(pte, ptd)}"))
        else:
            text = f"executed on zeros ({state['outputs']} outputs)"
        out["methods"][name] = text
    return out


if __name__ == "__main__":
    raise SystemExit(main())
