"""Audit, sixth round: states four planted bugs passed every test with.

- The command a failed fetch-set says to run again (``fetch_set_command``)
  repeats every ``--trusted-key`` it was given (a path, or a PublicKey by the
  file it came from), and the CLI's parser reads them back: the resumed fetch
  checks the set as the first one did.
- A build record whose program has a name field (``name``,
  ``parameter_name``, ``fqn``, ...) holding a quote or a space (what FX
  pastes into the Python source it generates) or a backslash is refused as
  "not a plain name".
- ``fetch_set`` without ``trusted_keys`` takes them from
  ``TRTET_TRUSTED_KEYS`` (or the config file): an unsigned set is then
  refused before anything is downloaded or created.
- A lease's signature covers ``LEASE_DOMAIN`` first: the team key's
  signature over the same bytes without it (what another kind of document
  could have the team key sign) does not verify as a lease signature, and
  the three signed documents' domains differ (none a prefix of another).
"""

from __future__ import annotations

import base64
import json
import os
import shlex
from pathlib import Path
from typing import Any

import pytest
from keyed import with_keys
from records_helpers import exported_archive
from sets_helpers import write
from test_tier_no_code import archive, members_of

from trtet_store.remote.keys import keygen, load_public_key, load_signing_key

# --- the resume command repeats every trusted key ------------------------------------------


@pytest.fixture
def keys(tmp_path: Path) -> Path:
    d = tmp_path / "keys"
    d.mkdir(mode=0o700)
    keygen(d / "team.key")
    keygen(d / "ci key")  # a space in the path: the command quotes it
    return d


@pytest.mark.parametrize("given", ["paths", "public keys"])
def test_the_resume_command_repeats_every_trusted_key(keys: Path, tmp_path: Path,
                                                      given: str) -> None:
    from trtet_store.cli import build_parser
    from trtet_store.sets.fetch import fetch_set_command

    files = [keys / "team.key.pub", keys / "ci key.pub"]
    trusted: list[Any] = (list(files) if given == "paths"
                          else [load_public_key(p) for p in files])
    dest = tmp_path / "out" / "a"
    command = fetch_set_command("s3://b/llm/v3/", dest, "a", endpoint_url="http://h:1",
                                trusted_keys=trusted)
    words = shlex.split(command)
    pairs = [(w, words[i + 1]) for i, w in enumerate(words[:-1]) if w == "--trusted-key"]
    assert pairs == [("--trusted-key", os.fspath(p)) for p in files], command
    # The CLI reads the command back with the same keys (and the rest as given).
    args = build_parser().parse_args(words[1:])
    assert args.command == "fetch-set" and args.member == "a" and args.out == dest
    assert args.trusted_key == files, command
    # Without trusted keys given, none is named (the environment's apply by themselves).
    plain = shlex.split(fetch_set_command("s3://b/llm/v3/", dest, "a"))
    assert "--trusted-key" not in plain


# --- a build record's names: letters, digits, _ and . only ---------------------------------


@pytest.fixture(scope="module")
def weighted() -> bytes:
    """A real torch.export archive of a module with a weight (torch.export.save)."""
    return exported_archive(weighted=True)


_PROGRAM = "models/model.json"


def _parameter(program: dict) -> dict:
    specs = program["graph_module"]["signature"]["input_specs"]
    return next(s["parameter"] for s in specs if "parameter" in s)


def _node(program: dict) -> dict:
    return program["graph_module"]["graph"]["nodes"][-1]


def _call(program: dict) -> dict:
    return next(c for c in program["graph_module"]["module_call_graph"] if c["fqn"])


@pytest.mark.parametrize("where, key, value", [
    (_parameter, "parameter_name", "lin.weight'"),                 # a quote ends getattr's name
    (_node, "name", "relu x"),                                     # a space
    (_call, "fqn", 'lin"'),                                        # a double quote
    (_parameter, "parameter_name", "lin.weight\\"),                # a backslash
], ids=["quote", "space", "double quote", "backslash"])
def test_a_program_name_with_a_quote_space_or_backslash_is_refused(
        weighted: bytes, where: Any, key: str, value: str) -> None:
    from trtet_store.export.record_check import record_problem

    m = members_of(weighted)
    program = json.loads(m[_PROGRAM])
    field = where(program)
    assert key in field and isinstance(field[key], str)
    assert record_problem(archive(m)) is None  # rewritten, unchanged: data
    field[key] = value
    m[_PROGRAM] = json.dumps(program).encode()
    said = record_problem(archive(m))
    assert said == f"its program's {key} {value!r} is not a plain name", said


