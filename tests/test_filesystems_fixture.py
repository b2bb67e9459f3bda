"""The real-filesystem fixtures make what they promise and leave nothing behind."""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from filesystems import (
    FSTYPES,
    FilesystemFactory,
    free_bytes,
    loop_devices_under,
    mounted_fstype,
    mounts_under,
)

from trtet_store.io.units import MiB, format_mib

TESTS_DIR = Path(__file__).resolve().parent
REPO_ROOT = TESTS_DIR.parent

# Sizes at which each type's metadata overhead stays well under 40 %.
SIZES_MIB = {"ext4": 128, "xfs": 300, "btrfs": 256, "tmpfs": 64}


def _block_statfs_type(path: Path) -> str | None:
    """Ask stat -f too, so the type is not only what /proc/mounts claims."""
    proc = subprocess.run(["stat", "-f", "-c", "%T", str(path)], capture_output=True, text=True)
    return proc.stdout.strip() or None


@pytest.mark.parametrize("fstype", FSTYPES)
def test_make_fs_mounts_requested_type_with_space(make_fs, fs_factory, fstype):
    size = SIZES_MIB[fstype]
    mnt = make_fs(fstype, size)

    assert mnt.is_dir()
    assert mounted_fstype(mnt) == fstype
    assert _block_statfs_type(mnt) in {fstype, "ext2/ext3"}  # stat -f names ext4 "ext2/ext3"
    free = free_bytes(mnt)
    assert 0.6 * size * MiB <= free <= size * MiB, f"{fstype}: {format_mib(free)} free"

    # Writable, and the data lands on this filesystem, not beside it.
    f = mnt / "probe.bin"
    f.write_bytes(b"x" * (4 * MiB))
    os.sync()
    assert f.read_bytes()[:4] == b"xxxx"
    assert os.stat(f).st_dev == os.stat(mnt).st_dev != os.stat(mnt.parent).st_dev

    (fs,) = [m for m in fs_factory.mounted if m.mountpoint == mnt]
    if fstype == "tmpfs":
        assert fs.image is None and fs.loop_device is None
    else:
        assert fs.loop_device is not None and fs.loop_device.startswith("/dev/loop")
        assert loop_devices_under(fs.image) == [fs.loop_device]
        # The image is sparse: an empty fs costs far less disk than its size.
        assert os.stat(fs.image).st_blocks * 512 < size * MiB


def test_make_fs_passes_mount_and_mkfs_options(make_fs):
    mnt = make_fs("ext4", 64, mount_options=["noatime"], mkfs_options=["-b", "1024"])
    opts = next(o for _s, mp, _t, o in _proc_mounts() if mp == str(mnt))
    assert "noatime" in opts.split(",")
    assert os.statvfs(mnt).f_frsize == 1024

    default = make_fs("ext4", 64)
    assert os.statvfs(default).f_frsize == 4096

    tmp = make_fs("tmpfs", 8, mount_options="mode=0700")
    assert os.statvfs(tmp).f_blocks * os.statvfs(tmp).f_frsize == 8 * MiB


def test_xfs_has_reflink(make_fs):
    mnt = make_fs("xfs", 300)
    proc = subprocess.run(["xfs_info", str(mnt)], capture_output=True, text=True)
    if proc.returncode != 0:
        pytest.skip("xfs_info unavailable")
    assert "reflink=1" in proc.stdout


def test_make_fs_rejects_bad_requests(make_fs):
    with pytest.raises(ValueError, match="at least 300"):
        make_fs("xfs", 64)
    with pytest.raises(ValueError, match="unknown fstype"):
        make_fs("zfs", 64)


@pytest.mark.parametrize("ci", ["", "true"])
def test_unavailable_skips_or_fails_under_ci(make_fs, monkeypatch, ci):
    """Not root, no mkfs tool, a refused mount: skip normally, fail under CI=true."""
    import filesystems

    monkeypatch.setenv("CI", ci)
    outcome = pytest.fail.Exception if ci else pytest.skip.Exception

    # A real mount refusal, from an option ext4 does not know.
    with pytest.raises(outcome, match="mounting ext4"):
        make_fs("ext4", 32, mount_options=["no_such_option_trtet"])

    real_which = filesystems._which
    monkeypatch.setattr(
        filesystems, "_which", lambda tool: None if tool == "mkfs.btrfs" else real_which(tool)
    )
    with pytest.raises(outcome, match="btrfs-progs"):
        make_fs("btrfs", 128)

    monkeypatch.setattr(os, "geteuid", lambda: 1000)
    with pytest.raises(outcome, match="needs root"):
        make_fs("tmpfs", 8)


