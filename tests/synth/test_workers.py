"""kiln.synth.workers: jobs in worker processes, results in order, a job past its deadline
(or whose worker dies, or whose function raises) gets on_failure's result and the pool
goes on."""

from __future__ import annotations

import os
import time
from typing import Any

from kiln.synth.workers import DeadlinePool


def work(job: tuple[str, Any]) -> int:
    kind, n = job
    if kind == "hang":
        time.sleep(60)  # a search that does not stop at its own limit
    if kind == "die":
        os._exit(3)
    if kind == "once":  # stalls the first time only (a marker file says it ran)
        if not os.path.exists(n):
            open(n, "w").close()
            time.sleep(60)
        return -1
    if kind == "raise":
        raise ValueError(f"bad job {n}")
    return n * n


def failed(job: tuple[str, int], why: str) -> str:
    return f"{job[0]} {job[1]}: {why}"


def test_results_in_order_with_a_hang_a_death_and_an_error_among_them() -> None:
    # each failure but the error is tried twice
    jobs = [("ok", 1), ("hang", 2), ("ok", 3), ("die", 4), ("ok", 5), ("raise", 6), ("ok", 7)]
    progress: list[tuple[int, int]] = []
    start = time.monotonic()
    with DeadlinePool(work, 2, deadline_s=1.0, on_failure=failed) as pool:
        for job in jobs:
            pool.submit(job)
        results = pool.results(lambda done, total: progress.append((done, total)))
    assert time.monotonic() - start < 20  # the hang was stopped, not waited out
    assert results[0::2] == [1, 9, 25, 49]
    assert results[1] == "hang 2: stopped after 1 s (past its own limits)"
    assert results[3] == "die 4: its worker process died"
    assert results[5] == "raise 6: ValueError: bad job 6"
    assert progress == [(n, len(jobs)) for n in range(1, len(jobs) + 1)]


def test_jobs_submitted_while_the_parent_works_and_none_at_all() -> None:
    with DeadlinePool(work, 2, deadline_s=30.0, on_failure=failed) as pool:
        pool.submit(("ok", 2))
        time.sleep(0.2)  # the parent busy: the first job runs meanwhile
        pool.submit(("ok", 3))
        assert pool.results() == [4, 9]
    with DeadlinePool(work, 2, deadline_s=30.0, on_failure=failed) as pool:
        assert pool.results() == []


def test_a_job_that_stalls_once_runs_again(tmp_path) -> None:
    marker = str(tmp_path / "ran")
    with DeadlinePool(work, 2, deadline_s=1.0, on_failure=failed) as pool:
        pool.submit(("once", marker))
        pool.submit(("ok", 3))
        assert pool.results() == [-1, 9]
    assert os.path.exists(marker)
