"""The cache works only in a directory it made: issue 44 (trial finding 1, item 3; finding 7's
umask) and issue 45 item 11.

The trial pointed ``trtet-store cache list --dir`` at a project directory and lost five files
(opening the cache ran its recovery), and root's ``cache stats`` through a link that another
user planted in a 1777 directory deleted the victim's files. Here each attack is real: the
CLI in a child process, the attacker a child that drops to uid 65534, on the root disk; and
each test proves, by digests, listings and mtimes, that nothing outside changed.
"""

from __future__ import annotations

import json
import os
import stat
import subprocess
import sys
from pathlib import Path

import pytest
from attacker import NOBODY, as_nobody
from digests import file_digest

from trtet_store.cache import BlobCache, CacheDirectoryError
from trtet_store.cache.directory import SIGNATURE, TAG_NAME
from trtet_store.io import MiB

ROOT = Path(__file__).resolve().parent.parent


def cli(*argv: object, env: dict[str, str] | None = None) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "trtet_store.cli", "cache",
                           *map(os.fspath, argv)], capture_output=True, text=True, timeout=300,
                          cwd=ROOT, env=env)


def snapshot(top: Path) -> dict[str, tuple]:
    """Every entry under ``top`` (itself too): type, mode, owner, size, mtime, digest."""
    out = {}
    for path in [top, *sorted(top.rglob("*"))]:
        st = os.lstat(path)
        digest = file_digest(path) if stat.S_ISREG(st.st_mode) else None
        out[path.relative_to(top).as_posix()] = (stat.S_IFMT(st.st_mode), st.st_mode,
                                                  st.st_uid, st.st_size, st.st_mtime_ns, digest)
    return out


def one_line_refusal(done: subprocess.CompletedProcess, *texts: str) -> str:
    assert done.returncode != 0, done.stdout
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1 and "Traceback" not in done.stderr, done.stderr
    for text in texts:
        assert text in lines[0], lines[0]
    return lines[0]


def project(directory: Path) -> Path:
    """The trial's project directory: files under our layout's names that are not a cache."""
    for name, data in (("tmp/run-17.log", b"epoch 17\n"), ("tmp/checkpoint.bin", os.urandom(4096)),
                       ("blobs/dataset.csv", b"a,b\n1,2\n"),
                       ("keys/config.json", b'{"lr": 0.1}'), ("flights/plan.lock", b"")):
        path = directory / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(data)
    return directory


def real_cache(directory: Path) -> Path:
    cache = BlobCache(directory, max_bytes=16 * MiB)
    source = directory.parent / f"{directory.name}-engine"
    source.write_bytes(os.urandom(MiB))
    assert cache.put("k" * 16, source).stored
    source.unlink()
    return directory


@pytest.mark.parametrize("action", ["list", "stats", "verify", "clear", "recover"])
def test_a_project_directory_is_refused_by_the_cli_and_nothing_is_deleted(here_fs, action):
    """Finding 1: ``cache list --dir`` deleted tmp/run-17.log ... flights/plan.lock."""
    directory = project(here_fs / "project")
    before = snapshot(directory)
    line = one_line_refusal(cli("--dir", directory, action),
                            f"{directory} is not a trtet_store cache (no CACHEDIR.TAG)",
                            "pass an empty or new directory")
    assert "CacheDirectoryError" in line
    assert snapshot(directory) == before


@pytest.mark.parametrize("opener", ["BlobCache", "EngineCache", "EngineCache(read_only)"])
def test_a_project_directory_is_refused_by_the_api_and_nothing_is_deleted(here_fs, opener):
    import trtet_store

    directory = project(here_fs / "project")
    before = snapshot(directory)
    with pytest.raises(trtet_store.CacheDirectoryError, match="is not a trtet_store cache"):
        if opener == "BlobCache":
            BlobCache(directory, max_bytes=MiB)
        else:
            trtet_store.EngineCache(directory, read_only=opener.endswith("(read_only)"))
    assert snapshot(directory) == before


def plant_link(shared: Path, target: Path) -> Path:
    """uid 65534 makes ``shared/cache -> target`` in the 1777 ``shared``."""
    link = shared / "cache"
    as_nobody(lambda: os.symlink(target, link))
    assert os.lstat(link).st_uid == NOBODY
    return link


