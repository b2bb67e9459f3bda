"""Signed shared-tier entries (issue 44, item 5), on the SeaweedFS fixture.

Machine A signs its entries with the team's key; machines with the team's
public key as their only trusted key accept only entries it signed. The
bucket writer (the test, with boto3) turns A's signed entry into an
unsigned one, one signed by its own key, one whose pointer it edited, and
one whose engine it swapped with the pointer's sizes and digests updated to
match (the trial's finding 4): each is a miss with its reason in the
export's events, never served, and the program holds the machine's own
build. Each machine is its own process (``test_engine_cache_shared``'s
harness), with its keys from ``TRTET_SIGNING_KEY`` / ``TRTET_TRUSTED_KEYS``.
"""

from __future__ import annotations

import json
import os
import pickle
import stat
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
import warm
import xxhash
from programs import write_model_factory
from test_engine_cache_shared import Machines, engines_in, key_of, outcomes

from trtet_store.io.units import MiB

ROOT = Path(__file__).resolve().parents[1]


@pytest.fixture
def keys(here_fs):
    """Two key pairs: the team's (``team.key``/``.pub``) and the attacker's own (``evil``)."""
    from trtet_store.cache.tier import keygen

    d = here_fs / "keys"
    d.mkdir(mode=0o700)
    return {"team": keygen(d / "team.key"), "evil": keygen(d / "evil.key"), "dir": d}


def env_with(**values: object) -> dict:
    env = {k: v for k, v in os.environ.items() if not k.startswith("TRTET_")}
    env["TRTET_CONFIG_FILE"] = "/nonexistent/trtet_store/config"
    env.update({k: os.fspath(v) for k, v in values.items()})
    return env


def _sign_with(doc: dict, key_path: Path) -> dict:
    from trtet_store.cache.tier.entry import RemoteEntry
    from trtet_store.cache.tier.signing import load_signing_key, sign_entry

    entry = RemoteEntry.from_json(json.dumps(doc).encode(), "x")
    sign_entry(entry, load_signing_key(key_path))
    return json.loads(entry.to_json())


def _swap_engine(machines: Machines, doc: dict, here: Path) -> tuple[dict, str]:
    """The trial's attack: other engine bytes of the same size in a new attempt directory
    (record copied, manifest consistent), and the pointer's attempt and every digest of
    the engine updated to match; its signature left as it was."""
    from trtet_store.remote.upload.config import PublishConfig
    from trtet_store.remote.upload.send import publish_sources
    from trtet_store.remote.upload.source import ObjectSource

    key = doc["key"]
    old = {f["name"]: f for f in doc["files"]}
    evil = os.urandom(old["e0"]["size"])
    (here / "evil-e0").write_bytes(evil)
    (here / "evil-record").write_bytes(machines.get(f"{doc['attempt']}record"))
    attempt = f"{key}/evil-0000000000000000/"
    publish_sources([ObjectSource.of_file(here / "evil-record", "record"),
                     ObjectSource.of_file(here / "evil-e0", "e0")],
                    f"{machines.url}/{attempt}record", endpoint_url=machines.s3.endpoint.url,
                    replace=False, config=PublishConfig(index=False,
                                                        journal_dir=here / "evil-journal"))
    digest = xxhash.xxh3_128_hexdigest(evil)
    text = json.dumps(doc).replace(old["e0"]["digest"], digest).replace(doc["attempt"], attempt)
    return json.loads(text), digest


ATTACKS = ["unsigned", "untrusted signer", "record changed", "engine swapped"]


