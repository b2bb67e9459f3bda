"""What a user is told about the shared tier's trouble and a rebuilt entry (issue 45: 7, 8, 18, 19).

Each export runs in a fresh interpreter that configures no logging (as a
user's script), with the TensorRT build stubbed at its seam; its stderr is
read as the user sees it. The server is SeaweedFS (fixture ``s3env``),
stopped by the test where the case needs it, or reached through
tests/tcp_proxy.py, which cuts its responses.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
from pathlib import Path
from typing import Any

import pytest
import warm
from programs import MODEL_FACTORY

from trtet_store.io.units import MiB

ROOT = Path(__file__).resolve().parents[1]

# One cache, cfg["runs"] exports of the same model; before run i > 0 the child waits
# for <pause>.go<i> (the test changes the server between runs). No logging configured.
CHILD = r'''
import json, os, sys, time
cfg = json.loads(sys.argv[1])
import trtet_store
from trtet_store.testing.stub_tensorrt import FakeBuilder, installed, linear_relu

if cfg.get("ignore"):  # a user's filter, by the category's public name
    import warnings
    warnings.filterwarnings("ignore", category=trtet_store.SharedCacheWarning)
cache = trtet_store.EngineCache(cfg["cache"], min_free=0, remote=cfg["url"],
                                endpoint_url=cfg["endpoint"])
class Counting(FakeBuilder):  # counts calls: a refused build must not even start
    calls = 0
    def __call__(self, *args, **kwargs):
        Counting.calls += 1
        return super().__call__(*args, **kwargs)

module, inputs = linear_relu()
runs = []
for i in range(cfg.get("runs", 1)):
    if i:
        open(f"{cfg['pause']}.{i}", "w").close()
        while not os.path.exists(f"{cfg['pause']}.go{i}"):
            time.sleep(0.02)
    builder = Counting(engine_sizes=tuple(cfg["sizes"]),
                          seeds=tuple(os.getpid() * 10 + j for j in range(len(cfg["sizes"]))))
    try:
        with installed(builder):
            report = trtet_store.compile_and_save(module, inputs, f"{cfg['out']}.{i}.pte",
                                                  engine_cache=cache)
    except Exception as exc:  # the export's refusal, as the caller gets it
        said = exc.strerror if isinstance(exc, OSError) and exc.strerror else exc
        runs.append({"built": len(builder.built), "calls": Counting.calls,
                     "error": f"{type(exc).__name__}: {said}"})
        break
    runs.append({"built": len(builder.built),
                 "events": [e.to_json() for e in report.engine_cache]})
print(json.dumps(runs))
'''

# The CLI, as a user runs it, with the stub builder installed around main().
CLI = r'''
import sys
from trtet_store.cli import main
from trtet_store.testing.stub_tensorrt import FakeBuilder, installed
with installed(FakeBuilder(engine_sizes=(2 << 20,))):
    sys.exit(main(sys.argv[1:]))
'''


def child(cfg: dict, env: dict | None = None) -> warm.WarmChild:
    return warm.popen(CHILD, [json.dumps(cfg)], cwd=ROOT, env=env)


def finish(proc: warm.WarmChild, timeout: float = 300) -> tuple[list[dict], str]:
    out, err = proc.communicate(timeout=timeout)
    assert proc.returncode == 0, err[-4000:]
    return json.loads(out.strip().splitlines()[-1]), err


def said(err: str) -> list[str]:
    """The warnings a user sees: Python's default display, one line each here (``-c``)."""
    return [line for line in err.splitlines() if "SharedCacheWarning" in line]


def config(base: Path, s3: Any, name: str, **kw: Any) -> dict:
    cfg = {"cache": os.fspath(base / f"cache-{name}"), "out": os.fspath(base / name),
           "url": f"s3://{s3.bucket}/engines", "endpoint": s3.endpoint.url,
           "sizes": [2 * MiB], "pause": os.fspath(base / f"pause-{name}")}
    cfg.update(kw)
    return cfg


def wait_file(path: str, proc: warm.WarmChild, timeout: float = 120) -> None:
    import time

    deadline = time.monotonic() + timeout
    while not os.path.exists(path):
        if proc.poll() is not None:
            raise AssertionError(f"the child exited ({proc.returncode}): "
                                 f"{proc.stderr.read()[-3000:]}")
        assert time.monotonic() < deadline, f"timed out waiting for {path}"
        time.sleep(0.05)


# -- 7: the first problem with a tier is seen on stderr, once per cache -----------------------


