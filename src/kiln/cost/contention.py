"""How long this process's threads waited for a CPU: the sign that other work shared the
cores while kiln timed something.

    before = waited_s()
    ...                                   # the timing
    share = waited_share(before, wall_s)  # seconds waited per second of wall time, or None

Linux counts, per thread, the time it was ready to run but had no CPU (the second field of
``/proc/<pid>/task/<tid>/schedstat``, in ns). kiln's own threads (the caller and its OpenMP
and ATen pools) fit the cores they are sized for, so on a quiet machine they hardly wait:
compiling HF LeViT on this project's 2-core machine, its 37 kernel timings waited 0-1.1% of
their wall time; with one other process spinning beside the compile, half (the median).
A timing's samples can stay close to each other under a steady load (a test suite beside
it) while the load slows the contenders unequally, so `kiln.cost.measure.Timing.steady`
also asks this. Elsewhere (no ``/proc``) it is unknown, and only the samples' spread
decides.
"""

from __future__ import annotations

import os
import sqlite3

__all__ = ["CHECKED", "forget_unchecked", "waited_s", "waited_share"]

# the version of a timing cache (sqlite's user_version) whose rows all come from timings
# checked for contention; the rows of an older file are forgotten (`forget_unchecked`).
# Before the check, a steady load beside a compile kept wrong answers: this project's kernel
# decisions, filled over weeks, held HF LeViT's 49x512x256 GEMM with its hardswish as library
# 0.150 ms against generated 0.170 (measured quiet: 0.145 against 0.079), and a compile with
# a new database ran HF LeViT 0.931 and mobilenet_v2 0.929 of its time with the old one (300
# alternated calls; resnet50, inception and bert 0.995-1.008)
CHECKED = 1

_TASKS = "/proc/self/task"


def waited_s() -> float | None:
    """Seconds this process's threads, those alive now, have waited for a CPU so far; None
    where the kernel does not say."""
    try:
        tids = os.listdir(_TASKS)
    except OSError:
        return None
    total, found = 0, False
    for tid in tids:
        try:
            with open(f"{_TASKS}/{tid}/schedstat") as f:
                total += int(f.read().split()[1])
            found = True
        except (OSError, IndexError, ValueError):
            continue  # (a thread that ended since the listing)
    return total / 1e9 if found else None


def waited_share(before: float | None, wall_s: float) -> float | None:
    """Seconds waited since ``before`` (a `waited_s` reading) per second of ``wall_s``."""
    now = waited_s()
    if before is None or now is None or wall_s <= 0:
        return None
    return max(now - before, 0.0) / wall_s


def forget_unchecked(db: sqlite3.Connection, table: str) -> None:
    """Empty ``table`` of a timing cache an older kiln wrote (its user_version below
    `CHECKED`), once, in the caller's transaction."""
    if db.execute("PRAGMA user_version").fetchone()[0] < CHECKED:
        db.execute(f"DELETE FROM {table}")  # (a name of kiln's own tables, never user input)
        db.execute(f"PRAGMA user_version = {CHECKED}")