def test_here_fs_is_on_the_root_disk(here_fs, fs_factory):
    assert here_fs.is_dir() and not any(here_fs.iterdir())
    assert os.stat(here_fs).st_dev == os.stat(fs_factory.root).st_dev
    assert mounted_fstype(here_fs) is None
    assert _block_statfs_type(here_fs) != "tmpfs"


def test_release_removes_everything(here_fs):
    with FilesystemFactory(root=here_fs) as factory:
        made = {t: factory.make(t, SIZES_MIB[t]) for t in FSTYPES}
        images = [m.image for m in factory.mounted if m.image is not None]
        assert len(mounts_under(factory.base)) == 4
        assert len(loop_devices_under(factory.base)) == 3

        assert factory.release(made["xfs"]) == []
        assert mounted_fstype(made["xfs"]) is None
        assert not made["xfs"].exists()
        base = factory.base
    assert mounts_under(base) == []
    assert loop_devices_under(base) == []
    assert not any(img.exists() for img in images)
    assert not base.exists()


def test_busy_filesystem_is_released_lazily(here_fs):
    with FilesystemFactory(root=here_fs) as factory:
        mnt = factory.make("ext4", 32)
        image = factory.mounted[0].image
        held = open(mnt / "held", "wb")  # noqa: SIM115 - kept open on purpose across release
        try:
            with pytest.warns(UserWarning, match="unmounted lazily"):
                assert factory.release(mnt) == []
            assert mounted_fstype(mnt) is None
            assert factory.leftovers() == []
        finally:
            held.close()
    # With the last file closed the device detaches itself (autoclear).
    for _ in range(100):
        if not loop_devices_under(image):
            break
        time.sleep(0.05)
    assert loop_devices_under(image) == []


INNER_TEST = """
import json, os, time

def test_inner(make_fs, fs_factory):
    mounts = {t: str(make_fs(t, s)) for t, s in [("ext4", 32), ("xfs", 300), ("btrfs", 128),
                                                  ("tmpfs", 16)]}
    record = {
        "base": str(fs_factory.base),
        "mounts": mounts,
        "images": [str(m.image) for m in fs_factory.mounted if m.image is not None],
    }
    with open(os.environ["TRTET_RECORD"], "w") as f:
        json.dump(record, f)
    mode = os.environ["TRTET_MODE"]
    if mode == "fail":
        assert False, "inner test fails on purpose"
    if mode == "kill":
        os.kill(os.getpid(), 9)
"""


def _run_inner_session(tmp: Path, mode: str) -> tuple[subprocess.CompletedProcess[str], dict]:
    """Run a pytest session that uses the real fixtures, in a subprocess."""
    suite = tmp / "suite"
    suite.mkdir()
    shutil.copy(TESTS_DIR / "conftest.py", suite / "conftest.py")
    (suite / "test_inner.py").write_text(INNER_TEST)
    record = tmp / "record.json"
    env = dict(os.environ)
    env.update(
        TRTET_FS_ROOT=str(tmp / "fsroot"),
        TRTET_RECORD=str(record),
        TRTET_MODE=mode,
        PYTHONPATH=os.pathsep.join([str(TESTS_DIR), str(REPO_ROOT)]),
    )
    proc = subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "--rootdir", str(suite)],
        cwd=suite,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    if not record.exists():
        pytest.fail(f"inner session did not run:\n{proc.stdout}\n{proc.stderr}")
    return proc, json.loads(record.read_text())


def _assert_all_gone(record: dict) -> None:
    for mnt in record["mounts"].values():
        assert mounted_fstype(mnt) is None, f"{mnt} still mounted"
    assert mounts_under(record["base"]) == []
    assert loop_devices_under(record["base"]) == []
    assert not any(Path(img).exists() for img in record["images"])
    assert not Path(record["base"]).exists()


@pytest.mark.parametrize("mode", ["pass", "fail"])
def test_fixture_teardown_leaves_nothing(here_fs, mode):
    proc, record = _run_inner_session(here_fs, mode)
    assert proc.returncode == (0 if mode == "pass" else 1), proc.stdout + proc.stderr
    # The inner session really mounted all four types.
    assert set(record["mounts"]) == set(FSTYPES)
    _assert_all_gone(record)


def test_killed_session_is_cleaned_by_the_next(here_fs):
    proc, record = _run_inner_session(here_fs, "kill")
    assert proc.returncode == -signal.SIGKILL
    # SIGKILL skips teardown: the mounts are still there...
    assert len(mounts_under(record["base"])) == 4
    # ...until the next session's factory collects the dead owner's leftovers.
    with FilesystemFactory(root=here_fs / "fsroot") as factory:
        assert Path(record["base"]) in factory.stale_cleaned
    _assert_all_gone(record)


