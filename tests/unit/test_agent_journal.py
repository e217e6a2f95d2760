"""The agent's journal: durable records, torn tails dropped, corruption refused, crash-safe
compaction."""

from __future__ import annotations

import os
import shutil
from pathlib import Path

import pytest
from agora.agent.server import journal as journal_mod
from agora.agent.server.journal import Journal, JournalError, read_boot_id


def open_journal(path: Path) -> tuple[Journal, dict[tuple[str, str], bytes]]:
    j = Journal(str(path))
    return j, j.load()


def reload(path: Path) -> dict[tuple[str, str], bytes]:
    j, records = open_journal(path)
    j.close()
    return records


def test_commits_survive_a_reopen_and_deletes_stick(tmp_path: Path) -> None:
    j, records = open_journal(tmp_path / "j")
    assert records == {}
    j.put("task", "a", b"1")
    j.put("task", "b", b"2")
    j.commit()
    j.put("task", "a", b"3")
    j.delete("task", "b")
    j.put("stream", "b", b"")
    j.commit()
    j.put("task", "uncommitted", b"x")  # buffered only: lost with the process
    j.close()
    assert reload(tmp_path / "j") == {("task", "a"): b"3", ("stream", "b"): b""}


def test_only_the_agent_may_read_its_checkpoint(tmp_path: Path) -> None:
    """It holds each executor's secret: no other local user may read it, new or reopened."""
    j, _ = open_journal(tmp_path / "j")
    j.close()
    assert (tmp_path / "j").stat().st_mode & 0o777 == 0o700
    os.chmod(tmp_path / "j", 0o755)  # left open by an older agent
    reload(tmp_path / "j")
    assert (tmp_path / "j").stat().st_mode & 0o777 == 0o700


def test_a_second_journal_on_the_same_directory_is_refused(tmp_path: Path) -> None:
    j, _ = open_journal(tmp_path / "j")
    with pytest.raises(JournalError, match="in use"):
        Journal(str(tmp_path / "j"))
    j.close()
    Journal(str(tmp_path / "j")).close()  # free again


def three_commits(path: Path) -> tuple[list[dict[tuple[str, str], bytes]], int, int]:
    """Commit three batches; return the state after each and the log size before/after the
    last one."""
    j, _ = open_journal(path)
    states = []
    j.put("a", "1", b"one")
    j.put("a", "2", b"two")
    j.commit()
    states.append(dict(j.load()))
    j.delete("a", "1")
    j.put("b", "x" * 50, bytes(range(256)))
    j.commit()
    states.append(dict(j.load()))
    before = os.path.getsize(path / "log.0")
    j.put("c", "k", b"last" * 10)
    j.delete("a", "2")
    j.commit()
    states.append(dict(j.load()))
    after = os.path.getsize(path / "log.0")
    j.close()
    return states, before, after


def test_every_truncation_of_the_last_frame_loads_the_state_before_it(tmp_path: Path) -> None:
    original = tmp_path / "orig"
    states, before, after = three_commits(original)
    assert after > before
    for cut in range(before, after + 1):
        d = tmp_path / f"cut{cut}"
        shutil.copytree(original, d)
        os.truncate(d / "log.0", cut)
        expected = states[2] if cut == after else states[1]
        assert reload(d) == expected, cut
        # The torn tail was cut away: the journal appends cleanly after it.
        assert os.path.getsize(d / "log.0") == (after if cut == after else before)
        j, _ = open_journal(d)
        j.put("z", "z", b"z")
        j.commit()
        j.close()
        assert reload(d) == {**expected, ("z", "z"): b"z"}
        shutil.rmtree(d)


def test_a_garbled_or_zeroed_last_frame_is_a_torn_tail(tmp_path: Path) -> None:
    states, _before, after = three_commits(tmp_path / "j")
    log = tmp_path / "j" / "log.0"
    with open(log, "r+b") as f:
        f.seek(after - 3)
        f.write(b"\xff\xff\xff")  # checksum mismatch in the last frame
    assert reload(tmp_path / "j") == states[1]
    with open(log, "ab") as f:
        f.write(b"\0" * 100)  # a file extended with zeros by a crash
    assert reload(tmp_path / "j") == states[1]


