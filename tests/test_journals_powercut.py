"""Both resume journals are one io.RecordFile, whose head survives a power cut (issue 35, item 3).

A journal begun by a rename that is not followed by a directory fsync can be
lost by a power cut even though its bytes were synced: the rename sits in the
filesystem's running transaction, and a later range of the same fetch, or a
resume, finds nothing (the fetch's journal before issue 35). Here a forked
child begins the journal, and the filesystem is shut down without flushing
its log (a simulated power cut) right after the journal's start returned;
the parent mounts the image again and reads what a rebooted machine finds.
"""

from __future__ import annotations

import os
from pathlib import Path

from crash_dying import die, in_child, power_cut

from trtet_store.io import STAGING_DIR, MiB, RecordFile, read_records
from trtet_store.remote.download.plan import ObjectSpec, plan_object
from trtet_store.remote.download.staging import Staging, fetch_id
from trtet_store.remote.upload.journal import Journal

URL = "s3://b/k/model.pte"


def _plans():
    spec = ObjectSpec("model.pte", "k/model.pte", 2 * MiB, "e1", None)
    return [plan_object(0, spec, [], MiB)]


def test_a_fetch_journal_head_survives_a_power_cut_right_after_it_is_written(
        make_fs, fs_factory, monkeypatch) -> None:
    mnt = make_fs("ext4", 64)
    dest = mnt / "model.pte"
    journal = mnt / STAGING_DIR / f"fetch-{fetch_id(dest)}.journal"
    real = Staging._write_head

    def cut_after_head(self, *args, **kwargs):
        real(self, *args, **kwargs)
        power_cut(mnt)  # before any run file is made (their adopt syncs the directory too)
        die()

    def child() -> None:
        monkeypatch.setattr(Staging, "_write_head", cut_after_head)
        Staging.open(dest, URL, "v1", _plans())

    assert in_child(child) == 86, "the child did not reach the power cut"
    fs_factory.remount(mnt)
    assert journal.exists(), f"the fetch journal was lost: {sorted(os.listdir(journal.parent))}"
    records = read_records(journal)
    assert records[0]["fetch"] == 1 and records[0]["version"] == "v1", records
    assert records[0]["runs"] == [[0, 0, 2 * MiB]], records
    # And a resume takes it (the head is ours and whole), then leaves no trace once discarded.
    stage = Staging.open(dest, URL, "v1", _plans())
    try:
        assert read_records(journal)[0]["version"] == "v1"
        stage.discard()
    finally:
        stage.close()
    assert not (mnt / STAGING_DIR).exists()


def test_a_publish_journal_plan_survives_a_power_cut_right_after_it_is_written(
        make_fs, fs_factory) -> None:
    mnt = make_fs("ext4", 64)
    path = mnt / "journals" / "x.publish.jsonl"

    def child() -> None:
        Journal(path, {"sources": ["a"]}).start({"bucket": "b", "key": "k"})
        power_cut(mnt)
        die()

    assert in_child(child) == 86, "the child did not reach the power cut"
    fs_factory.remount(mnt)
    records = Journal.read(path)
    assert records == [{"t": "plan", "version": 1, "bucket": "b", "key": "k",
                        "sources": ["a"]}], records
    assert sorted(p.name for p in path.parent.iterdir()) == ["x.publish.jsonl"]


def test_both_journals_are_record_files(here_fs: Path) -> None:
    # One primitive: a short append of either journal raises, naming its file.
    import resource
    import signal

    dest = here_fs / "model.pte"
    stage = Staging.open(dest, URL, "v1", _plans())
    pub = Journal(here_fs / "p.publish.jsonl")
    pub.start({"bucket": "b", "key": "k"})
    assert isinstance(stage._journal, RecordFile) and isinstance(pub._file, RecordFile)
    old = resource.getrlimit(resource.RLIMIT_FSIZE)
    handler = signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
    try:
        for append, path in ((lambda: stage._append({"pad": "y" * 200}), stage.journal_path),
                             (lambda: pub.append({"t": "x", "pad": "y" * 200}), pub.path)):
            # Room for 10 more bytes of this file: the line is cut there.
            resource.setrlimit(resource.RLIMIT_FSIZE, (path.stat().st_size + 10, old[1]))
            try:
                append()
            except OSError as exc:
                assert "short write" in str(exc) and exc.filename == os.fspath(path), exc
            else:
                raise AssertionError(f"a short append to {path} did not raise")
    finally:
        resource.setrlimit(resource.RLIMIT_FSIZE, old)
        signal.signal(signal.SIGXFSZ, handler)
        pub.remove()
        stage.discard()
        stage.close()
    assert sorted(os.listdir(here_fs)) == []
