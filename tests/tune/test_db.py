"""The tuning database: records by workload and target, concurrent writers, refusal of bad
files, and export/import."""

from __future__ import annotations

import json
import multiprocessing
import sqlite3
import subprocess
import sys
from pathlib import Path

import pytest

from kiln.kernels.gemm_schedule import matmul_func
from kiln.tune.db import (
    APPLICATION_ID,
    SCHEMA_VERSION,
    Target,
    TuningDB,
    TuningDBError,
    TuningRecord,
    workload_key,
)

HERE = Target("x86_64 Test CPU", "avx512", "cc 1.0", 2)
ELSEWHERE = Target("x86_64 Test CPU", "avx512", "cc 1.0", 1)  # same machine, one thread


def _record(workload: str, mr: int, times: list[float], target: Target = HERE) -> TuningRecord:
    return TuningRecord.measured(workload, target, "gemm", json.dumps([{"mr": mr}]),
                                 {"mr": mr}, times)


def test_best_is_the_fastest_record_that_ran_on_that_target(tmp_path: Path) -> None:
    db = TuningDB.open(tmp_path / "t.sqlite")
    assert db.add(_record("w", 8, [3e-4, 3.1e-4, 2.9e-4]))
    assert db.add(_record("w", 14, [2e-4, 2.2e-4, 9e-4]))  # median 2.2e-4: the best
    assert db.add(TuningRecord.failed("w", HERE, "gemm", "[]", {"mr": 16}, "timeout"))
    assert db.add(_record("w", 4, [1e-4], target=ELSEWHERE))  # faster, but another target
    assert not db.add(_record("w", 8, [1e-9]))  # the same decisions again: the first stands
    best = db.best("w", HERE)
    assert best is not None and best.decisions == {"mr": 14} and best.median_s == 2.2e-4
    assert db.best("w", ELSEWHERE).decisions == {"mr": 4}
    assert db.best("other", HERE) is None
    (summary,) = [s for s in db.workloads() if s.target == HERE.key()]
    assert (summary.records, summary.failed, summary.best_s) == (3, 1, 2.2e-4)
    assert [r.decisions["mr"] for r in db.top(HERE, "gemm", 5)] == [14]


def test_a_confirmation_keeps_the_new_times_and_says_what_a_compile_uses(tmp_path: Path
                                                                          ) -> None:
    db = TuningDB.open(tmp_path / "t.sqlite")
    db.add(_record("w", 8, [3e-4]))
    db.add(_record("w", 14, [2e-4]))
    db.add(_record("w", 4, [1e-4]))  # the fastest alone, but not timed side by side
    db.add(TuningRecord.failed("w", HERE, "gemm", "[]", {"mr": 16}, "timeout"))
    assert db.chosen("w", HERE) is None  # never confirmed
    assert db.confirm("w", HERE, [({"mr": 8}, [3e-4, 3.1e-4], 1.0),
                                  ({"mr": 14}, [2.9e-4], 0.95),
                                  ({"mr": 16}, [1e-4], 0.5)]) == 2  # a failed one stays so
    chosen = db.chosen("w", HERE)
    assert chosen.decisions == {"mr": 14} and chosen.paired == 0.95
    assert chosen.run_times == (2.9e-4,)
    assert db.record("w", HERE, {"mr": 4}).paired is None
    assert db.chosen("w", ELSEWHERE) is None  # another target's records are apart
    # a later confirmation replaces the earlier one as a whole
    db.confirm("w", HERE, [({"mr": 8}, [3e-4], 1.0), ({"mr": 4}, [3.3e-4], 1.1)])
    assert db.chosen("w", HERE).decisions == {"mr": 8}
    assert db.record("w", HERE, {"mr": 14}).paired is None
    with pytest.raises(ValueError):
        db.confirm("w", HERE, [({"mr": 14}, [0.0], 1.0)])
    with pytest.raises(ValueError):
        db.confirm("w", HERE, [({"mr": 14}, [1e-4], float("nan"))])


def test_a_version_1_file_is_upgraded_in_place(tmp_path: Path) -> None:
    path = tmp_path / "old.sqlite"
    with sqlite3.connect(path) as conn:  # the version-1 schema, as kiln wrote it
        conn.executescript("""
            CREATE TABLE records (id INTEGER PRIMARY KEY, workload TEXT NOT NULL,
                target TEXT NOT NULL, kind TEXT NOT NULL, trace TEXT NOT NULL,
                decisions TEXT NOT NULL, run_times TEXT NOT NULL, features TEXT NOT NULL,
                error TEXT, created REAL NOT NULL, UNIQUE (workload, target, decisions));""")
        conn.execute(f"PRAGMA application_id = {APPLICATION_ID}")
        conn.execute("PRAGMA user_version = 1")
        conn.execute("INSERT INTO records (workload, target, kind, trace, decisions, "
                     "run_times, features, error, created) VALUES (?, ?, 'gemm', '[]', "
                     "'{\"mr\":8}', '[0.001]', '[]', NULL, 1.0)", ("w", HERE.key()))
    db = TuningDB.open(path)
    (record,) = db.records("w", HERE)
    assert record.decisions == {"mr": 8} and record.paired is None and record.in_model is None
    assert db.chosen("w", HERE) is None  # its records were never confirmed
    with sqlite3.connect(path) as conn:
        assert conn.execute("PRAGMA user_version").fetchone()[0] == SCHEMA_VERSION == 2
    assert db.confirm("w", HERE, [({"mr": 8}, [1e-3], 1.0)]) == 1
    assert db.checked_in_model("w", HERE, {"mr": 8}, 0.99)


