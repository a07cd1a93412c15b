"""The tuning database: every measured schedule of every kernel, on every target, in sqlite.

    db = TuningDB.open("tuning.sqlite")
    db.add(TuningRecord.measured(workload, target, "gemm", trace_json, decisions, [1.2e-4, ...]))
    best = db.best(workload, target)          # the fastest record that ran, or None
    chosen = db.chosen(workload, target)      # what a compile uses: the confirmation's winner
    db.export_jsonl("team.jsonl"); other.import_jsonl("team.jsonl")

A *workload* is a structural hash of the kernel's lowered loop program (`workload_key`); a
*target* names what the times were taken on (`Target`: CPU model, ISA, compiler, threads).
Both are part of every lookup, so times from different machines or thread counts never mix.

The file is shared by concurrent tuners and compiles: sqlite's WAL mode lets readers go on
while one writer commits, and each write is one short transaction. Unlike the kernel cache's
decisions (a cache that may be dropped), tuning records cost minutes to hours to make, so a
corrupt, newer-schema or foreign file is refused with `TuningDBError`, never half-read and
never replaced.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import math
import os
import platform
import sqlite3
import statistics
import time
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

__all__ = ["SCHEMA_VERSION", "Target", "TuningDB", "TuningDBError", "TuningRecord",
           "WorkloadSummary", "workload_key"]

SCHEMA_VERSION = 2  # 2 added records.paired and in_model; a version-1 file is upgraded in place
APPLICATION_ID = 0x6B6C6E74  # "klnt" in sqlite's header: this file is a kiln tuning database
TIMEOUT_S = 30.0  # how long a writer waits for another process's transaction

_SCHEMA = """
CREATE TABLE IF NOT EXISTS records (
    id INTEGER PRIMARY KEY,
    workload TEXT NOT NULL,
    target TEXT NOT NULL,
    kind TEXT NOT NULL,
    trace TEXT NOT NULL,          -- the schedule's Trace as JSON, its decisions fixed
    decisions TEXT NOT NULL,      -- JSON object: decision name -> value
    run_times TEXT NOT NULL,      -- JSON list of seconds; empty when the candidate failed
    features TEXT NOT NULL,       -- JSON list: the program's features for the cost model
    error TEXT,                   -- why it failed (build, check, crash, timeout)
    created REAL NOT NULL,
    paired REAL,                  -- its time over the default's, timed side by side (NULL:
                                  -- not in the workload's latest confirmation)
    in_model REAL,                -- a model's time with it over without (NULL: not checked)
    UNIQUE (workload, target, decisions)
);
CREATE INDEX IF NOT EXISTS records_by_workload ON records (workload, target);
"""


class TuningDBError(Exception):
    """The database file cannot be used as it is; the message says why and what to do."""


@dataclass(frozen=True)
class Target:
    """What a time was measured on. Two records compare only with equal targets."""

    cpu: str  # architecture and model name
    isa: str  # the kernel compiler's vector ISA (avx512, avx2, vec128, scalar)
    compiler: str  # the C compiler's version line
    threads: int

    def key(self) -> str:
        return json.dumps([self.cpu, self.isa, self.compiler, self.threads])

    @staticmethod
    def from_key(key: str) -> Target:
        cpu, isa, compiler, threads = json.loads(key)
        return Target(cpu, isa, compiler, int(threads))

    @staticmethod
    def here(options: Any = None, threads: int | None = None) -> Target:
        """This machine, with ``options``' compiler and flags (kiln.Options; default ones)."""
        import torch

        from kiln.codegen.build import CompilerUnavailable, toolchain
        from kiln.codegen.isa import target_isa
        from kiln.options import Options

        options = options or Options.from_env()
        chain = toolchain(options)
        compiler = "none" if isinstance(chain, CompilerUnavailable) else chain.version
        return Target(cpu_name(), target_isa(options).label, compiler,
                      threads or torch.get_num_threads())

    def __str__(self) -> str:
        return f"{self.cpu}, {self.isa}, {self.threads} threads"


def cpu_name() -> str:
    model = platform.processor()
    with contextlib.suppress(OSError):
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                model = line.split(":", 1)[1].strip()
                break
    return f"{platform.machine()} {model}".strip()


