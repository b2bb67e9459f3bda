"""``write_files(follow_links=False)``: a link at the destination is replaced, not followed.

The storage engine's side of issue 44's finding 3 (fetch writes a program's
``.ptd`` names this way). On the root disk: an output whose name is a link to
a victim file (or a dangling link into another directory) becomes a regular
file of its own, the victim byte-identical and nothing created at the link's
target; a write that fails while publishing (the second rename, injected at
the real call) puts the link itself back, not a copy of its target. The
default (``True``) still writes through, as documented.
"""

from __future__ import annotations

import os
import stat
from pathlib import Path

import pytest
from faults import FaultInjector

from trtet_store.io import write_files


def entries(directory: Path) -> dict[str, str]:
    return {p.name: ("link " + os.readlink(p) if p.is_symlink() else
                     p.read_bytes().hex() if p.is_file() else "dir")
            for p in sorted(directory.iterdir())}


@pytest.fixture
def scene(here_fs: Path) -> dict[str, Path]:
    out, other = here_fs / "out", here_fs / "other"
    out.mkdir()
    other.mkdir()
    victim = other / "victim"
    victim.write_bytes(b"victim's bytes")
    os.chmod(victim, 0o600)
    (out / "model.pte").write_bytes(b"old program")
    (out / "cpu.ptd").symlink_to(victim)
    (out / "gpu.ptd").symlink_to(other / "absent")
    return {"out": out, "other": other, "victim": victim}


def test_links_at_unfollowed_outputs_are_replaced(scene):
    out, other = scene["out"], scene["other"]
    before = entries(other)
    write_files([(out / "model.pte", [b"new program"]), (out / "cpu.ptd", [b"c" * 5000]),
                 (out / "gpu.ptd", [b"g" * 10])], follow_links=[True, False, False])
    assert entries(other) == before  # the victim as it was; no 'absent' created
    for name, data in (("cpu.ptd", b"c" * 5000), ("gpu.ptd", b"g" * 10)):
        st = os.lstat(out / name)
        assert stat.S_ISREG(st.st_mode) and stat.S_IMODE(st.st_mode) == 0o644, oct(st.st_mode)
        assert (out / name).read_bytes() == data
    assert sorted(os.listdir(out)) == ["cpu.ptd", "gpu.ptd", "model.pte"]


@pytest.mark.parametrize("renamed", ["cpu.ptd", "gpu.ptd"])
def test_a_failed_publish_puts_the_link_itself_back(scene, renamed):
    out, other = scene["out"], scene["other"]
    before_out, before_other = entries(out), entries(other)
    second, third = renamed, ({"cpu.ptd", "gpu.ptd"} - {renamed}).pop()
    data = {"cpu.ptd": b"c" * 5000, "gpu.ptd": b"g" * 10}
    # The third rename fails after model.pte and `renamed` (a link to the victim, or a
    # dangling one) were renamed over: both must come back as they were.
    with FaultInjector(fail_at=3, only=frozenset({"rename"})) as inj, \
            pytest.raises(OSError, match="injected"):
        write_files([(out / "model.pte", [b"new program"]), (out / second, [data[second]]),
                     (out / third, [data[third]])], follow_links=[True, False, False])
    assert inj.fired == "rename"
    assert entries(out) == before_out  # the links again, no backups or temps
    assert entries(other) == before_other


def test_the_default_follows_a_link_as_documented(scene):
    out, victim = scene["out"], scene["victim"]
    write_files([(out / "cpu.ptd", [b"written through"])])
    assert (out / "cpu.ptd").is_symlink() and victim.read_bytes() == b"written through"


def test_follow_links_must_be_one_bool_or_one_per_output(scene):
    with pytest.raises(TypeError, match="follow_links"):
        write_files([(scene["out"] / "a", [b"x"])], follow_links=[True, False])
