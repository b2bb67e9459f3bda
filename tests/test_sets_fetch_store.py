"""``fetch_set`` and its local content store (issue 47): seals, ``.ptd`` neighbours, two processes.

Real SeaweedFS, real filesystems (XFS clones, ext4 copies, hard links).
Bytes read are this process's ``rchar`` (``/proc/self/io``: every byte a
read, ``pread`` or ``copy_file_range`` call passed), never a clock.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest
from proclocks import waits_on_a_lock
from sets_helpers import write, xxh

from trtet_store.io import VerificationError
from trtet_store.io.units import MiB
from trtet_store.remote import FetchVerificationError
from trtet_store.remote.upload.config import PublishConfig
from trtet_store.sets import fetch_set, publish_set, verify_member
from trtet_store.testing.proxy import CountingProxy

SHARED = 6 * MiB  # foundation.ptd, in every member
OWN = 2 * MiB + 4321  # each member's model.pte


def url_of(s3, prefix: str = "llm/v3/") -> str:
    return f"s3://{s3.bucket}/{prefix}"


def two_members(s3env, root: Path) -> dict[str, list[Path]]:
    """Members a and b (a model.pte each, one foundation.ptd), published as one set."""
    shared = write(root / "src" / "foundation.ptd", SHARED, 1000)
    members = {n: [write(root / "src" / n / "model.pte", OWN, i), shared]
               for i, n in enumerate("ab")}
    publish_set(members, url_of(s3env), endpoint_url=s3env.endpoint.url,
                config=PublishConfig(journal_dir=s3env.journal_dir))
    return members


def rchar() -> int:
    """Bytes this process's read calls returned so far (all threads)."""
    for line in Path("/proc/self/io").read_text().splitlines():
        if line.startswith("rchar:"):
            return int(line.split()[1])
    raise AssertionError("no rchar in /proc/self/io")


# --- 1. digests travel with the bytes: the store's seal -----------------------------------------


@pytest.mark.parametrize("fstype,mib,how", [("xfs", 300, "clone"), ("ext4", 64, "move"),
                                            ("ext4", 64, "link")])
def test_a_sealed_blob_is_placed_without_reading_it_again(s3env, here_fs, make_fs, fstype,
                                                          mib, how):
    members = two_members(s3env, here_fs)
    mnt = make_fs(fstype, mib)
    link = how == "link"
    fetch_set(url_of(s3env), mnt / "a1", "a", link=link, endpoint_url=s3env.endpoint.url)
    blob = mnt / ".trtet-blobs" / xxh(members["a"][1])
    assert (mnt / ".trtet-blobs" / ".trtet-seals" / blob.name).is_file()
    # The store holds all of a (on ext4: a reference to each of a1's files, which a copy is
    # taken from, trusted by its identity): a second directory is placed from it alone.
    before = rchar()
    rep = fetch_set(url_of(s3env), mnt / "a2", "a", link=link,
                    endpoint_url=s3env.endpoint.url)
    read = rchar() - before
    size = SHARED + OWN
    assert rep.bytes_downloaded == 0 and set(rep.placed) == {how}
    # A copy reads its source once (copy_file_range counts; on ext4 from a1's file, then
    # moved into place); before the seal it was read back against the digests (2x), and a
    # link digested its blob (1x); a clone reads none.
    bound = {"clone": 0, "move": size, "link": 0}[how] + 2 * MiB  # + imports, records
    assert read <= bound, f"placing {size} bytes by {how} read {read} bytes"
    assert (mnt / "a2" / "foundation.ptd").read_bytes() == members["a"][1].read_bytes()
    assert (mnt / "a2" / "model.pte").read_bytes() == members["a"][0].read_bytes()


@pytest.mark.parametrize("fstype,mib,how", [("xfs", 300, "clone"), ("ext4", 64, "copy"),
                                            ("ext4", 64, "link")])