@pytest.mark.parametrize("problem", ["down", "credentials", "bucket"])
def test_a_tier_problem_is_one_warning_on_stderr_and_works_again_once(here_fs, s3env, problem):
    env = dict(os.environ)
    kw: dict[str, Any] = {"runs": 3}
    if problem == "credentials":
        env["AWS_SECRET_ACCESS_KEY"] = "not-the-secret"
        name = "AccessDeniedError"
    elif problem == "bucket":
        kw["url"] = "s3://no-such-bucket-45/engines"
        name = "BucketNotFoundError"
    else:
        name = "EndpointUnreachableError"
        s3env.server.stop()
    proc = child(config(here_fs, s3env, "a", **kw), env)
    try:
        # Run 0 met the problem (lookup, then no publish); run 1 meets it again (the pending
        # publish of the local hit). For "down", the server is back before run 2.
        wait_file(f"{here_fs}/pause-a.1", proc)
        (here_fs / "pause-a.go1").touch()
        wait_file(f"{here_fs}/pause-a.2", proc)
        if problem == "down":
            s3env.server.start()
        (here_fs / "pause-a.go2").touch()
        runs, err = finish(proc)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert [r["built"] for r in runs] == [1, 0, 0], err[-3000:]
    lines = said(err)
    url = kw.get("url", f"s3://{s3env.bucket}/engines")
    cache = here_fs / "cache-a"
    assert lines[0].endswith(f"SharedCacheWarning: engine cache {cache}: the shared cache {url} "
                             f"was not usable (lookup: {name}: " + lines[0].split(f"{name}: ")[1])
    assert lines[0].endswith("; going on with the local cache only"), lines
    if problem == "down":  # once, then once more when it works again (the pending publish)
        assert len(lines) == 2, err[-3000:]
        assert lines[1].endswith(f"SharedCacheWarning: engine cache {cache}: the shared cache "
                                 f"{url} works again"), lines
        assert runs[2]["events"][0]["published"] is True
    else:  # once per cache: run 1's failed publish is not warned again
        assert len(lines) == 1, err[-3000:]
        assert f"(publish: {name}: " in runs[1]["events"][0]["publish_reason"]
    # A named category: a user's filter silences it (the export is the same).
    if problem == "down":
        s3env.server.stop()
    try:
        runs, err = finish(child(config(here_fs, s3env, "b", ignore=True), env))
    finally:
        if problem == "down":
            s3env.server.start()
    assert runs[0]["built"] == 1 and said(err) == [], err[-3000:]


# -- 7 and 8: a tampered shared entry ---------------------------------------------------------


def test_a_tampered_shared_entry_is_warned_and_its_rebuild_says_why(here_fs, s3env):
    a, _ = finish(child(config(here_fs, s3env, "a")))
    key = a[0]["events"][0]["key"].rsplit(".e", 1)[0]
    pointer = json.loads(s3env.client.get_object(
        Bucket=s3env.bucket, Key=f"engines/{key}.json")["Body"].read())
    engine = f"engines/{pointer['attempt']}e0"
    size = len(s3env.client.get_object(Bucket=s3env.bucket, Key=engine)["Body"].read())
    s3env.client.put_object(Bucket=s3env.bucket, Key=engine, Body=os.urandom(size))

    b, err = finish(child(config(here_fs, s3env, "b")))
    [line] = said(err)
    assert f"SharedCacheWarning: engine cache {here_fs / 'cache-b'}: the shared entry {key} " \
           "is damaged, never served: " in line, line
    assert line.endswith("; building it here and replacing it"), line
    [event] = b[0]["events"]
    assert b[0]["built"] == 1 and event["outcome"] == "miss"
    assert event["reason"].startswith("rebuilt: the shared cache's entry was damaged ("), event
    assert f"entry {key} is damaged (" in event["reason"], event  # how: the tier's check
    assert (event["published"], event["publish_reason"]) == (True, None), event  # replaced


# -- 7 and 8 through the CLI: one line each ---------------------------------------------------