@pytest.mark.parametrize("victim_holds", ["project files", "a trtet_store cache"])
def test_a_link_another_user_planted_in_a_sticky_directory_is_refused(here_fs, victim_holds):
    """Finding 1: root's ``cache stats --dir shared/cache`` followed another user's link into a
    0700 directory, deleted its files and made ``lock`` and ``flights/`` there. Even when the
    target is a real cache of root's, the link is refused (the marker would not stop that)."""
    import trtet_store

    shared = here_fs / "shared"
    shared.mkdir()
    shared.chmod(0o1777)
    victim = here_fs / "victim"
    if victim_holds == "project files":
        victim.mkdir(mode=0o700)
        for name in ("tmp/run.log", "keys/notes.json", "blobs/data.bin"):
            (victim / name).parent.mkdir(exist_ok=True)
            (victim / name).write_bytes(os.urandom(100))
    else:
        real_cache(victim)
        os.unlink(victim / "lock")  # so that a lock made through the link would show
        os.rmdir(victim / "flights")
        (victim / "tmp" / f"999999-{'0' * 32}").write_bytes(b"stale")  # recovery would take it
    victim.chmod(0o700)
    link = plant_link(shared, victim)
    before, shared_before = snapshot(victim), sorted(os.listdir(shared))
    for action in ("stats", "list", "verify", "clear", "recover"):
        one_line_refusal(cli("--dir", link, action), f"{link} is not a trtet_store cache "
                         "directory: it is a symbolic link", "pass the cache directory itself")
    with pytest.raises(CacheDirectoryError, match="it is a symbolic link"):
        trtet_store.EngineCache(link)
    with pytest.raises(CacheDirectoryError, match="it is a symbolic link"):
        trtet_store.EngineCache(link, read_only=True)
    with pytest.raises(CacheDirectoryError, match="it is a symbolic link"):
        BlobCache(link, max_bytes=MiB)
    assert snapshot(victim) == before
    assert not (victim / "lock").exists() and not (victim / "flights").exists()
    assert sorted(os.listdir(shared)) == shared_before


def test_the_torch_tensorrt_adapter_refuses_a_planted_link(here_fs):
    import upstream

    from trtet_store.export.trt_engine_cache import for_torch_tensorrt
    from trtet_store.testing import upstream_engine_cache as uec

    try:
        wheel = upstream.wheel("torch-tensorrt")
    except upstream.WheelUnavailable as exc:
        from filesystems import unavailable

        unavailable(str(exc))
    shared = here_fs / "shared"
    shared.mkdir()
    shared.chmod(0o1777)
    victim = real_cache(here_fs / "victim")
    link = plant_link(shared, victim)
    before = snapshot(victim)
    with uec.as_torch_tensorrt(uec.load(wheel)), \
            pytest.raises(CacheDirectoryError, match="it is a symbolic link"):
        for_torch_tensorrt(link, tensorrt_version="10.14.1", compute_capability="sm_90")
    assert snapshot(victim) == before


def test_a_read_only_list_leaves_a_real_cache_untouched(here_fs):
    """list and stats open read-only: a stale temp file stays, no lock or flights/ is made;
    ``cache recover`` then removes it and says what it removed."""
    directory = real_cache(here_fs / "cache")
    stale = directory / "tmp" / f"999999-{'a' * 32}"  # a dead writer's: recovery removes it
    stale.write_bytes(b"half an engine")
    os.utime(stale, (1, 1))
    os.unlink(directory / "lock")
    os.rmdir(directory / "flights")
    before = snapshot(directory)
    listed = cli("--dir", directory, "list", "--json")
    assert listed.returncode == 0, listed.stderr
    assert [row["key"] for row in json.loads(listed.stdout)] == ["k" * 16]
    stats = cli("--dir", directory, "stats")
    assert stats.returncode == 0 and "entries:    1 " in stats.stdout, stats.stderr
    import trtet_store

    cache = trtet_store.EngineCache(directory, read_only=True)
    assert [e.key for e in cache.entries()] == ["k" * 16]
    hit = cache.blobs.get("k" * 16)
    assert hit is not None
    hit.close()
    assert snapshot(directory) == before
    done = cli("--dir", directory, "recover")
    assert done.returncode == 0, done.stderr
    assert done.stdout.splitlines() == [f"{directory}: removed 1 leftover files",
                                        f"  tmp/{stale.name}"]
    assert not stale.exists() and (directory / "keys" / f"{'k' * 16}.json").exists()


def test_an_empty_directory_is_adopted_and_tagged(here_fs):
    directory = here_fs / "empty"
    directory.mkdir(mode=0o700)
    done = cli("--dir", directory, "list")  # a read-only open writes nothing
    assert done.returncode == 0 and "no entries" in done.stdout, done.stderr
    assert os.listdir(directory) == []
    BlobCache(directory, max_bytes=MiB)
    lines = (directory / TAG_NAME).read_text().splitlines()
    assert lines[0] == SIGNATURE and "# trtet_store cache format: 1" in lines
    assert sorted(os.listdir(directory)) == [TAG_NAME, "blobs", "flights", "keys", "lock",
                                                 "tmp"]
    made = here_fs / "new" / "cache"
    BlobCache(made, max_bytes=MiB)
    assert (made / TAG_NAME).read_text().splitlines()[0] == SIGNATURE