def test_only_entries_signed_by_a_trusted_key_are_served(machines_fixture, keys, here_fs):
    machines = machines_fixture
    team, evil = keys["dir"] / "team.key", keys["dir"] / "evil.key"
    trusted = keys["dir"] / "team.key.pub"
    signer = env_with(TRTET_SIGNING_KEY=team, TRTET_TRUSTED_KEYS=trusted)
    reader = env_with(TRTET_TRUSTED_KEYS=trusted)  # trusts the team, signs nothing
    size = 2 * MiB
    a, _ = machines.run("a", sizes=(size,), env=signer)
    key = key_of(a)
    assert outcomes(a) == [("miss", True, True)]
    signed_bytes = machines.get(f"{key}.json")
    doc = json.loads(signed_bytes)
    assert doc["signature"]["key"] == keys["team"].key_id

    # A signed entry is served: a remote hit, A's engine, nothing built.
    s, _ = machines.run("s", sizes=(size,), env=reader)
    assert outcomes(s) == [("remote-hit", None, None)] and s["built"] == []
    assert engines_in(machines.pte("s")) == a["built"]

    for n, attack in enumerate(ATTACKS):
        swapped = None
        if attack == "unsigned":
            bad = {k: v for k, v in doc.items() if k != "signature"}
            said = "not signed"
        elif attack == "untrusted signer":
            bad = _sign_with({k: v for k, v in doc.items() if k != "signature"}, evil)
            said = f"signed by '{keys['evil'].key_id}', not one of the trusted keys"
        elif attack == "record changed":
            bad = {**doc, "host": "build-farm-7"}  # re-signed by nobody
            said = "does not verify: the pointer was changed after it was signed"
        else:
            bad, swapped = _swap_engine(machines, doc, here_fs)
            said = "does not verify: the pointer was changed after it was signed"
        machines.put(f"{key}.json", json.dumps(bad).encode())
        b, err = machines.run(f"b{n}", sizes=(size,), env=reader)
        # A miss with its reason in the event; nothing served; the .pte holds b's own build.
        assert [(e["outcome"], e["stored"]) for e in b["events"]] == [("miss", True)], attack
        reason = b["events"][0]["remote_reason"] or ""
        assert reason.startswith("refused: ") and said in reason, (attack, reason)
        assert len(b["built"]) == 1 and engines_in(machines.pte(f"b{n}")) == b["built"]
        assert swapped not in engines_in(machines.pte(f"b{n}"))
        assert "is refused, never served" in err, err[-2000:]
        # b cannot sign: the refused entry is left as it is, and b says why it published nothing.
        assert b["events"][0]["published"] is False
        assert "no signing key to replace it" in b["events"][0]["publish_reason"]
        assert json.loads(machines.get(f"{key}.json")) == bad
        machines.put(f"{key}.json", signed_bytes)  # the next attack starts from A's entry

    # A machine that signs replaces a refused entry (If-Match it) with its own signed one,
    # which the readers then take.
    machines.put(f"{key}.json", json.dumps({k: v for k, v in doc.items()
                                            if k != "signature"}).encode())
    c, _ = machines.run("c", sizes=(size,), env=signer)
    assert outcomes(c) == [("miss", True, True)]
    after = json.loads(machines.get(f"{key}.json"))
    assert after["origin"] == c["origin"] and after["signature"]["key"] == keys["team"].key_id
    d, _ = machines.run("d", sizes=(size,), env=reader)
    assert outcomes(d) == [("remote-hit", None, None)]
    assert engines_in(machines.pte("d")) == c["built"]


@pytest.fixture
def machines_fixture(here_fs, s3env):
    return Machines(here_fs, s3env)


# --- the tier alone: push, pull and prune carry signatures ------------------------------------


def test_pull_refuses_before_downloading_and_push_and_prune_keep_signatures(here_fs, s3env,
                                                                            keys, monkeypatch):
    import trtet_store
    from trtet_store.cache.tier import TierSignatureError
    from trtet_store.export.engine_cache import RECORD_KIND
    from trtet_store.testing.stub_tensorrt import FakeBuilder, installed, linear_relu

    monkeypatch.setenv("TRTET_CONFIG_FILE", os.fspath(here_fs / "no-config"))
    url, endpoint = f"s3://{s3env.bucket}/team", s3env.endpoint.url
    team, pub = keys["dir"] / "team.key", keys["dir"] / "team.key.pub"
    local = trtet_store.EngineCache(here_fs / "a", max_bytes=1 << 30, min_free=0)
    module, inputs = linear_relu()
    with installed(FakeBuilder(engine_sizes=(MiB,), seeds=(5,))):
        trtet_store.compile_and_save(module, inputs, here_fs / "a.pte", engine_cache=local)
    key = next(e.key for e in local.entries() if e.metadata.get("kind") == RECORD_KIND)

    unsigned = trtet_store.EngineCache(here_fs / "a", remote=url, endpoint_url=endpoint)
    [p] = unsigned.push()
    assert p.published and p.entry.signature is None
    b = trtet_store.EngineCache(here_fs / "b", remote=url, endpoint_url=endpoint,
                                trusted_keys=[pub])
    with pytest.raises(TierSignatureError, match="is refused: not signed"):
        b.pull([key])
    assert not (here_fs / "b" / "downloads").exists() or \
        not any((here_fs / "b" / "downloads").rglob("*"))
    assert b.lookup(key) is None
    unsigned.prune_remote(0)

    signing = trtet_store.EngineCache(here_fs / "a", remote=url, endpoint_url=endpoint,
                                      signing_key=team)
    [p] = signing.push()
    assert p.published and p.entry.signature["key"] == keys["team"].key_id
    pointer = s3env.client.get_object(Bucket=s3env.bucket, Key=f"team/{key}.json")
    body = pointer["Body"].read()
    assert b.pull([key]) == [(key, p.entry.size)]
    with b.lookup(key) as got, local.lookup(key) as mine:
        assert [h.digest for h in got.engines] == [h.digest for h in mine.engines]
    # A prune that removes nothing leaves the signed pointer byte for byte.
    assert signing.prune_remote(3600) == []
    again = s3env.client.get_object(Bucket=s3env.bucket, Key=f"team/{key}.json")
    assert again["Body"].read() == body and again["ETag"] == pointer["ETag"]