SIGTERMED = """
import contextlib, json, os, sys, time
from trtet_store.testing.loopfs import FilesystemFactory
root, mode = sys.argv[1:3]
factory = FilesystemFactory(root=root)  # as trtet-store bench and conftest hold theirs
with factory if mode == "with" else contextlib.nullcontext():
    mnt = factory.make("ext4", 64)
    record = {"base": str(factory.base), "mounts": {"ext4": str(mnt)},
              "images": [str(factory.mounted_at(mnt).image)]}
    if mode == "forked child":  # the child inherits the handler, not the filesystems
        ready_r, ready_w = os.pipe()
        pid = os.fork()
        if pid == 0:
            os.write(ready_w, b"r")
            time.sleep(120)
            os._exit(0)
        # CPython clears the signals a child got before its after-fork code ran: a
        # SIGTERM sent before the child says it is ready would be lost, not handled.
        os.read(ready_r, 1)
        record["child"] = pid
    print(json.dumps(record), flush=True)
    time.sleep(120)
"""


def _wait_until_dead(pid: int) -> None:
    """Wait for a process that is not our child to end (gone, or a zombie of its parent).

    A hang guard, not a speed bound: as the parent's ``wait(timeout=60)``. Ten seconds
    was too few in CI, where both suites share two cores and a disk that stalls.
    """
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        try:
            state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
        except FileNotFoundError:
            return
        if state == "Z":
            return
        time.sleep(0.05)
    pytest.fail(f"process {pid} did not end after SIGTERM")


@pytest.mark.parametrize("mode", ["with", "held", "forked child"])
def test_sigterm_tears_down_what_the_factories_made_before_dying(here_fs, mode):
    # A benchmark stopped with kill/timeout (SIGTERM) skipped its teardown and
    # left a loop filesystem mounted; now the process releases what its open
    # factories made (in a `with` block or held open), and still dies of
    # SIGTERM. A forked child that gets SIGTERM releases nothing of its parent's.
    env = dict(os.environ, PYTHONPATH=str(REPO_ROOT))
    proc = subprocess.Popen([sys.executable, "-c", SIGTERMED, str(here_fs / "fsroot"), mode],
                            stdout=subprocess.PIPE, text=True, env=env)
    try:
        record = json.loads(proc.stdout.readline())
        assert mounted_fstype(record["mounts"]["ext4"]) == "ext4"
        assert loop_devices_under(record["base"])
        if mode == "forked child":
            os.kill(record["child"], signal.SIGTERM)
            _wait_until_dead(record["child"])
            assert mounted_fstype(record["mounts"]["ext4"]) == "ext4"
            assert loop_devices_under(record["base"])
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(timeout=60) == -signal.SIGTERM
        _assert_all_gone(record)
    finally:
        proc.kill()
        proc.wait()
        FilesystemFactory(root=here_fs / "fsroot").close()  # collects what a failure left


def test_live_sessions_are_not_collected(here_fs, fs_factory):
    with FilesystemFactory(root=fs_factory.root) as other:
        assert fs_factory.base not in other.stale_cleaned
    assert fs_factory.base.exists()


def _proc_mounts() -> list[tuple[str, str, str, str]]:
    with open("/proc/mounts") as f:
        return [tuple(line.split()[:4]) for line in f]


def test_remount_waits_for_the_old_loop_device_before_mounting_again(make_fs, fs_factory):
    """A loop device still held after the unmount (udev's probe does it, for longer under
    load) is not mounted again: `mount -o loop` would reuse it, page cache and all, and a
    power-cut test would read a shut-down filesystem's cached state. The remount waits
    until the device is gone, then mounts the image on a fresh one."""
    import threading

    from trtet_store.testing.loopfs import loop_devices_under, mounted_fstype

    mnt = make_fs("ext4", 64)
    (mnt / "kept").write_bytes(b"on disk")
    os.sync()
    image = fs_factory._mounted[Path(mnt)].image
    (device,) = loop_devices_under(image)
    held = os.open(device, os.O_RDONLY)  # as udev's probe holds it
    done: list[BaseException | None] = []

    def remount() -> None:
        try:
            fs_factory.remount(mnt)
            done.append(None)
        except BaseException as exc:  # noqa: BLE001 - handed to the test
            done.append(exc)

    thread = threading.Thread(target=remount)
    try:
        thread.start()
        deadline = time.monotonic() + 60
        while mounted_fstype(os.fspath(mnt)) is not None:  # the unmount happens first
            assert time.monotonic() < deadline and thread.is_alive()
            time.sleep(0.02)
        time.sleep(3.0)  # longer than the 2 s the remount once waited before mounting
        assert mounted_fstype(os.fspath(mnt)) is None, "mounted on the still-held device"
        assert thread.is_alive() and loop_devices_under(image) == [device]
    finally:
        os.close(held)
    thread.join(120)
    assert done == [None]
    assert mounted_fstype(os.fspath(mnt)) == "ext4"
    assert (mnt / "kept").read_bytes() == b"on disk"