def workload_key(program: Any) -> str:
    """A structural hash of a lowered loop program (a kiln.tir PrimFunc): the same kernel of
    the same shapes has the same key in every process, whatever the function is named."""
    import dataclasses

    from kiln.tir.printer import print_func

    text = print_func(dataclasses.replace(program, name="kernel"))
    return hashlib.sha256(text.encode()).hexdigest()[:32]


@dataclass(frozen=True)
class TuningRecord:
    """One candidate schedule of one workload on one target, and how it ran."""

    workload: str
    target: str  # Target.key()
    kind: str  # the kernel kind: gemm, rows, loops, ...
    trace: str  # the Trace as JSON
    decisions: dict[str, Any] = field(default_factory=dict)
    run_times: tuple[float, ...] = ()  # seconds per call; empty when it failed
    error: str | None = None
    created: float = 0.0
    features: tuple[float, ...] = ()  # kiln.tune.features of the built program
    # its time over the default schedule's, the median of their ratios when the tuner last
    # timed them side by side (`TuningDB.confirm`); None where it was not among those
    paired: float | None = None
    # a model's time with this schedule over its time with the default schedule, their calls
    # alternated (`kiln.tune.validate`); None where that was not measured
    in_model: float | None = None

    @staticmethod
    def measured(workload: str, target: Target | str, kind: str, trace: str,
                 decisions: dict[str, Any], run_times: Sequence[float],
                 features: Sequence[float] = (), paired: float | None = None
                 ) -> TuningRecord:
        return TuningRecord(workload, _target_key(target), kind, trace, dict(decisions),
                            tuple(float(t) for t in run_times), None, time.time(),
                            tuple(features), paired)

    @staticmethod
    def failed(workload: str, target: Target | str, kind: str, trace: str,
               decisions: dict[str, Any], error: str,
               features: Sequence[float] = ()) -> TuningRecord:
        return TuningRecord(workload, _target_key(target), kind, trace, dict(decisions), (),
                            error, time.time(), tuple(features))

    @property
    def ok(self) -> bool:
        return self.error is None and bool(self.run_times)

    @property
    def median_s(self) -> float:
        return statistics.median(self.run_times) if self.ok else math.inf

    def to_dict(self) -> dict[str, Any]:
        return {"workload": self.workload, "target": self.target, "kind": self.kind,
                "trace": self.trace, "decisions": self.decisions,
                "run_times": list(self.run_times), "error": self.error,
                "created": self.created, "features": list(self.features),
                "paired": self.paired, "in_model": self.in_model}

    @staticmethod
    def from_dict(data: dict[str, Any]) -> TuningRecord:
        """Raises ValueError on anything that is not a well-formed record."""
        try:
            record = TuningRecord(
                str(data["workload"]), str(data["target"]), str(data["kind"]),
                str(data["trace"]), dict(data["decisions"]),
                tuple(float(t) for t in data["run_times"]),
                None if data.get("error") is None else str(data["error"]),
                float(data.get("created", 0.0)),
                tuple(float(x) for x in data.get("features", ())),
                None if data.get("paired") is None else float(data["paired"]),
                None if data.get("in_model") is None else float(data["in_model"]))
            json.loads(record.trace)
            Target.from_key(record.target)
        except (KeyError, TypeError, ValueError) as err:
            raise ValueError(f"not a tuning record ({type(err).__name__}: {err})") from None
        if any(not math.isfinite(t) or t <= 0 for t in record.run_times):
            raise ValueError("a run time is not a positive number of seconds")
        if any(r is not None and not (math.isfinite(r) and r > 0)
               for r in (record.paired, record.in_model)):
            raise ValueError("a ratio is not a positive number")
        return record


def _target_key(target: Target | str) -> str:
    return target.key() if isinstance(target, Target) else target


@dataclass(frozen=True)
class WorkloadSummary:
    workload: str
    target: str
    kind: str
    records: int
    failed: int
    best_s: float  # inf when none ran