def test_key_arguments_are_checked_before_anything_is_made(here_fs, keys, monkeypatch):
    import trtet_store
    from trtet_store.cache.tier import KeyFileError, RemoteTier

    monkeypatch.setenv("TRTET_CONFIG_FILE", os.fspath(here_fs / "no-config"))
    pub = keys["dir"] / "team.key.pub"
    with pytest.raises(ValueError, match="signing_key= and trusted_keys= are for remote="):
        trtet_store.EngineCache(here_fs / "x", trusted_keys=[pub])
    with pytest.raises(ValueError, match="trusted_keys is empty"):
        trtet_store.EngineCache(here_fs / "x", remote="s3://bucket/p", trusted_keys=[])
    with pytest.raises(KeyFileError, match="not a PEM public key"):
        RemoteTier("s3://bucket/p", trusted_keys=[keys["dir"] / "team.key"])
    loose = keys["dir"] / "loose.key"
    loose.write_bytes((keys["dir"] / "team.key").read_bytes())
    loose.chmod(0o644)
    with pytest.raises(KeyFileError, match=r"mode 0644: other users could read it; chmod 600"):
        RemoteTier("s3://bucket/p", signing_key=loose)
    pub.chmod(0o666)
    with pytest.raises(KeyFileError, match="could replace it; chmod go-w"):
        RemoteTier("s3://bucket/p", trusted_keys=[pub])
    pub.chmod(0o644)
    assert not (here_fs / "x").exists()


def test_keys_come_from_the_environment_then_the_config_file(here_fs, keys, monkeypatch):
    from trtet_store.cache.tier import KeyFileError, RemoteTier

    d = keys["dir"]
    config = here_fs / "config"
    config.write_text("[trtet_store]\nsigning_key = keys/evil.key\n"
                      f"trusted_keys = keys/team.key.pub{os.pathsep}{d / 'evil.key.pub'}\n")
    monkeypatch.setenv("TRTET_CONFIG_FILE", os.fspath(config))
    monkeypatch.delenv("TRTET_SIGNING_KEY", raising=False)
    monkeypatch.delenv("TRTET_TRUSTED_KEYS", raising=False)
    tier = RemoteTier("s3://bucket/p")  # relative paths: from the config file's directory
    assert tier.signing_key.key_id == keys["evil"].key_id
    assert sorted(tier.trusted_keys) == sorted([keys["team"].key_id, keys["evil"].key_id])
    monkeypatch.setenv("TRTET_SIGNING_KEY", os.fspath(d / "team.key"))  # env over the file
    monkeypatch.setenv("TRTET_TRUSTED_KEYS", os.fspath(d / "team.key.pub"))
    tier = RemoteTier("s3://bucket/p")
    assert tier.signing_key.key_id == keys["team"].key_id
    assert list(tier.trusted_keys) == [keys["team"].key_id]
    tier = RemoteTier("s3://bucket/p", trusted_keys=[d / "evil.key.pub"])  # the argument over both
    assert list(tier.trusted_keys) == [keys["evil"].key_id]
    config.chmod(0o666)  # another user could name whom to trust
    monkeypatch.delenv("TRTET_TRUSTED_KEYS")
    with pytest.raises(KeyFileError, match="can be written by another user"):
        RemoteTier("s3://bucket/p")
    config.chmod(0o644)
    config.write_text("[trtet_store]\ntrusted_key = x\n")
    with pytest.raises(KeyFileError, match=r"has \['trusted_key'\]"):
        RemoteTier("s3://bucket/p")
    monkeypatch.setenv("TRTET_CONFIG_FILE", os.fspath(here_fs / "none"))
    monkeypatch.delenv("TRTET_SIGNING_KEY")
    tier = RemoteTier("s3://bucket/p")
    assert tier.signing_key is None and tier.trusted_keys is None


