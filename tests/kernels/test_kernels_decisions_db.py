"""The decisions database is a cache: shared by processes, and a damaged or unusable file costs
measurements again, never a compile."""

from __future__ import annotations

import multiprocessing
import sqlite3
import warnings
from pathlib import Path

import pytest

from kiln.kernels.decide import Decisions
from kiln.kernels.outcome import Measured

PROCESSES = 8
KEYS = 15


def _fill(path: str, worker: int) -> None:
    """Put KEYS decisions, reading each back (another process may be writing meanwhile)."""
    decisions = Decisions(Path(path))
    for i in range(KEYS):
        key = f"{worker}-{i}"
        decisions.put(key, Measured(float(worker), float(i)))
        decisions._memory.clear()  # read it from the file, not from memory
        found = decisions.get(key)
        if found is None or (found.library_s, found.generated_s) != (worker, i):
            raise SystemExit(f"worker {worker}: {key} read back as {found}")


def test_8_processes_write_one_database_at_once(tmp_path: Path) -> None:
    path = tmp_path / "decisions.sqlite"
    ctx = multiprocessing.get_context("fork")  # the children touch sqlite only, not torch
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", DeprecationWarning)  # fork with threads (3.12+)
        procs = [ctx.Process(target=_fill, args=(str(path), w)) for w in range(PROCESSES)]
        for p in procs:
            p.start()
    for p in procs:
        p.join(timeout=120)
    assert [p.exitcode for p in procs] == [0] * PROCESSES
    fresh = Decisions(path)
    for w in range(PROCESSES):
        for i in range(KEYS):
            assert fresh.get(f"{w}-{i}") == Measured(float(w), float(i), cached=True)


def _filled(path: Path) -> bytes:
    Decisions(path).put("key-0", Measured(2.0, 1.0))  # the schema, as kiln writes it
    with sqlite3.connect(path) as db:  # several pages, so damage past the header hits them
        db.executemany("INSERT INTO decisions VALUES (?, 2.0, 1.0)",
                       [(f"key-{i}",) for i in range(1, 200)])
    return path.read_bytes()


def test_decisions_kept_by_an_earlier_version_are_forgotten(tmp_path: Path) -> None:
    """`kiln.cost.contention.CHECKED`: a file an earlier kiln filled (its decisions kept
    without the contention check) is emptied once; the checks' answers and later decisions
    stay."""
    from kiln.cost.contention import CHECKED

    path = tmp_path / "decisions.sqlite"
    _filled(path)
    Decisions(path).put_agreed("check-0", True)
    with sqlite3.connect(path) as db:
        db.execute("PRAGMA user_version = 0")  # as a kiln before the version wrote it
    fresh = Decisions(path)
    assert fresh.get("key-0") is None and fresh.agreed("check-0") is True
    fresh.put("key-1", Measured(2.0, 1.0))
    assert Decisions(path).get("key-1") == Measured(2.0, 1.0, cached=True)
    with sqlite3.connect(path) as db:
        assert db.execute("PRAGMA user_version").fetchone()[0] == CHECKED
        assert db.execute("SELECT COUNT(*) FROM decisions").fetchone()[0] == 1


@pytest.mark.parametrize("damage", ["garbage", "truncated", "malformed"])
def test_a_corrupt_database_is_moved_aside_and_started_again(tmp_path: Path,
                                                             damage: str) -> None:
    path = tmp_path / "decisions.sqlite"
    data = _filled(path)
    if damage == "garbage":
        path.write_bytes(b"this is not sqlite" * 300)
    elif damage == "truncated":
        path.write_bytes(data[:50])
    else:  # a valid header, every page after it overwritten
        path.write_bytes(data[:100] + b"\xa5" * (len(data) - 100))
    (tmp_path / "decisions.sqlite-journal").write_bytes(b"\x00" * 512)  # left by a crash
    decisions = Decisions(path)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        missing = decisions.get("key-1")
        decisions.put("new", Measured(3.0, 1.0))
    assert missing is None  # measured again
    assert [w.category for w in caught] == [RuntimeWarning], [str(w.message) for w in caught]
    assert "corrupt" in str(caught[0].message)
    assert (tmp_path / "decisions.sqlite.corrupt").exists()
    assert not (tmp_path / "decisions.sqlite-journal").exists()
    assert Decisions(path).get("new") == Measured(3.0, 1.0, cached=True)  # a working database
    with sqlite3.connect(path) as db:
        assert db.execute("PRAGMA integrity_check").fetchone() == ("ok",)


@pytest.mark.parametrize("where", ["file_as_folder", "folder_as_database"])
def test_an_unusable_database_keeps_decisions_in_memory(tmp_path: Path, where: str) -> None:
    if where == "file_as_folder":
        (tmp_path / "blocker").write_text("")
        path = tmp_path / "blocker" / "decisions.sqlite"
    else:
        path = tmp_path / "decisions.sqlite"
        path.mkdir()
    decisions = Decisions(path)
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # no warning either: this is not corruption
        assert decisions.get("k") is None
        decisions.put("k", Measured(2.0, 1.0))
        assert decisions.get("k") == Measured(2.0, 1.0)
    assert Decisions(path).get("k") is None  # nothing was written


def test_a_locked_database_waits_then_keeps_decisions_in_memory(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    path = tmp_path / "decisions.sqlite"
    Decisions(path).put("a", Measured(2.0, 1.0))
    monkeypatch.setattr("kiln.kernels.decide.TIMEOUT_S", 0.05)
    holder = sqlite3.connect(path, isolation_level=None)
    holder.execute("BEGIN EXCLUSIVE")  # another process in the middle of a write
    try:
        decisions = Decisions(path)
        assert decisions.get("a") is None  # could not read in time: measure again
        decisions.put("b", Measured(2.0, 1.0))
        assert decisions.get("b") == Measured(2.0, 1.0)
    finally:
        holder.execute("ROLLBACK")
        holder.close()
    assert (path.exists() and not (tmp_path / "decisions.sqlite.corrupt").exists())
    assert Decisions(path).get("a") == Measured(2.0, 1.0, cached=True)