class TuningDB:
    """A tuning database file. Each call opens its own short transaction, so one TuningDB
    may be used from several threads, and several processes may share the file."""

    def __init__(self, path: Path) -> None:
        self.path = path

    @staticmethod
    def open(path: str | os.PathLike[str]) -> TuningDB:
        """Open or create the database at ``path``; TuningDBError where the file is not a
        kiln tuning database of this schema version."""
        db = TuningDB(Path(path).expanduser())
        try:
            db.path.parent.mkdir(parents=True, exist_ok=True)
        except OSError as err:
            raise TuningDBError(f"cannot create the folder of {db.path}: {err.strerror}") \
                from None
        with db._connect() as conn:
            db._check_or_create(conn)
        return db

    # -- writing ---------------------------------------------------------------------------------

    def add(self, record: TuningRecord) -> bool:
        """Store one record; False where the same decisions of this workload and target are
        already stored (the first measurement stands)."""
        return self.add_many([record]) == 1

    def add_many(self, records: Sequence[TuningRecord]) -> int:
        """Store records in one transaction (all or none); returns how many were new."""
        rows = [(r.workload, r.target, r.kind, r.trace, _canonical(r.decisions),
                 json.dumps(list(r.run_times)), json.dumps(list(r.features)), r.error,
                 r.created or time.time(), r.paired, r.in_model) for r in records]
        with self._connect() as conn:
            before = conn.total_changes
            conn.executemany("INSERT OR IGNORE INTO records (workload, target, kind, trace, "
                             "decisions, run_times, features, error, created, paired, "
                             "in_model) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)", rows)
            return conn.total_changes - before

    def confirm(self, workload: str, target: Target | str,
                timed: Sequence[tuple[Mapping[str, Any], Sequence[float], float]]) -> int:
        """Store the tuner's confirmation of a workload: for each of its points timed side by
        side with the default (the default among them, at 1.0), the run times of that timing
        and its paired ratio to the default. It replaces the workload's earlier confirmation
        on ``target`` in one transaction. Returns how many records it updated (a point with
        no record that ran is skipped)."""
        rows = []
        for decisions, run_times, paired in timed:
            if not run_times or any(not math.isfinite(t) or t <= 0 for t in run_times):
                raise ValueError("a run time is not a positive number of seconds")
            if not (math.isfinite(paired) and paired > 0):
                raise ValueError("a paired ratio is not a positive number")
            rows.append((json.dumps([float(t) for t in run_times]), float(paired), workload,
                         _target_key(target), _canonical(dict(decisions))))
        with self._connect() as conn:
            conn.execute("UPDATE records SET paired = NULL WHERE workload = ? AND target = ?",
                         (workload, _target_key(target)))
            return sum(conn.execute("UPDATE records SET run_times = ?, paired = ? WHERE "
                                    "workload = ? AND target = ? AND decisions = ? AND "
                                    "error IS NULL", row).rowcount for row in rows)

    # -- reading ---------------------------------------------------------------------------------

    def records(self, workload: str | None = None,
                target: Target | str | None = None) -> list[TuningRecord]:
        """Every record (of a workload, on a target), oldest first."""
        sql, args = "SELECT * FROM records", []
        where = []
        if workload is not None:
            where.append("workload = ?")
            args.append(workload)
        if target is not None:
            where.append("target = ?")
            args.append(_target_key(target))
        if where:
            sql += " WHERE " + " AND ".join(where)
        with self._connect() as conn:
            rows = conn.execute(sql + " ORDER BY id", args).fetchall()
        return [self._record(row) for row in rows]

    def best(self, workload: str, target: Target | str) -> TuningRecord | None:
        """The record with the lowest median time among those that ran, or None. (Only the
        run times of the others are read: a compile looks up every kernel.)"""
        with self._connect() as conn:
            times = conn.execute("SELECT id, run_times FROM records WHERE workload = ? AND "
                                 "target = ? AND error IS NULL ORDER BY id",
                                 (workload, _target_key(target))).fetchall()
            try:
                medians = [(statistics.median(ts), i) for i, text in times
                           for ts in [json.loads(text)] if ts]
            except (TypeError, ValueError) as err:
                raise TuningDBError(f"{self.path}: a record cannot be read ({err}); the file "
                                    "is damaged") from None
            if not medians:
                return None
            row = conn.execute("SELECT * FROM records WHERE id = ?",
                               (min(medians)[1],)).fetchone()
        return self._record(row)

    def checked_in_model(self, workload: str, target: Target | str,
                         decisions: Mapping[str, Any], ratio: float | None) -> bool:
        """Store a model's time with this point over its time with the default schedule
        (`kiln.tune.validate`; None: forget an earlier one); False where no such record
        ran."""
        if ratio is not None and not (math.isfinite(ratio) and ratio > 0):
            raise ValueError("a ratio is not a positive number")
        with self._connect() as conn:
            return conn.execute("UPDATE records SET in_model = ? WHERE workload = ? AND "
                                "target = ? AND decisions = ? AND error IS NULL",
                                (None if ratio is None else float(ratio), workload,
                                 _target_key(target),
                                 _canonical(dict(decisions)))).rowcount == 1

    def chosen(self, workload: str, target: Target | str) -> TuningRecord | None:
        """The record of the workload's latest confirmation with the lowest paired ratio to
        the default (the default itself where nothing beat it), or None where the workload
        was never confirmed on ``target``."""
        with self._connect() as conn:
            row = conn.execute("SELECT * FROM records WHERE workload = ? AND target = ? AND "
                               "paired IS NOT NULL AND error IS NULL ORDER BY paired, id "
                               "LIMIT 1", (workload, _target_key(target))).fetchone()
        return None if row is None else self._record(row)

    def record(self, workload: str, target: Target | str, decisions: Mapping[str, Any]
               ) -> TuningRecord | None:
        """The record of one point of a workload on a target, or None."""
        with self._connect() as conn:
            row = conn.execute("SELECT * FROM records WHERE workload = ? AND target = ? AND "
                               "decisions = ?", (workload, _target_key(target),
                                                 _canonical(dict(decisions)))).fetchone()
        return None if row is None else self._record(row)

    def on_target(self, target: Target | str) -> list[TuningRecord]:
        """Every record measured on ``target``: what the cost model learns from."""
        with self._connect() as conn:
            rows = conn.execute("SELECT * FROM records WHERE target = ? ORDER BY id",
                                (_target_key(target),)).fetchall()
        return [self._record(row) for row in rows]

    def top(self, target: Target | str, kind: str, count: int) -> list[TuningRecord]:
        """The best record of each of up to ``count`` workloads of one kind on ``target``:
        where a new workload's search starts (similar kernels tune alike)."""
        with self._connect() as conn:
            rows = conn.execute("SELECT * FROM records WHERE target = ? AND kind = ? AND "
                                "error IS NULL", (_target_key(target), kind)).fetchall()
        best: dict[str, TuningRecord] = {}
        for record in map(self._record, rows):
            if record.ok and (record.workload not in best
                              or record.median_s < best[record.workload].median_s):
                best[record.workload] = record
        return sorted(best.values(), key=lambda r: r.median_s)[:count]

    def workloads(self) -> list[WorkloadSummary]:
        summaries: dict[tuple[str, str], list[TuningRecord]] = {}
        for record in self.records():
            summaries.setdefault((record.workload, record.target), []).append(record)
        return [WorkloadSummary(w, t, rs[0].kind, len(rs), sum(not r.ok for r in rs),
                                min((r.median_s for r in rs), default=math.inf))
                for (w, t), rs in summaries.items()]

    # -- sharing ---------------------------------------------------------------------------------

    def export_jsonl(self, path: str | os.PathLike[str]) -> int:
        """Every record as one JSON object per line; returns the count."""
        records = self.records()
        tmp = Path(f"{path}.tmp")
        with open(tmp, "w") as out:
            for record in records:
                out.write(json.dumps(record.to_dict(), sort_keys=True) + "\n")
        os.replace(tmp, path)  # a reader never sees half a file
        return len(records)

    def import_jsonl(self, path: str | os.PathLike[str]) -> int:
        """Records from an export; every line is checked before any is stored, so a bad file
        changes nothing. Returns how many were new."""
        records = []
        try:
            with open(path) as lines:
                for number, line in enumerate(lines, 1):
                    if not line.strip():
                        continue
                    try:
                        records.append(TuningRecord.from_dict(json.loads(line)))
                    except ValueError as err:  # json.JSONDecodeError is a ValueError
                        raise TuningDBError(f"{path}, line {number}: {err}") from None
        except OSError as err:
            raise TuningDBError(f"cannot read {path}: {err.strerror}") from None
        return self.add_many(records)

    # -- the file --------------------------------------------------------------------------------

    @contextlib.contextmanager
    def _connect(self) -> Iterator[sqlite3.Connection]:
        try:
            with contextlib.closing(sqlite3.connect(self.path, timeout=TIMEOUT_S)) as conn:
                with conn:  # one transaction: committed on success, rolled back on error
                    yield conn
        except sqlite3.DatabaseError as err:
            raise TuningDBError(_explain(self.path, err)) from None
        except sqlite3.Error as err:
            raise TuningDBError(f"tuning database {self.path}: {err}") from None

    def _check_or_create(self, conn: sqlite3.Connection) -> None:
        app_id = conn.execute("PRAGMA application_id").fetchone()[0]
        version = conn.execute("PRAGMA user_version").fetchone()[0]
        tables = {r[0] for r in conn.execute(
            "SELECT name FROM sqlite_master WHERE type = 'table'")}
        if app_id == 0 and not tables:  # a new, empty file
            conn.execute("PRAGMA journal_mode = WAL")  # readers never wait for a writer
            conn.executescript(_SCHEMA)
            conn.execute(f"PRAGMA application_id = {APPLICATION_ID}")
            conn.execute(f"PRAGMA user_version = {SCHEMA_VERSION}")
            return
        if app_id != APPLICATION_ID:
            raise TuningDBError(f"{self.path} is an sqlite database, but not a kiln tuning "
                                "database; give another path")
        if version == 1:
            version = _upgrade_from_1(conn)
        if version != SCHEMA_VERSION:
            raise TuningDBError(f"{self.path} has tuning schema version {version}; this kiln "
                                f"reads version {SCHEMA_VERSION}. Use the kiln that wrote it "
                                "to `kiln db export` the records, then import them here")
        problem = conn.execute("PRAGMA quick_check").fetchone()[0]
        if problem != "ok":
            raise TuningDBError(_explain(self.path, sqlite3.DatabaseError(problem)))

    def _record(self, row: tuple) -> TuningRecord:
        (_, workload, target, kind, trace, decisions, run_times, features, error, created,
         paired, in_model) = row
        try:
            return TuningRecord(workload, target, kind, trace, json.loads(decisions),
                                tuple(json.loads(run_times)), error, created,
                                tuple(json.loads(features)), paired, in_model)
        except (TypeError, ValueError) as err:
            raise TuningDBError(f"{self.path}: a record cannot be read ({err}); the file is "
                                "damaged") from None


def _upgrade_from_1(conn: sqlite3.Connection) -> int:
    """Version 2 added the records' paired and in_model columns: the records stay, none of
    them confirmed.
    One transaction, the version read again inside it, so that two processes opening the
    same old file at once upgrade it once. Returns the version now."""
    conn.commit()
    conn.execute("BEGIN IMMEDIATE")
    try:
        if conn.execute("PRAGMA user_version").fetchone()[0] == 1:
            conn.execute("ALTER TABLE records ADD COLUMN paired REAL")
            conn.execute("ALTER TABLE records ADD COLUMN in_model REAL")
            conn.execute(f"PRAGMA user_version = {SCHEMA_VERSION}")
        conn.commit()
    except BaseException:
        conn.rollback()
        raise
    return conn.execute("PRAGMA user_version").fetchone()[0]


def _canonical(decisions: dict[str, Any]) -> str:
    return json.dumps(decisions, sort_keys=True, separators=(",", ":"))


def _explain(path: Path, err: sqlite3.DatabaseError) -> str:
    return (f"tuning database {path} cannot be read ({err}); it is not kiln's or it is "
            "damaged. kiln does not overwrite it: move it aside, or restore it from a "
            "`kiln db export` file")