def test_the_cli_says_a_tier_problem_and_a_damaged_rebuild_in_one_line(here_fs, s3env):
    from trtet_store.export.engine_cache import EngineCache

    (here_fs / "model.py").write_text(MODEL_FACTORY)
    cache = here_fs / "cache"

    def cli(out: str) -> subprocess.CompletedProcess:
        return warm.run(
            CLI, ["compile-and-save", "--no-progress",
                  f"{here_fs / 'model.py'}:make", os.fspath(here_fs / out), "--engine-cache",
                  os.fspath(cache), "--engine-cache-remote", "s3://engines-45/engines",
                  "--endpoint-url", closed],
            cwd=ROOT, timeout=300)

    # A server that does not answer (a missing bucket or wrong credentials are refused
    # before the build: test_check_before_build.py): a warning, and the build goes on.
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        closed = f"http://127.0.0.1:{s.getsockname()[1]}"  # nothing listens there
    first = cli("a.pte")
    assert first.returncode == 0, first.stderr[-3000:]
    [line] = [x for x in first.stderr.splitlines() if "trtet-store" in x or "Shared" in x]
    assert line == (f"trtet-store: warning: engine cache {cache}: the shared cache "
                    "s3://engines-45/engines was not usable (lookup: "
                    + line.split("was not usable (lookup: ")[1]), first.stderr
    assert "Unreachable" in line or "could not connect" in line.lower(), line
    assert line.endswith("; going on with the local cache only")
    # A flipped byte in the cached engine: the next run rebuilds and says why, one line.
    [engine] = [e for e in EngineCache(cache).entries() if e.key.endswith(".e0")]
    blob = next(p for p in (cache / "blobs").rglob("*") if p.is_file()
                and p.stat().st_size == engine.size)
    with open(blob, "r+b") as f:
        f.seek(4096)
        b = f.read(1)
        f.seek(4096)
        f.write(bytes([b[0] ^ 1]))
    second = cli("b.pte")
    assert second.returncode == 0, second.stderr[-3000:]
    [event] = [x for x in second.stdout.splitlines() if x.startswith("  engine ")]
    assert ": miss, cached (" in event, second.stdout
    assert "), rebuilt: the cached entry was damaged (engine 0: digest mismatch (first bad " \
           "chunk 0)), not published (" in event, event


# -- 19: a cut remote hit says what failed and what happens next -----------------------------


def test_a_cut_remote_hit_says_what_failed_and_what_happens_next(here_fs, s3env, tcp_proxy):
    from tcp_proxy import Fault

    size = 24 * MiB
    a, _ = finish(child(config(here_fs, s3env, "a", sizes=[size])))
    key = a[0]["events"][0]["key"].rsplit(".e", 1)[0]
    # Every response carrying the engine's bytes is cut after 3 MiB: the fetch's retries
    # are spent, and the download fails part way.
    proxy = tcp_proxy(s3env.endpoint.url, [Fault(
        "response", "reset", at=3 * MiB, times=10**6,
        match=lambda m: m.method == "GET" and m.target.split("?")[0].endswith("/e0"))])
    b, err = finish(child(config(here_fs, s3env, "b", sizes=[size], endpoint=proxy.url)))
    assert proxy.fired, "the proxy cut nothing"
    assert b[0]["built"] == 1, err[-3000:]
    [line] = said(err)
    downloads = here_fs / "cache-b" / "downloads" / key
    assert f": engine cache {here_fs / 'cache-b'}: the shared cache's download of {key} " \
           "failed (" in line, line
    assert line.endswith(f"); building locally; the partial download is kept in {downloads} "
                         "and resumed next time"), line
    assert "failed (the connection was reset at " in line, line
    assert " MiB of 24.0 MiB); building locally" in line, line
    assert "trtet-store fetch" not in line and "run `" not in line, line
    assert "trtet-store fetch" not in b[0]["events"][0]["publish_reason"]
    assert any(p.is_file() for p in downloads.rglob("*")), "the partial download was not kept"
    # The next remote hit (the server reachable again) takes A's engine; the download is gone.
    c, _ = finish(child(config(here_fs, s3env, "b", sizes=[size], out=os.fspath(here_fs / "c"),
                               cache=os.fspath(here_fs / "cache-b2"))))
    assert c[0]["built"] == 0 and c[0]["events"][0]["outcome"] == "remote-hit"


# -- 18: no room for the known engine: refused before building ------------------------------


def test_no_room_for_the_shared_entrys_engine_refuses_before_building(here_fs, s3env, make_fs):
    size = 24 * MiB
    a, _ = finish(child(config(here_fs, s3env, "a", sizes=[size])))
    mnt = make_fs("ext4", 64)
    (mnt / "cache").mkdir()
    fill = mnt / "fill"
    free = os.statvfs(mnt).f_bavail * os.statvfs(mnt).f_frsize
    with open(fill, "wb") as f:  # leave 16 MiB: less than the engine's 24
        os.posix_fallocate(f.fileno(), 0, free - 16 * MiB)
    before = sorted(p.relative_to(mnt) for p in mnt.rglob("*"))
    b, err = finish(child(config(mnt, s3env, "b", sizes=[size],
                                 cache=os.fspath(mnt / "cache"))))
    [run] = b
    assert run["calls"] == 0, run  # the stubbed build never ran
    error = run.get("error", "")
    assert error.startswith("InsufficientSpaceError: not enough free space for "), run
    assert re.search(r": needs \d+\.\d MiB, \d+\.\d MiB available; free \d+\.\d MiB ", error), error
    assert "the shared cache's entry " in error and "nothing was built" in error, error
    assert "\n" not in error
    # Nothing of the build was left staged (no engine written).
    left = [p for p in mnt.rglob("*") if p.is_file() and p.stat().st_size >= MiB
            and p != fill]
    assert left == [], left
    assert len(sorted(p.relative_to(mnt) for p in mnt.rglob("*"))) >= len(before)
