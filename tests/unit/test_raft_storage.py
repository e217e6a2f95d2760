"""RaftStorage: what a master's Raft node finds on disk after a restart or a crash."""

from __future__ import annotations

import os
import re
from pathlib import Path

import pytest
from agora.master.election.storage import LOG_FILE, RaftStorage, StorageError
from agora.master.election.types import HardState, Ready, Snapshot
from agora.sdk.messages import LogEntry


def entries(first: int, last: int, term: int = 1) -> list[LogEntry]:
    return [LogEntry(term=term, index=i, data=f"op-{i}".encode()) for i in range(first, last + 1)]


def reopen(path: Path) -> tuple[HardState, Snapshot | None, list[LogEntry]]:
    storage = RaftStorage(path)
    try:
        return storage.load()
    finally:
        storage.close()


def test_empty_directory_loads_nothing(tmp_path: Path) -> None:
    assert RaftStorage(tmp_path / "raft").load() == (HardState(), None, [])


def test_round_trip_of_hard_state_and_log(tmp_path: Path) -> None:
    storage = RaftStorage(tmp_path)
    storage.load()
    storage.persist(
        Ready(hard_state=HardState(term=3, voted_for="tcp://a:1"), append=entries(1, 5))
    )
    storage.persist(Ready(append=entries(6, 7, term=3)))
    storage.close()
    hard, snapshot, log = reopen(tmp_path)
    assert hard == HardState(term=3, voted_for="tcp://a:1")
    assert snapshot is None
    assert log == entries(1, 5) + entries(6, 7, term=3)


def test_torn_tail_is_cut_and_appends_continue(tmp_path: Path) -> None:
    storage = RaftStorage(tmp_path)
    storage.load()
    storage.persist(Ready(append=entries(1, 3)))
    storage.close()
    path = tmp_path / LOG_FILE
    whole = path.stat().st_size
    with open(path, "r+b") as f:  # a crash in the middle of writing entry 3
        f.truncate(whole - 4)
    storage = RaftStorage(tmp_path)
    assert storage.load()[2] == entries(1, 2)
    storage.persist(Ready(append=entries(3, 4, term=2)))
    storage.close()
    assert reopen(tmp_path)[2] == entries(1, 2) + entries(3, 4, term=2)


def test_zero_filled_tail_is_cut(tmp_path: Path) -> None:
    storage = RaftStorage(tmp_path)
    storage.load()
    storage.persist(Ready(append=entries(1, 2)))
    storage.close()
    with open(tmp_path / LOG_FILE, "ab") as f:  # blocks allocated but never written
        f.write(b"\0" * 4096)
    assert reopen(tmp_path)[2] == entries(1, 2)


def test_corrupt_frame_before_good_ones_is_refused(tmp_path: Path) -> None:
    storage = RaftStorage(tmp_path)
    storage.load()
    storage.persist(Ready(append=entries(1, 3)))
    storage.close()
    path = tmp_path / LOG_FILE
    raw = bytearray(path.read_bytes())
    raw[12] ^= 0xFF  # inside entry 1's payload
    path.write_bytes(bytes(raw))
    with pytest.raises(StorageError, match=re.escape(LOG_FILE)):
        RaftStorage(tmp_path).load()


def test_non_contiguous_indices_are_refused(tmp_path: Path) -> None:
    storage = RaftStorage(tmp_path)
    storage.load()
    storage.persist(Ready(append=entries(1, 2)))
    storage.close()
    other = tmp_path / "other"
    storage = RaftStorage(other)
    storage.load()
    storage.persist(Ready(append=entries(1, 4)))
    storage.close()
    frames = (other / LOG_FILE).read_bytes()
    third = len(frames) // 4 * 3  # every frame has the same size here
    with open(tmp_path / LOG_FILE, "ab") as f:
        f.write(frames[third:])  # entry 4 right after entry 2
    with pytest.raises(StorageError, match="contiguous"):
        RaftStorage(tmp_path).load()


def test_damaged_hard_state_is_refused(tmp_path: Path) -> None:
    storage = RaftStorage(tmp_path)
    storage.load()
    storage.persist(Ready(hard_state=HardState(term=7, voted_for=None)))
    storage.close()
    path = tmp_path / "hard_state.json"
    path.write_text(path.read_text().replace('"term": 7', '"term": 2'))
    with pytest.raises(StorageError, match=r"hard_state\.json"):
        RaftStorage(tmp_path).load()


def test_truncation_then_append_replaces_the_conflicting_suffix(tmp_path: Path) -> None:
    storage = RaftStorage(tmp_path)
    storage.load()
    storage.persist(Ready(append=entries(1, 6)))
    storage.persist(Ready(truncate_after=3, append=entries(4, 5, term=2)))
    assert storage.last_index == 5
    storage.persist(Ready(append=entries(6, 6, term=2)))
    storage.close()
    assert reopen(tmp_path)[2] == entries(1, 3) + entries(4, 6, term=2)