def test_without_cryptography_keys_say_what_to_install(here_fs, keys):
    # A fresh interpreter, not a warm child: "cryptography" must not be imported yet.
    code = textwrap.dedent("""
        import sys
        sys.modules["cryptography"] = None  # as if not installed
        from trtet_store.cache.tier import RemoteTier, SigningUnavailableError
        assert RemoteTier("s3://bucket/p").trusted_keys is None  # no keys: no import
        try:
            RemoteTier("s3://bucket/p", trusted_keys=[sys.argv[1]])
        except SigningUnavailableError as exc:
            print(exc)
    """)
    done = subprocess.run([sys.executable, "-c", code, os.fspath(keys["dir"] / "team.key.pub")],
                          capture_output=True, text=True, cwd=ROOT, timeout=120,
                          env=env_with())
    assert done.returncode == 0, done.stderr
    assert "pip install 'trtet-store[sign]'" in done.stdout, done.stdout


# --- keygen ---------------------------------------------------------------------------------


def _as_nobody() -> None:
    os.setresgid(65534, 65534, 65534)
    os.setresuid(65534, 65534, 65534)


def _state(*paths: Path) -> dict:
    out = {}
    for p in paths:
        for q in sorted(p.rglob("*")) if p.is_dir() else [p]:
            st = os.lstat(q)
            out[os.fspath(q)] = (stat.S_IMODE(st.st_mode), st.st_uid,
                                 os.readlink(q) if stat.S_ISLNK(st.st_mode) else
                                 q.read_bytes() if stat.S_ISREG(st.st_mode) else None)
    return out


def test_keygen_makes_0600_keys_and_never_overwrites_or_follows_a_link(here_fs):
    """In a 1777 directory, a link another user planted at PATH or PATH.pub is refused;
    the victim's file and the directory stay byte for byte."""
    shared = here_fs / "shared"
    shared.mkdir()
    shared.chmod(0o1777)
    victim = here_fs / "victim"
    victim.mkdir(mode=0o700)
    (victim / "secret").write_bytes(b"root only\n")
    (victim / "secret").chmod(0o600)
    old = os.umask(0)
    try:
        done = warm.cli("cache", "keygen", shared / "ci.key", cwd=ROOT, timeout=120)
    finally:
        os.umask(old)
    assert done.returncode == 0, done.stderr
    assert stat.S_IMODE(os.lstat(shared / "ci.key").st_mode) == 0o600  # whatever the umask
    assert stat.S_IMODE(os.lstat(shared / "ci.key.pub").st_mode) == 0o644
    from trtet_store.cache.tier.signing import load_public_key, load_signing_key

    key_id = load_public_key(shared / "ci.key.pub").key_id
    assert load_signing_key(shared / "ci.key").key_id == key_id
    assert done.stdout.strip().endswith(f"key id {key_id}"), done.stdout
    # Again: refused, nothing overwritten.
    before = _state(shared, victim)
    again = warm.cli("cache", "keygen", shared / "ci.key", cwd=ROOT, timeout=120)
    assert again.returncode == 1 and again.stderr.count("\n") == 1, again.stderr
    assert "exists: keygen never overwrites a key" in again.stderr
    assert _state(shared, victim) == before
    # Links another user planted: to the victim's file, and dangling.
    for name, target in (("a.key", victim / "secret"), ("b.key", victim / "new"),
                         ("c.key.pub", victim / "secret")):
        pid = os.fork()
        if pid == 0:  # the other user, in a forked child
            try:
                _as_nobody()
                os.symlink(target, shared / name)
            finally:
                os._exit(0)
        os.waitpid(pid, 0)
        assert os.lstat(shared / name).st_uid == 65534
    before = _state(shared, victim)
    from trtet_store.cache.tier import keygen

    for path in (shared / "a.key", shared / "b.key", shared / "c.key"):
        with pytest.raises(FileExistsError, match="keygen never overwrites"):
            keygen(path)
    assert _state(shared, victim) == before  # nothing written, nothing created
    assert not (victim / "new").exists()