def test_the_file_is_in_wal_mode_and_versioned(tmp_path: Path) -> None:
    TuningDB.open(tmp_path / "t.sqlite")
    with sqlite3.connect(tmp_path / "t.sqlite") as conn:
        assert conn.execute("PRAGMA journal_mode").fetchone()[0] == "wal"
        assert conn.execute("PRAGMA user_version").fetchone()[0] == SCHEMA_VERSION


def _writer(path: str, worker: int, count: int) -> None:
    db = TuningDB.open(path)
    for i in range(count):
        db.add(_record(f"w{i % 5}", worker * 1000 + i, [1e-4 + i * 1e-7]))


def test_concurrent_writers_lose_nothing(tmp_path: Path) -> None:
    path = str(tmp_path / "t.sqlite")
    TuningDB.open(path)
    # fork: the writers only use sqlite, and a spawned process would import torch again
    ctx = multiprocessing.get_context("fork")
    workers = [ctx.Process(target=_writer, args=(path, w, 40)) for w in range(4)]
    for p in workers:
        p.start()
    for p in workers:
        p.join(120)
        assert p.exitcode == 0
    records = TuningDB.open(path).records()
    assert len(records) == 160
    assert len({r.decisions["mr"] for r in records}) == 160


@pytest.mark.parametrize("content", [
    b"SQLite format 3\x00" + b"\x00" * 84 + b"garbage" * 200,  # a damaged header
    b"not a database at all\n" * 100,
])
def test_a_damaged_file_is_refused_and_left_as_it_is(tmp_path: Path, content: bytes) -> None:
    path = tmp_path / "t.sqlite"
    path.write_bytes(content)
    with pytest.raises(TuningDBError, match="cannot be read.*move it aside"):
        TuningDB.open(path)
    assert path.read_bytes() == content


def test_a_truncated_database_is_refused(tmp_path: Path) -> None:
    path = tmp_path / "t.sqlite"
    db = TuningDB.open(path)
    db.add_many([_record(f"w{i}", i, [1e-4]) for i in range(400)])
    with sqlite3.connect(path) as conn:  # fold the WAL into the file, then cut the file
        conn.execute("PRAGMA wal_checkpoint(TRUNCATE)")
    data = path.read_bytes()
    path.write_bytes(data[: len(data) // 2])
    with pytest.raises(TuningDBError):
        TuningDB.open(path).records()


def test_another_sqlite_file_or_schema_is_refused(tmp_path: Path) -> None:
    foreign = tmp_path / "foreign.sqlite"
    with sqlite3.connect(foreign) as conn:
        conn.execute("CREATE TABLE t (x)")
    with pytest.raises(TuningDBError, match="not a kiln tuning database"):
        TuningDB.open(foreign)
    newer = tmp_path / "newer.sqlite"
    TuningDB.open(newer)
    with sqlite3.connect(newer) as conn:
        conn.execute(f"PRAGMA user_version = {SCHEMA_VERSION + 1}")
    with pytest.raises(TuningDBError, match=f"schema version {SCHEMA_VERSION + 1}"):
        TuningDB.open(newer)


def test_export_and_import_round_trip(tmp_path: Path) -> None:
    db = TuningDB.open(tmp_path / "a.sqlite")
    db.add_many([_record("w", 8, [3e-4, 3e-4]), _record("v", 4, [1e-4]),
                 TuningRecord.failed("w", HERE, "gemm", "[]", {"mr": 2}, "crashed: SIGSEGV")])
    db.confirm("w", HERE, [({"mr": 8}, [3e-4], 1.0)])  # a confirmation travels with them
    assert db.checked_in_model("w", HERE, {"mr": 8}, 1.02)  # and the check in a model
    assert not db.checked_in_model("w", HERE, {"mr": 2}, 1.0)  # (it failed: nothing to check)
    assert db.export_jsonl(tmp_path / "records.jsonl") == 3
    other = TuningDB.open(tmp_path / "b.sqlite")
    assert other.import_jsonl(tmp_path / "records.jsonl") == 3
    assert other.import_jsonl(tmp_path / "records.jsonl") == 0  # nothing new the second time
    assert [r.to_dict() for r in other.records()] == [r.to_dict() for r in db.records()]
    assert other.chosen("w", HERE).decisions == {"mr": 8}
    assert other.chosen("w", HERE).in_model == 1.02


def test_a_bad_import_line_changes_nothing(tmp_path: Path) -> None:
    good = _record("w", 8, [3e-4]).to_dict()
    lines = [json.dumps(good), json.dumps({**good, "decisions": {"mr": 9}, "run_times": [-1]})]
    (tmp_path / "bad.jsonl").write_text("\n".join(lines) + "\n")
    db = TuningDB.open(tmp_path / "t.sqlite")
    with pytest.raises(TuningDBError, match="line 2"):
        db.import_jsonl(tmp_path / "bad.jsonl")
    assert db.records() == []


def test_workload_key_is_structural_and_stable_across_processes() -> None:
    key = workload_key(matmul_func(128, 768, 3072))
    assert key == workload_key(matmul_func(128, 768, 3072))
    assert key != workload_key(matmul_func(127, 768, 3072))
    code = ("from kiln.kernels.gemm_schedule import matmul_func; from kiln.tune.db import "
            "workload_key; print(workload_key(matmul_func(128, 768, 3072)))")
    other = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                           check=True)
    assert other.stdout.strip() == key