# --- fetch_set takes its trusted keys from the environment and the config file -------------


@pytest.fixture
def env(s3env: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Any:
    with_keys(s3env, tmp_path, monkeypatch)
    s3env.url = f"s3://{s3env.bucket}/llm/v3/"
    return s3env


@pytest.mark.parametrize("source", ["TRTET_TRUSTED_KEYS", "config file"])
def test_an_unsigned_set_is_refused_with_trusted_keys_from_the_environment(
        env: Any, here_fs: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
        source: str) -> None:
    from trtet_store.remote.upload.config import PublishConfig
    from trtet_store.sets import fetch_set, publish_set
    from trtet_store.sets.signed import SetSignatureError

    members = {"a": [write(here_fs / "src" / "a" / "model.pte", 4096 + 5, 1),
                     write(here_fs / "src" / "foundation.ptd", 8192 + 11, 7)]}
    publish_set(members, env.url, endpoint_url=env.endpoint.url,
                config=PublishConfig(journal_dir=env.journal_dir))  # unsigned
    pub = env.keys / "team.key.pub"
    if source == "TRTET_TRUSTED_KEYS":
        monkeypatch.setenv("TRTET_TRUSTED_KEYS", os.fspath(pub))
    else:
        config = tmp_path / "config"
        config.write_text(f"[trtet_store]\ntrusted_keys = {pub}\n")
        config.chmod(0o600)
        monkeypatch.setenv("TRTET_CONFIG_FILE", os.fspath(config))
    out = here_fs / "out"
    out.mkdir()
    with pytest.raises(SetSignatureError) as caught:
        fetch_set(env.url, out / "a", "a", endpoint_url=env.endpoint.url, store=out / "store")
    said = str(caught.value)
    assert "the set is refused: not signed" in said and "\n" not in said, said
    assert said.endswith("; nothing downloaded"), said
    assert sorted(p.name for p in out.iterdir()) == []  # no destination, no store
    # The control: neither variable nor config file, no keys: the unsigned set is fetched.
    monkeypatch.delenv("TRTET_TRUSTED_KEYS", raising=False)
    monkeypatch.setenv("TRTET_CONFIG_FILE", os.fspath(tmp_path / "no-config"))
    fetch_set(env.url, out / "a", "a", endpoint_url=env.endpoint.url, store=out / "store")
    assert [(out / "a" / p.name).read_bytes() for p in members["a"]] == \
        [p.read_bytes() for p in members["a"]]


# --- a lease signature is a lease's only ---------------------------------------------------

BUCKET, LKEY = "bucket", f"cache/{'a' * 32}.lease"


def test_the_team_keys_signature_without_the_lease_domain_is_no_lease_signature(
        keys: Path) -> None:
    from trtet_store.cache.tier.lease import (
        LEASE_DOMAIN,
        lease_body,
        lease_payload,
        lease_refusal,
    )

    team = load_signing_key(keys / "team.key")
    trusted = {team.key_id: load_public_key(keys / "team.key.pub")}
    doc = json.loads(lease_body("f" * 32, 1.0e9, 300, 3, signing_key=team, bucket=BUCKET,
                                object_key=LKEY))
    assert lease_refusal(doc, BUCKET, LKEY, trusted) is None  # the holder's own: verifies
    signed = lease_payload(BUCKET, LKEY, doc)
    # The same bytes without the domain, signed by the team key as another kind of document.
    bare = signed.removeprefix(LEASE_DOMAIN)
    doc["signature"] = {"key": team.key_id,
                        "ed25519": base64.b64encode(team.sign(bare)).decode("ascii")}
    said = lease_refusal(doc, BUCKET, LKEY, trusted)
    assert said == f"its signature by {team.key_id} does not verify", said
    assert signed == LEASE_DOMAIN + bare


def test_the_signed_documents_domains_differ() -> None:
    from trtet_store.cache.tier.lease import LEASE_DOMAIN
    from trtet_store.cache.tier.signing import DOMAIN as POINTER
    from trtet_store.sets.signed import DOMAIN as SET

    domains = [LEASE_DOMAIN, POINTER, SET]
    for d in domains:
        assert d.endswith(b"\n") and d.count(b"\n") == 1
    for a in domains:
        for b in domains:
            assert a is b or not b.startswith(a), (a, b)