def test_a_store_blob_changed_in_place_is_refused_and_nothing_is_placed(s3env, here_fs,
                                                                       make_fs, fstype, mib,
                                                                       how):
    members = two_members(s3env, here_fs)
    mnt = make_fs(fstype, mib)
    link = how == "link"
    # On ext4 a copy from the store (no move) leaves the blob there, for this test to change.
    fetch_set(url_of(s3env), mnt / "a", "a", endpoint_url=s3env.endpoint.url,
              placements=["copy"] if fstype == "ext4" else None)
    blob = mnt / ".trtet-blobs" / xxh(members["a"][1])
    os.chmod(blob, 0o644)
    with open(blob, "r+b") as f:  # same size, other bytes: its identity changes
        f.seek(SHARED // 2)
        f.write(b"\xff" * 16)
    with pytest.raises(VerificationError, match="changed since it was checked"):
        fetch_set(url_of(s3env), mnt / "b", "b", link=link, endpoint_url=s3env.endpoint.url)
    assert sorted(os.listdir(mnt / "b")) in ([], [".trtet-staging"])
    # A blob touched but not changed is read once and sealed anew.
    os.chmod(blob, 0o444)
    shared = members["a"][1].read_bytes()
    blob.chmod(0o644)
    blob.write_bytes(shared)
    os.chmod(blob, 0o444)
    rep = fetch_set(url_of(s3env), mnt / "b", "b", link=link, endpoint_url=s3env.endpoint.url)
    assert rep.bytes_downloaded == 0 and set(rep.placed) == {how}
    assert (mnt / "b" / "foundation.ptd").read_bytes() == shared
    before = rchar()
    fetch_set(url_of(s3env), mnt / "c", "b", link=link, endpoint_url=s3env.endpoint.url)
    assert rchar() - before <= (SHARED + OWN if how == "copy" else 0) + 2 * MiB


def test_a_store_blob_written_while_it_is_linked_into_place_is_caught(s3env, here_fs,
                                                                      make_fs, monkeypatch):
    # The state: link=True placed the store's blob under the member's name (one inode),
    # and the blob is written before the placement's last check. Our own link changes
    # only the blob's ctime, so that check seals it again, but only when the rest of its
    # identity is still the sealed one; a write changed its mtime too, so the placed file
    # is read back and refused, and the store's seal never vouches for the new bytes.
    import trtet_store.sets.fetch as fetch_module

    members = two_members(s3env, here_fs)
    mnt = make_fs("ext4", 64)
    fetch_set(url_of(s3env), mnt / "a", "a", endpoint_url=s3env.endpoint.url,
              placements=["copy"])  # the blob stays in the store
    blob = mnt / ".trtet-blobs" / xxh(members["a"][1])
    real_place = fetch_module.place_files

    def place_then_write(*args, **kwargs):
        placed = real_place(*args, **kwargs)
        time.sleep(0.01)  # another mtime tick than the link's
        with open(blob, "r+b") as f:  # a writer of the store, mid-fetch (root: 0444 or not)
            f.seek(SHARED // 2)
            f.write(b"\xff" * 16)
        return placed

    monkeypatch.setattr(fetch_module, "place_files", place_then_write)
    with pytest.raises(FetchVerificationError, match="changed while it was placed"):
        fetch_set(url_of(s3env), mnt / "b", "b", link=True, endpoint_url=s3env.endpoint.url)
    monkeypatch.setattr(fetch_module, "place_files", real_place)
    # The store's seal still names the checked identity: the changed blob is refused at
    # its next use, not served.
    with pytest.raises(VerificationError, match="changed since it was checked"):
        fetch_set(url_of(s3env), mnt / "c", "b", link=True, endpoint_url=s3env.endpoint.url)


# --- 3. fetch's rule: a .ptd another .pte of the directory needs ---------------------------------


@pytest.fixture(scope="module")
def other_program(tmp_path_factory) -> dict[str, bytes]:
    """A real XNNPACK program (``program.pte``) reading its weights from ``cpu.ptd``."""
    from programs import executorch_outputs, xnnpack_linear_program
    from versions import needs_file_backed_data

    if needs_file_backed_data.args[0]:
        pytest.skip(needs_file_backed_data.kwargs["reason"])
    program = xnnpack_linear_program(external_tag="cpu", seed=7)
    files = executorch_outputs(program.manager, tmp_path_factory.mktemp("other"))
    assert sorted(files) == ["cpu.ptd", "program.pte"], sorted(files)
    return files


def snapshot(directory: Path) -> dict[str, str]:
    return {p.name: xxh(p) if p.is_file() else "dir" for p in directory.iterdir()}


def test_a_ptd_another_program_needs_is_not_replaced_unless_asked(s3env, here_fs,
                                                                  other_program, capsys):
    from trtet_store import NeededByAnotherError

    src = here_fs / "src"
    members = {"m": [write(src / "model.pte", OWN, 1), write(src / "cpu.ptd", MiB, 2)]}
    publish_set(members, url_of(s3env), endpoint_url=s3env.endpoint.url,
                config=PublishConfig(journal_dir=s3env.journal_dir))
    out = here_fs / "out"
    out.mkdir()
    (out / "other.pte").write_bytes(other_program["program.pte"])
    (out / "cpu.ptd").write_bytes(other_program["cpu.ptd"])
    before = snapshot(out)
    with pytest.raises(NeededByAnotherError, match="other.pte"):
        fetch_set(url_of(s3env), out, "m", endpoint_url=s3env.endpoint.url)
    assert snapshot(out) == before  # nothing written
    assert not (here_fs / ".trtet-blobs").exists()  # nothing downloaded
    # The CLI refuses it too (exit 1, the file untouched), and --replace-needed replaces.
    from trtet_store.cli import main

    argv = ["fetch-set", url_of(s3env), str(out), "--member", "m", "--endpoint-url",
            s3env.endpoint.url, "--json"]
    assert main(argv) == 1
    assert snapshot(out) == before
    assert main([*argv, "--replace-needed"]) == 0
    assert json.loads(capsys.readouterr().out)["bytes_downloaded"] == OWN + MiB
    assert (out / "cpu.ptd").read_bytes() == members["m"][1].read_bytes()
    # The same bytes at that name again replace nothing: not refused.
    fetch_set(url_of(s3env), out, "m", endpoint_url=s3env.endpoint.url)


def test_the_previous_member_s_ptd_another_program_needs_is_kept(s3env, here_fs,
                                                                 other_program):
    src = here_fs / "src"
    cpu = src / "cpu.ptd"
    cpu.parent.mkdir(parents=True)
    cpu.write_bytes(other_program["cpu.ptd"])
    members = {"y": [write(src / "y.pte", OWN, 1), cpu], "x": [write(src / "x.pte", OWN, 2)]}
    publish_set(members, url_of(s3env), endpoint_url=s3env.endpoint.url,
                config=PublishConfig(journal_dir=s3env.journal_dir))
    out = here_fs / "out"
    fetch_set(url_of(s3env), out, "y", endpoint_url=s3env.endpoint.url)
    (out / "other.pte").write_bytes(other_program["program.pte"])  # the user's, reads cpu.ptd
    rep = fetch_set(url_of(s3env), out, "x", endpoint_url=s3env.endpoint.url)
    assert rep.removed == [str(out / "y.pte")]
    assert (out / "cpu.ptd").read_bytes() == other_program["cpu.ptd"]
    assert sorted(os.listdir(out)) == [".trtet-set.json", "cpu.ptd", "other.pte", "x.pte"]


# --- 4. two processes filling one store -------------------------------------------------------

CHILD = """
import json, sys
from trtet_store.sets import fetch_set
url, dest, member, store, endpoint = sys.argv[1:]
rep = fetch_set(url, dest, member, store=store, endpoint_url=endpoint, concurrency=1,
                range_size=1 << 20)
print(json.dumps({"downloaded": rep.bytes_downloaded, "in_store": rep.bytes_in_store}))
"""


class HoldingProxy(CountingProxy):
    """The counting proxy, holding the first ranged GET of a blob until ``release`` is set."""

    def __init__(self, *a, **kw) -> None:
        super().__init__(*a, **kw)
        self.held = threading.Event()
        self.release = threading.Event()

    def _forward(self, dst, data, counter):
        # A ranged GET: inside a blob's download (the fetch holds its staging lock).
        if counter == "_upstream" and data.startswith(b"GET ") and b"/blobs/" in data \
                and b"\r\nrange: " in data.lower() and not self.held.is_set():
            self.held.set()
            self.release.wait(120)
        super()._forward(dst, data, counter)


def test_two_processes_fetching_one_member_into_one_store_download_each_blob_once(
        s3env, here_fs):
    members = two_members(s3env, here_fs)
    root = here_fs / "machine"
    root.mkdir()
    store = root / ".trtet-blobs"
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(
        [str(Path(__file__).resolve().parents[1]), os.environ.get("PYTHONPATH", "")])}
    with HoldingProxy.for_url(s3env.endpoint.url) as px:
        def start(name: str) -> subprocess.Popen:
            return subprocess.Popen(
                [sys.executable, "-c", CHILD, url_of(s3env), str(root / name), "a", str(store),
                 px.endpoint_url], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                env=env)

        first = start("a1")
        try:
            assert px.held.wait(120), "the first process never asked for a blob"
            second = start("a2")  # while the first is inside a blob's download
            try:
                # The barrier: the second is waiting for a blob's lock (or has ended).
                while second.poll() is None and not waits_on_a_lock(second.pid):
                    time.sleep(0.02)
            finally:
                px.release.set()
            outs = [p.communicate(timeout=300) for p in (first, second)]
        finally:
            px.release.set()
            for p in (first, locals().get("second")):
                if p is not None and p.poll() is None:
                    p.kill()
                    p.wait()
        got = px.downstream
    for p, (_, err) in zip((first, second), outs, strict=True):
        assert p.returncode == 0, err[-3000:]
    reports = [json.loads(out.strip().splitlines()[-1]) for out, _ in outs]
    size = SHARED + OWN
    # Each blob by one of them (which one takes the second blob's lock first is theirs).
    assert sum(r["downloaded"] for r in reports) == size, reports
    assert all(r["downloaded"] + r["in_store"] == size for r in reports), reports
    assert got <= size + MiB, got  # each blob once in all, through the proxy
    for name in ("a1", "a2"):
        assert verify_member(root / name).ok
    blobs = sorted({xxh(p) for p in members["a"]})
    # ext4: each blob is a member's file, the store keeps a reference to it (the second
    # process waited for the first's locks, then copied from its files).
    assert sorted(os.listdir(store)) == [".trtet-moving", ".trtet-seals"]
    assert sorted(os.listdir(store / ".trtet-seals")) == blobs  # no lock left, no stray
    for b in blobs:
        ref = json.loads((store / ".trtet-seals" / b).read_text())["ref"]
        assert Path(ref).parent in (root / "a1", root / "a2") and xxh(Path(ref)) == b
    assert os.listdir(store / ".trtet-moving") == []  # no blob left waiting
