"""io.records: a record file begun atomically and durably, appended line by line, read back."""

from __future__ import annotations

import os
import threading

import pytest

from trtet_store.io.records import DamagedRecordsError, RecordFile, read_records


def test_start_append_read_round_trip(here_fs) -> None:
    path = here_fs / "sub" / "j.jsonl"
    rf = RecordFile(path)
    rf.start([{"t": "head", "n": 1}])
    rf.append({"t": "a", "x": [1, 2]})
    rf.append({"t": "b"}, durable=True)
    rf.close()
    assert read_records(path) == [{"t": "head", "n": 1}, {"t": "a", "x": [1, 2]}, {"t": "b"}]
    assert oct(os.stat(path).st_mode & 0o777) == oct(0o600)
    assert sorted(p.name for p in path.parent.iterdir()) == ["j.jsonl"]  # no .tmp left


def test_start_replaces_the_old_records_whole(here_fs) -> None:
    path = here_fs / "j.jsonl"
    old = RecordFile(path)
    old.start([{"t": "old"}])
    old.append({"t": "old-line"})
    old.close()
    new = RecordFile(path)
    new.start([{"t": "new"}])
    new.close()
    assert read_records(path) == [{"t": "new"}]


def test_a_torn_last_line_is_skipped_and_an_inner_one_refused(here_fs) -> None:
    path = here_fs / "j.jsonl"
    path.write_bytes(b'{"t":"head"}\n{"t":"a"}\n{"t":"b","x":')
    assert read_records(path) == [{"t": "head"}, {"t": "a"}]
    path.write_bytes(b'{"t":"head"}\nnot json\n{"t":"b"}\n')
    with pytest.raises(DamagedRecordsError) as e:
        read_records(path)
    assert e.value.line == 2 and str(path) in str(e.value)
    path.write_bytes(b'{"t":"head"}\n[1, 2]\n{"t":"b"}\n')  # JSON, but not a record
    with pytest.raises(DamagedRecordsError):
        read_records(path)


def test_a_missing_file_has_no_records_and_remove_is_idempotent(here_fs) -> None:
    path = here_fs / "none.jsonl"
    assert read_records(path) == []
    rf = RecordFile(path)
    rf.start([{"t": "x"}])
    rf.remove()
    rf.remove()
    assert not path.exists()
    with pytest.raises(ValueError, match="not open"):
        rf.append({"t": "y"})


def test_concurrent_appends_never_interleave_within_a_line(here_fs) -> None:
    path = here_fs / "j.jsonl"
    rf = RecordFile(path)
    rf.start([{"t": "head"}])
    blob = "x" * 5000

    def put(k: int) -> None:
        for i in range(50):
            rf.append({"k": k, "i": i, "pad": blob})

    threads = [threading.Thread(target=put, args=(k,)) for k in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    rf.close()
    records = read_records(path)[1:]
    assert len(records) == 200
    assert sorted((r["k"], r["i"]) for r in records) == [(k, i) for k in range(4)
                                                         for i in range(50)]


def test_a_short_append_raises(here_fs) -> None:
    # A real short write: RLIMIT_FSIZE lets only part of the line through.
    import resource
    import signal

    path = here_fs / "j.jsonl"
    rf = RecordFile(path)
    rf.start([{"t": "head"}])
    size = path.stat().st_size
    old = resource.getrlimit(resource.RLIMIT_FSIZE)
    handler = signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
    try:
        resource.setrlimit(resource.RLIMIT_FSIZE, (size + 10, old[1]))
        with pytest.raises(OSError, match="short write"):
            rf.append({"t": "long", "pad": "y" * 100})
    finally:
        resource.setrlimit(resource.RLIMIT_FSIZE, old)
        signal.signal(signal.SIGXFSZ, handler)
        rf.close()
    assert read_records(path) == [{"t": "head"}]  # the torn line is skipped


def test_skip_damaged_keeps_every_whole_record_around_a_damaged_one(here_fs) -> None:
    # The fetch journal's reading: a line a power cut zeroed costs only its own record.
    path = here_fs / "j.jsonl"
    path.write_bytes(b'{"t":"head"}\n\x00\x00\x00\x00\n{"t":"a"}\n[1]\n{"t":"b"}\n{"t":"c",')
    assert read_records(path, skip_damaged=True) == [{"t": "head"}, {"t": "a"}, {"t": "b"}]
    with pytest.raises(DamagedRecordsError) as e:
        read_records(path)
    assert e.value.line == 2