# --- the Torch-TensorRT adapter: upstream unpickles entries -----------------------------------


class _Payload:
    """What an attacker's pickle does when unpickled: makes a file (any code would run)."""

    def __init__(self, marker: str) -> None:
        self.marker = marker

    def __reduce__(self):
        return (open, (self.marker, "w"))


def test_the_adapter_refuses_a_bucket_without_trusted_keys_unless_told(here_fs, s3env, keys,
                                                                         monkeypatch):
    from test_engine_cache_upstream import SM, TRT, entry, hash_of

    import trtet_store
    from trtet_store.cache.tier import RemoteTier
    from trtet_store.export.trt_engine_cache import UntrustedBucketError, for_torch_tensorrt
    from trtet_store.testing import upstream_engine_cache as uec

    try:
        import upstream

        wheel = upstream.wheel("torch-tensorrt")
    except upstream.WheelUnavailable as exc:
        from filesystems import unavailable

        unavailable(str(exc))
    monkeypatch.setenv("TRTET_CONFIG_FILE", os.fspath(here_fs / "no-config"))
    url, ep = f"s3://{s3env.bucket}/tt", s3env.endpoint.url
    team, pub = keys["dir"] / "team.key", keys["dir"] / "team.key.pub"
    mod = uec.load(wheel)
    with uec.as_torch_tensorrt(mod):
        opts = {"tensorrt_version": TRT, "compute_capability": SM}
        with pytest.raises(UntrustedBucketError) as refused:
            for_torch_tensorrt(here_fs / "a", remote=url, endpoint_url=ep, **opts)
        said = str(refused.value)
        assert "\n" not in said and "pickle.loads in BaseEngineCache.check" in said
        assert "trusted_keys=" in said and "trust_bucket_writers=True" in said
        assert not (here_fs / "a").exists()  # refused before the cache was opened
        with pytest.raises(UntrustedBucketError):
            for_torch_tensorrt(trtet_store.EngineCache(here_fs / "e", remote=url,
                                                       endpoint_url=ep), **opts)

        # The bucket writer's entry: a pickle that runs code when upstream's check loads it.
        marker = here_fs / "code-ran"
        blob = here_fs / "evil-blob"
        blob.write_bytes(pickle.dumps(_Payload(os.fspath(marker))))
        probe = for_torch_tensorrt(here_fs / "probe", **opts)
        h = hash_of(3)
        evil = RemoteTier(url, endpoint_url=ep)  # no keys: an unsigned entry
        assert evil.publish(probe.key_for(h), [("blob", blob)], {
            "kind": "torch_tensorrt.packed", "torch_tensorrt_hash": h,
            "versions": [["tensorrt", TRT]], "compute_capability": SM}).published

        # Trusted keys: the unsigned entry is a miss, never unpickled.
        b = for_torch_tensorrt(here_fs / "b", remote=url, endpoint_url=ep, trusted_keys=[pub],
                               **opts)
        assert b.check(h) is None and not marker.exists()
        assert b.last_remote.action == "miss" and b.last_remote.reason.startswith(
            "refused: not signed"), b.last_remote
        assert b.cache.entries() == []
        # A signed machine's entry is served to it.
        a = for_torch_tensorrt(here_fs / "s", remote=url, endpoint_url=ep, signing_key=team,
                               trusted_keys=[pub], **opts)
        a.insert(hash_of(1), entry(1, MiB))
        assert a.last_remote.action == "published"
        assert tuple(b.check(hash_of(1))) == entry(1, MiB) and b.last_remote.action == "hit"

        # trust_bucket_writers=True, explicitly: what it means is code from the bucket runs.
        c = for_torch_tensorrt(here_fs / "c", remote=url, endpoint_url=ep,
                               trust_bucket_writers=True, **opts)
        assert c.remote is not None
        with pytest.raises(Exception):  # noqa: B017 - the payload's result is no entry
            c.check(h)
        assert marker.exists()