def test_snapshot_drops_the_prefix_and_keeps_the_rest(tmp_path: Path) -> None:
    storage = RaftStorage(tmp_path)
    storage.load()
    storage.persist(Ready(append=entries(1, 10)))
    storage.persist(Ready(snapshot=Snapshot(index=7, term=1, data=b"state@7")))
    storage.persist(Ready(append=entries(11, 12)))
    storage.close()
    _, snapshot, log = reopen(tmp_path)
    assert snapshot == Snapshot(index=7, term=1, data=b"state@7")
    assert log == entries(8, 12)
    reference = RaftStorage(tmp_path / "reference")
    reference.load()
    reference.persist(Ready(append=entries(8, 12)))
    reference.close()
    # the prefix is gone from the file itself, not only skipped when reading
    assert (tmp_path / LOG_FILE).read_bytes() == (tmp_path / "reference" / LOG_FILE).read_bytes()


def test_snapshot_not_matching_the_log_replaces_all_of_it(tmp_path: Path) -> None:
    storage = RaftStorage(tmp_path)
    storage.load()
    storage.persist(Ready(append=entries(1, 4)))
    # from a leader: its entry 3 has term 2, ours term 1, so our whole log goes
    storage.persist(Ready(snapshot=Snapshot(index=3, term=2, data=b"leader")))
    storage.persist(Ready(append=entries(4, 4, term=2)))
    storage.close()
    _, snapshot, log = reopen(tmp_path)
    assert snapshot is not None and snapshot.index == 3
    assert log == entries(4, 4, term=2)


def test_restart_sees_exactly_what_was_persisted(tmp_path: Path) -> None:
    storage = RaftStorage(tmp_path)
    storage.load()
    storage.persist(Ready(hard_state=HardState(term=1, voted_for="tcp://a:1")))
    storage.persist(Ready(append=entries(1, 3)))
    storage.persist(Ready(hard_state=HardState(term=2, voted_for="tcp://b:1")))
    storage.persist(Ready(snapshot=Snapshot(index=2, term=1, data=b"s2")))
    storage.persist(Ready(truncate_after=2, append=entries(3, 5, term=2)))
    expected = (HardState(term=2, voted_for="tcp://b:1"), Snapshot(2, 1, b"s2"), entries(3, 5, 2))
    assert reopen(tmp_path) == expected
    storage.close()
    assert reopen(tmp_path) == expected  # and again after a clean close


def test_unsynced_persist_becomes_durable_on_sync(tmp_path: Path) -> None:
    storage = RaftStorage(tmp_path)
    storage.load()
    storage.persist(Ready(hard_state=HardState(term=4)), sync=False)
    storage.persist(Ready(append=entries(1, 2, term=4)), sync=False)
    assert reopen(tmp_path)[0] == HardState()  # not written before sync()
    storage.sync()
    assert reopen(tmp_path) == (HardState(term=4), None, entries(1, 2, term=4))
    storage.close()


def test_crash_between_snapshot_and_log_rewrite_recovers(tmp_path: Path) -> None:
    storage = RaftStorage(tmp_path)
    storage.load()
    storage.persist(Ready(append=entries(1, 6)))
    storage.close()
    saved_log = (tmp_path / LOG_FILE).read_bytes()
    storage = RaftStorage(tmp_path)
    storage.load()
    storage.persist(Ready(snapshot=Snapshot(index=4, term=1, data=b"s4")))
    storage.close()
    (tmp_path / LOG_FILE).write_bytes(saved_log)  # as if the log rewrite never reached the disk
    assert reopen(tmp_path)[1:] == (Snapshot(4, 1, b"s4"), entries(5, 6))
    assert reopen(tmp_path)[1:] == (Snapshot(4, 1, b"s4"), entries(5, 6))


def test_persist_of_nothing_durable_does_no_io(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    storage = RaftStorage(tmp_path)
    storage.load()
    storage.persist(Ready(hard_state=HardState(term=1), append=entries(1, 1)))
    fsyncs: list[int] = []
    opened: list[object] = []
    real_fsync = os.fsync
    monkeypatch.setattr(os, "fsync", lambda fd: (fsyncs.append(fd), real_fsync(fd)))
    monkeypatch.setattr("builtins.open", lambda *a, **k: opened.append(a))
    before = {p.name: p.stat().st_mtime_ns for p in tmp_path.iterdir()}
    storage.persist(Ready())
    storage.persist(Ready(committed=entries(1, 1)))
    storage.persist(Ready(hard_state=HardState(term=1)))  # unchanged: nothing to write
    storage.sync()
    assert fsyncs == [] and opened == []
    assert {p.name: p.stat().st_mtime_ns for p in tmp_path.iterdir()} == before
    storage.persist(Ready(append=entries(2, 3)))
    assert len(fsyncs) == 1  # one fsync for a whole batch of appends
    monkeypatch.undo()
    storage.close()


def test_snapshot_after_a_truncation_keeps_the_entries_appended_since(tmp_path: Path) -> None:
    # After a cut the file position stayed past the new end, so frames appended next were
    # recorded at the wrong offsets and the next snapshot's log rewrite failed: the election
    # halted and the master exited.
    storage = RaftStorage(tmp_path)
    storage.load()
    storage.persist(Ready(append=entries(1, 4)), sync=False)
    storage.persist(Ready(truncate_after=2, append=entries(3, 8, term=2)), sync=False)
    storage.persist(Ready(snapshot=Snapshot(index=5, term=2, data=b"s")))
    storage.persist(Ready(append=entries(9, 9, term=2)))
    storage.close()
    _, snapshot, kept = reopen(tmp_path)
    assert snapshot is not None and snapshot.index == 5
    assert [(e.index, e.term) for e in kept] == [(6, 2), (7, 2), (8, 2), (9, 2)]