def test_corruption_before_the_tail_is_an_error(tmp_path: Path) -> None:
    _states, before, _after = three_commits(tmp_path / "j")
    log = tmp_path / "j" / "log.0"
    with open(log, "r+b") as f:
        f.seek(before - 2)  # inside the second frame, with the third after it
        f.write(b"\x00\x01")
    with pytest.raises(JournalError, match=r"log\.0: corrupt at byte \d+"):
        reload(tmp_path / "j")


def test_compaction_keeps_the_state_in_a_new_generation(tmp_path: Path) -> None:
    j, _ = open_journal(tmp_path / "j")
    value = b"v" * 1000
    for i in range(1500):  # ~1.5 MB of log for ~10 KB of live data
        j.put("task", str(i % 10), value + str(i).encode())
        j.commit()
    assert j.generation >= 1
    expected = {("task", str(k)): value + str(1490 + k).encode() for k in range(10)}
    assert j.load() == expected
    j.close()
    names = sorted(os.listdir(tmp_path / "j"))
    gen = max(int(n.split(".")[1]) for n in names if n.startswith("snapshot."))
    assert names == ["LOCK", f"log.{gen}", f"snapshot.{gen}"]
    assert reload(tmp_path / "j") == expected


def test_a_crash_at_any_point_of_a_compaction_loads_the_same_state(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    class Crash(Exception):
        pass

    def crash(*_args: object, **_kw: object) -> None:
        raise Crash

    expected = {("k", str(i)): str(i).encode() * 10 for i in range(50)}
    # Where the process can die: before the rename, after it (old log still current), after
    # the new log exists but before the old generation is removed.
    points = [
        (os, "replace"),
        (Journal, "_switch_log"),
        (Journal, "_remove_stale"),
    ]
    for n, (target, name) in enumerate(points):
        d = tmp_path / f"j{n}"
        j, _ = open_journal(d)
        for key, value in expected.items():
            j.put(*key, value)
        j.commit()
        j.delete("k", "0")
        j.commit()
        with monkeypatch.context() as m:
            m.setattr(target, name, crash)
            with pytest.raises(Crash):
                j.compact()
        j.close()
        records = reload(d)
        assert records == {k: v for k, v in expected.items() if k != ("k", "0")}, name
        # And it goes on from there: commits and another compaction work.
        j, _ = open_journal(d)
        j.put("k", "new", b"n")
        j.commit()
        j.compact()
        j.close()
        assert reload(d) == {**records, ("k", "new"): b"n"}


def test_a_snapshot_cut_short_is_refused(tmp_path: Path) -> None:
    j, _ = open_journal(tmp_path / "j")
    j.put("k", "1", b"x" * 100)
    j.commit()
    j.compact()
    j.close()
    snap = tmp_path / "j" / "snapshot.1"
    os.truncate(snap, os.path.getsize(snap) - 5)
    with pytest.raises(JournalError, match=r"snapshot\.1"):
        reload(tmp_path / "j")


def test_a_log_without_its_snapshot_is_refused(tmp_path: Path) -> None:
    (tmp_path / "j").mkdir()
    (tmp_path / "j" / "log.3").write_bytes(b"")
    with pytest.raises(JournalError, match=r"no snapshot\.3"):
        reload(tmp_path / "j")


def test_read_boot_id_reads_the_kernels_boot_id(tmp_path: Path) -> None:
    fake = tmp_path / "boot_id"
    fake.write_text("0b9c7e3a-1111-2222-3333-444455556666\n")
    assert read_boot_id(str(fake)) == "0b9c7e3a-1111-2222-3333-444455556666"
    if os.path.exists("/proc/sys/kernel/random/boot_id"):
        assert len(read_boot_id()) == 36


def test_the_compaction_threshold_is_at_least_one_mebibyte(tmp_path: Path) -> None:
    j, _ = open_journal(tmp_path / "j")
    for i in range(200):
        j.put("k", str(i), b"x" * 1000)
        j.commit()
    assert j.generation == 0  # 200 KB of log: below the 1 MiB floor
    assert journal_mod.COMPACT_MIN_BYTES == 1024 * 1024
    j.close()