# --- the CLI, each command its own process ----------------------------------------------------

COMPILE = r'''
import sys
from trtet_store.cli import main
from trtet_store.testing.stub_tensorrt import FakeBuilder, installed
with installed(FakeBuilder(engine_sizes=(1 << 20,))):
    sys.exit(main(sys.argv[1:]))
'''


def _cli(*argv: object, compile_: bool = False) -> subprocess.CompletedProcess:
    """The CLI in a warm child (tests/warm.py), each command its own process."""
    return warm.run(COMPILE if compile_ else warm.CLI, argv, cwd=ROOT, timeout=600,
                    env=env_with(**{k: v for k, v in os.environ.items()
                                    if k.startswith("AWS_")}))


def test_cli_keygen_then_compile_push_and_pull_with_keys(here_fs, s3env):
    k = here_fs / "k"
    k.mkdir(mode=0o700)
    for name in ("team", "evil"):
        done = _cli("cache", "keygen", k / f"{name}.key", "--json")
        assert done.returncode == 0, done.stderr
    from trtet_store.cache.tier.signing import load_public_key

    team_id = load_public_key(k / "team.key.pub").key_id
    factory = write_model_factory(here_fs)
    url, ep = f"s3://{s3env.bucket}/team", ("--endpoint-url", s3env.endpoint.url)
    outs = []
    for machine, keys in (("a", ("--signing-key", k / "team.key", "--trusted-key",
                                 k / "team.key.pub")),
                          ("b", ("--trusted-key", k / "team.key.pub")),
                          ("c", ("--trusted-key", k / "evil.key.pub"))):
        done = _cli("compile-and-save", "--no-progress", f"{factory}:make",
                    here_fs / f"{machine}.pte", "--engine-cache", here_fs / f"cache-{machine}",
                    "--engine-cache-remote", url, *ep, *keys, compile_=True)
        assert done.returncode == 0, done.stderr[-3000:]
        outs.append(done.stdout)
    assert ": miss, cached (" in outs[0] and ", published" in outs[0], outs[0]
    assert ": remote-hit, 1.0 MiB downloaded" in outs[1], outs[1]
    # c trusts another key: A's entry is a miss, said on its line; c built its own.
    assert ": miss, cached (" in outs[2] and "the shared entry was not used: refused: signed " \
        f"by '{team_id}', not one of the trusted keys" in outs[2], outs[2]
    [row] = json.loads(_cli("cache", "list", "--remote", url, *ep, "--trusted-key",
                            k / "evil.key.pub", "--json").stdout)
    # The team's key is claimed, not verified (evil's is the only trusted one).
    assert row["claims"] == [team_id] and row["signed_by"] is None
    assert "not one of the trusted keys" in row["refused"]
    key = row["key"]

    # push signs with the pusher's key; pull checks it before downloading anything.
    url2 = f"s3://{s3env.bucket}/pushed"
    done = _cli("cache", "push", "--remote", url2, *ep, "--dir", here_fs / "cache-a",
                "--signing-key", k / "team.key", "--json")
    assert done.returncode == 0, done.stderr
    assert [r["status"] for r in json.loads(done.stdout)] == ["published"]
    pointer = json.loads(s3env.client.get_object(Bucket=s3env.bucket,
                                                 Key=f"pushed/{key}.json")["Body"].read())
    assert pointer["signature"]["key"] == team_id
    refused = _cli("cache", "pull", "--remote", url2, *ep, "--dir", here_fs / "cache-d", key,
                   "--trusted-key", k / "evil.key.pub")
    assert refused.returncode == 1 and refused.stderr.count("\n") == 1, refused.stderr
    assert "TierSignatureError" in refused.stderr and "is refused: signed by" in refused.stderr
    assert not (here_fs / "cache-d" / "keys").exists() or \
        not any((here_fs / "cache-d" / "keys").iterdir())
    done = _cli("cache", "pull", "--remote", url2, *ep, "--dir", here_fs / "cache-d", key,
                "--trusted-key", k / "team.key.pub", "--json")
    assert done.returncode == 0, done.stderr
    assert json.loads(done.stdout)[0]["downloaded"] > 0
    usage = _cli("cache", "list", "--trusted-key", k / "team.key.pub")
    assert usage.returncode == 2 and "need --remote" in usage.stderr
