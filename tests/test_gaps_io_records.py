"""Checks of a build record before ``torch.export.load`` that no test set up (a gap audit).

On a real ``torch.export`` archive (torch's own writer, in-process), each case rewrites
one member the way a bucket writer could and shows :func:`record_problem` refusing it in
one line; and :func:`load_record` reads at most its cap (exactly the cap loads, one
byte over is refused) and loads the very bytes it checked, never the path again.
"""

from __future__ import annotations

import io
import json
from pathlib import Path
from typing import Any

import pytest
from records_helpers import exported_archive
from test_tier_no_code import archive, members_of

from trtet_store.export import record_check
from trtet_store.export.record_check import UnsafeRecordError, load_record, record_problem

_WEIGHTS = "data/weights/model_weights_config.json"


@pytest.fixture(scope="module")
def weighted() -> bytes:
    return exported_archive(weighted=True)


@pytest.fixture(scope="module")
def plain() -> bytes:
    return exported_archive(weighted=False)


def _with_program(record: bytes, edit: Any) -> bytes:
    m = members_of(record)
    doc = json.loads(m["models/model.json"])
    edit(doc)
    return archive({**m, "models/model.json": json.dumps(doc).encode()})


def _with_weights(record: bytes, edit: Any) -> bytes:
    m = members_of(record)
    config = json.loads(m[_WEIGHTS])
    edit(config)
    return archive({**m, _WEIGHTS: json.dumps(config).encode()})


def _first_weight(config: dict) -> dict:
    return next(iter(config["config"].values()))


def _node(doc: dict) -> dict:
    return doc["graph_module"]["graph"]["nodes"][0]


def test_a_weight_entry_without_tensor_meta_is_refused(weighted: bytes) -> None:
    """record_check.py _payload_problem: ``if not isinstance(meta.get("tensor_meta"), dict)``:
    the loader builds the tensor from it; a raw payload without it is not one we wrote."""
    assert record_problem(_with_weights(weighted, lambda c: None)) is None
    for meta in (None, "x", []):
        said = record_problem(_with_weights(
            weighted, lambda c, meta=meta: _first_weight(c).update(tensor_meta=meta)))
        assert said is not None and said.endswith("has no tensor_meta"), said


@pytest.mark.parametrize("config, why", [
    ({"config": []}, "its weights config is not a JSON object of entries"),
    ({"entries": {}}, "its weights config is not a JSON object of entries"),
    ([], "its weights config is not a JSON object of entries"),
    ({"config": {"w": "weight_0"}}, "its weights entry 'w' is not an object"),
], ids=["list", "no config", "not an object", "entry a string"])
def test_a_payload_config_that_is_not_entries_is_refused(weighted: bytes, config: Any,
                                                         why: str) -> None:
    """record_check.py _payload_problem: the config's and each entry's type checks (a
    reader surprise would otherwise be the only refusal)."""
    m = members_of(weighted)
    assert record_problem(archive({**m, _WEIGHTS: json.dumps(config).encode()})) == why


@pytest.mark.parametrize("edit, why", [
    (lambda d: d["graph_module"]["graph"].update(custom_obj_values={"obj0": {"x": 1}}),
     "its program holds a custom object"),
    (lambda d: _node(d)["inputs"].append({"name": "o", "arg": {"as_custom_obj": {
        "name": "obj0", "class_fqn": "os.system"}}}), "its program holds a custom object"),
    (lambda d: _node(d)["inputs"].append({"name": "o", "arg": {"as_custom_objs": [{
        "name": "obj0", "class_fqn": "os.system"}]}}), "its program holds a custom object"),
], ids=["custom_obj_values", "as_custom_obj", "as_custom_objs"])
def test_a_program_holding_a_custom_object_is_refused(plain: bytes, edit: Any,
                                                      why: str) -> None:
    """record_check.py _program_problem: ``as_custom_obj(s)`` anywhere, and a non-empty
    ``custom_obj_values`` (torch unpickles custom objects)."""
    doc = json.loads(members_of(plain)["models/model.json"])
    assert not doc["graph_module"]["graph"].get("custom_obj_values")  # empty, as torch wrote
    said = record_problem(_with_program(plain, edit))
    assert said == why, said


@pytest.mark.parametrize("target", [
    "torch.ops.aten.name",            # a namespace's own attribute
    "torch.ops.aten._dir",
    "torch.ops.aten.add.overloads",   # a packet's method, not an overload
])
def test_a_target_reaching_an_attribute_of_a_namespace_or_packet_is_refused(
        plain: bytes, target: str) -> None:
    """record_check.py _torch_ops_method: ``parts[3] in ("name", "_dir")`` and the
    packet-level ``hasattr``: each matches the operator pattern, none is an operator."""
    import torch

    node = _node(json.loads(members_of(plain)["models/model.json"]))
    assert node["target"].startswith("torch.ops.aten.")
    assert record_problem(_with_program(plain, lambda d: _node(d).update(
        target="torch.ops.aten.add.Tensor"))) is None  # an operator's overload: data
    assert hasattr(torch.ops.aten, "name") or hasattr(torch.ops.aten.add, "overloads")
    said = record_problem(_with_program(plain, lambda d: _node(d).update(target=target)))
    assert said == f"its program calls {target!r}, not an operator", said