def test_a_previous_release_cache_is_adopted_on_the_first_write_open(here_fs):
    """A cache of the release before the tag: our exact layout, records that parse."""
    directory = real_cache(here_fs / "cache")
    (directory / TAG_NAME).unlink()
    (directory / "summary").unlink()  # nor the summary: that release wrote none
    (directory / "downloads" / ("k" * 16)).mkdir(parents=True)  # the engine cache's own
    (directory / "remote-pending").mkdir()
    (directory / "remote-pending" / ("k" * 16)).touch()
    (directory / "remote-journal").mkdir()
    (directory / "remote-journal" / f"{'0' * 32}.publish.jsonl").write_bytes(b"{}\n")
    before = snapshot(directory)
    done = cli("--dir", directory, "list", "--json")
    assert done.returncode == 0, done.stderr
    assert [row["key"] for row in json.loads(done.stdout)] == ["k" * 16]
    assert snapshot(directory) == before  # read-only: no tag written
    cache = BlobCache(directory, max_bytes=16 * MiB)
    assert (directory / TAG_NAME).read_text().splitlines()[0] == SIGNATURE
    hit = cache.get("k" * 16)
    assert hit is not None
    hit.close()


@pytest.mark.parametrize("unknown", ["notes.txt", "blobs/dataset.csv", "keys/config.json",
                                     "tmp/run-17.log", "keys/broken.json",
                                     "remote-pending/report.pdf", "downloads/photo.jpg"])
def test_a_previous_release_cache_with_anything_unknown_in_it_is_refused(here_fs, unknown):
    directory = real_cache(here_fs / "cache")
    (directory / TAG_NAME).unlink()
    (directory / "summary").unlink()  # nor the summary: that release wrote none
    (directory / unknown).parent.mkdir(exist_ok=True)
    (directory / unknown).write_bytes(b"{not json" if unknown == "keys/broken.json" else b"x")
    before = snapshot(directory)
    with pytest.raises(CacheDirectoryError, match=f"it holds {unknown}, which no trtet_store"):
        BlobCache(directory, max_bytes=16 * MiB)
    one_line_refusal(cli("--dir", directory, "stats"), "is not a trtet_store cache")
    assert snapshot(directory) == before


@pytest.mark.parametrize("tag,problem", [
    (f"{SIGNATURE}\n# made by another tool\n", "is another program's cache"),
    (f"{SIGNATURE}\n# trtet_store cache format: 2\n", "of format 2, newer than"),
])
def test_another_programs_or_a_newer_tag_is_refused(here_fs, tag, problem):
    directory = here_fs / "tagged"
    directory.mkdir(mode=0o700)
    (directory / TAG_NAME).write_text(tag)
    (directory / "data").write_bytes(b"theirs")
    before = snapshot(directory)
    with pytest.raises(CacheDirectoryError, match=problem):
        BlobCache(directory, max_bytes=MiB)
    assert snapshot(directory) == before


@pytest.mark.parametrize("base", ["XDG_CACHE_HOME", "HOME"])
def test_the_default_locations_parents_are_made_0700_under_umask_000(here_fs, base):
    """Finding 7: under ``umask 000``, ``~/.cache/trtet_store`` was made 0777."""
    env = {k: v for k, v in os.environ.items() if k not in ("XDG_CACHE_HOME", "HOME")}
    env["PYTHONPATH"] = os.fspath(ROOT)
    if base == "XDG_CACHE_HOME":
        env["XDG_CACHE_HOME"] = os.fspath(here_fs / "xdg")
        made = [here_fs / "xdg", here_fs / "xdg" / "trtet_store"]
    else:
        env["HOME"] = os.fspath(here_fs)
        made = [here_fs / ".cache", here_fs / ".cache" / "trtet_store"]
    code = ("import os; os.umask(0); from trtet_store.cache import BlobCache; "
            "print(BlobCache(max_bytes=1 << 20).directory)")
    done = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True,
                          text=True, timeout=120, cwd=ROOT)
    assert done.returncode == 0, done.stderr
    assert Path(done.stdout.strip()) == made[-1] / "engines"
    modes = {p.name: oct(stat.S_IMODE(os.lstat(p).st_mode)) for p in (*made, made[-1] / "engines")}
    assert modes == {p.name: "0o700" for p in (*made, made[-1] / "engines")}


def test_proc_self_is_not_a_cache_directory_in_one_line(here_fs):
    """Issue 45 item 11: ``cache --dir /proc/self list`` raised FileNotFoundError .../keys."""
    one_line_refusal(cli("--dir", "/proc/self", "list"), "not a trtet_store cache directory")
    one_line_refusal(cli("--dir", f"/proc/{os.getpid()}", "list"),
                     "is not a trtet_store cache (no CACHEDIR.TAG)")
    missing = cli("--dir", here_fs / "nothing", "list")
    assert missing.returncode == 0 and missing.stdout.strip() == \
        f"no engine cache at {here_fs / 'nothing'}: nothing cached", missing.stderr
    assert not (here_fs / "nothing").exists()