def test_a_record_exactly_at_the_cap_loads_one_byte_over_is_refused_unloaded(
        plain: bytes, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """record_check.py load_record: ``f.read(MAX_RECORD_BYTES + 1)`` and ``len(data) >
    MAX_RECORD_BYTES`` (the cap lowered to this record's size)."""
    path = tmp_path / "record"
    path.write_bytes(plain)
    monkeypatch.setattr(record_check, "MAX_RECORD_BYTES", len(plain))
    assert load_record(path).graph_module is not None
    monkeypatch.setattr(record_check, "MAX_RECORD_BYTES", len(plain) - 1)
    with pytest.raises(UnsafeRecordError, match=f"larger than {len(plain) - 1} bytes"):
        load_record(path)


def test_the_record_loaded_is_the_bytes_checked_never_the_path_again(
        plain: bytes, weighted: bytes, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """record_check.py load_record: ``torch.export.load(io.BytesIO(data))``. The file is
    replaced (by another record) right after its bytes were checked: the program loaded is
    the checked one."""
    path = tmp_path / "record"
    path.write_bytes(plain)
    check = record_check.record_problem

    def check_then_swap(data: bytes) -> str | None:
        said = check(data)
        path.write_bytes(weighted)
        return said

    monkeypatch.setattr(record_check, "record_problem", check_then_swap)
    program = load_record(path)
    assert path.read_bytes() == weighted
    assert dict(program.named_parameters()) == {}  # the plain module's: nothing of lin

    import torch

    assert dict(torch.export.load(io.BytesIO(weighted)).named_parameters())  # the control


@pytest.fixture(scope="module")
def buffered() -> bytes:
    """A record with a buffer and a tensor constant (names torch pastes into generated code)."""
    import torch

    class M(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.register_buffer("b", torch.ones(3))
            self.c = torch.randn(3)

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return x + self.b + self.c

    buf = io.BytesIO()
    torch.export.save(torch.export.export(M(), (torch.randn(2, 3),)), buf)
    return buf.getvalue()


def _set_every(doc: Any, key: str, value: str) -> int:
    """Set every ``key`` in the program to ``value``; how many there were."""
    n = 0
    stack = [doc]
    while stack:
        v = stack.pop()
        if isinstance(v, dict):
            for k in v:
                if k == key and isinstance(v[k], str):
                    v[k] = value
                    n += 1
                else:
                    stack.append(v[k])
        elif isinstance(v, list):
            stack.extend(v)
    return n


@pytest.mark.parametrize("key", ["buffer_name", "tensor_constant_name"])
def test_a_buffer_or_constant_name_with_a_quote_is_refused(buffered: bytes, key: str) -> None:
    """record_check.py _NAME_KEYS: each name key held to letters, digits, ``_`` and ``.``
    (torch reaches these by getattr on generated code)."""
    assert record_problem(buffered) is None
    counted = []

    def edit(doc: dict) -> None:
        counted.append(_set_every(doc, key, "b'); import os; ('"))

    said = record_problem(_with_program(buffered, edit))
    assert counted[0] > 0
    assert said == f"its program's {key} \"b'); import os; ('\" is not a plain name", said


@pytest.mark.parametrize("expr", ["dir()", "len(s0)", "str + s0", "id"])
def test_an_expression_naming_a_short_builtin_is_refused(plain: bytes, expr: str) -> None:
    """record_check.py ``_SYMBOL``: a symbol is letters AND digits (``s0``, ``u12``); a bare
    name of up to three letters is a Python builtin to ``sympify``'s ``eval`` (``dir``,
    ``len``, ``str``, ``id``). Final audit V2: digits made optional passed every test."""
    name = expr.split("(")[0].split()[0]
    said = record_problem(_with_program(plain, lambda d: d["graph_module"]["graph"][
        "sym_int_values"].update({"s0": {"as_expr": {"expr_str": expr, "hint": None}}})))
    assert said == f"its program's expression {expr!r} names {name!r}", said
    assert record_problem(_with_program(plain, lambda d: d["graph_module"]["graph"][
        "sym_int_values"].update({"s0": {"as_expr": {"expr_str": "s0 + u12*2", "hint": None}}}))
    ) is None  # symbols with their digits: data
