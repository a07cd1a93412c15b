"""Jobs in forked worker processes, each under a deadline that kills its worker.

    with DeadlinePool(prove, workers=2, deadline_s=13, on_failure=unknown) as pool:
        for job in jobs:          # may be submitted while the parent keeps working
            pool.submit(job)
        results = pool.results()  # in submission order

z3 does not always stop at its own time and resource limits (a nonlinear or E-matching
search was seen running 415 s past a 1 s limit, now and then, on the same law), and
multiprocessing's Pool cannot stop one task. Here a thread of the parent hands each
worker one job at a time over a pipe and watches the clock: a job past its deadline has
its worker killed and replaced and runs once more (the stalls seen came and went), then
gets ``on_failure(job, why)`` as its result; so does a job whose worker died twice or whose
function raised.
"""

from __future__ import annotations

import collections
import multiprocessing
import threading
import time
from collections.abc import Callable
from multiprocessing.connection import Connection, wait
from typing import Any

POLL_S = 0.05


class DeadlinePool:
    def __init__(self, fn: Callable[[Any], Any], workers: int, deadline_s: float,
                 on_failure: Callable[[Any, str], Any],
                 initializer: Callable[[], None] | None = None, retries: int = 1) -> None:
        self.fn, self.count, self.deadline_s, self.retries = fn, workers, deadline_s, retries
        self.attempts: collections.Counter[int] = collections.Counter()
        self.on_failure, self.initializer = on_failure, initializer
        self.context = multiprocessing.get_context("fork")  # workers inherit the modules
        self.jobs: list[Any] = []
        self.results_by_job: dict[int, Any] = {}
        self.queue: collections.deque[int] = collections.deque()
        self.changed = threading.Condition()
        self.closed = False
        self.procs: list[Any] = []
        self.conns: list[Connection] = []
        self.thread = threading.Thread(target=self._dispatch, daemon=True)

    def __enter__(self) -> DeadlinePool:
        for _ in range(self.count):
            self._start_worker(None)
        self.thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        with self.changed:
            self.closed = True
            self.queue.clear()
            self.changed.notify_all()
        self.thread.join()
        for w in range(len(self.procs)):
            self._stop_worker(w)

    def submit(self, job: Any) -> None:
        with self.changed:
            self.jobs.append(job)
            self.queue.append(len(self.jobs) - 1)
            self.changed.notify_all()

    def results(self, progress: Callable[[int, int], None] | None = None) -> list[Any]:
        """Every submitted job's result, in submission order (``progress(done, total)`` as
        they come in)."""
        with self.changed:
            self.closed = True
            self.changed.notify_all()
            reported = 0
            while True:
                done, total = len(self.results_by_job), len(self.jobs)
                if progress is not None:
                    for n in range(reported + 1, done + 1):
                        progress(n, total)
                reported = done
                if done == total:
                    break
                self.changed.wait(POLL_S)
        return [self.results_by_job[i] for i in range(len(self.jobs))]

    # --- the parent's thread -------------------------------------------------------------

    def _dispatch(self) -> None:
        idle = list(range(self.count))
        busy: dict[int, tuple[int, float]] = {}  # worker -> (job, started)
        while True:
            with self.changed:
                while idle and self.queue:
                    w, j = idle.pop(), self.queue.popleft()
                    self.conns[w].send(self.jobs[j])
                    busy[w] = (j, time.monotonic())
                if not busy:
                    if self.closed and not self.queue:
                        return
                    self.changed.wait(POLL_S)
                    continue
            ready = wait([self.conns[w] for w in busy], timeout=POLL_S)
            for w in [w for w in busy if self.conns[w] in ready]:
                j, _ = busy.pop(w)
                try:
                    ok, value = self.conns[w].recv()
                except (EOFError, OSError):
                    self._start_worker(w)
                    self._again(j, "its worker process died")
                else:
                    self._finish(j, value if ok else self.on_failure(self.jobs[j], value))
                idle.append(w)
            now = time.monotonic()
            for w, (j, started) in list(busy.items()):
                if now - started > self.deadline_s:
                    del busy[w]
                    self._start_worker(w)
                    self._again(j, f"stopped after {self.deadline_s:g} s (past its own limits)")
                    idle.append(w)

    def _again(self, job: int, why: str) -> None:
        """Run the job once more (first in line), or give it on_failure's result."""
        self.attempts[job] += 1
        if self.attempts[job] > self.retries:
            self._finish(job, self.on_failure(self.jobs[job], why))
            return
        with self.changed:
            self.queue.appendleft(job)

    def _finish(self, job: int, result: Any) -> None:
        with self.changed:
            self.results_by_job[job] = result
            self.changed.notify_all()

    def _start_worker(self, at: int | None) -> None:
        """A new worker, or one in place of worker ``at`` (killed first)."""
        parent, child = self.context.Pipe()
        proc = self.context.Process(target=_serve, args=(child, self.fn, self.initializer),
                                    daemon=True)
        proc.start()
        child.close()
        if at is None:
            self.procs.append(proc)
            self.conns.append(parent)
        else:
            self._stop_worker(at)
            self.procs[at], self.conns[at] = proc, parent

    def _stop_worker(self, w: int) -> None:
        proc = self.procs[w]
        if proc.is_alive():
            proc.kill()
        proc.join()
        self.conns[w].close()


def _serve(conn: Connection, fn: Callable[[Any], Any],
           initializer: Callable[[], None] | None) -> None:
    if initializer is not None:
        initializer()
    while True:
        try:
            job = conn.recv()
        except EOFError:
            return
        try:
            conn.send((True, fn(job)))
        except Exception as err:  # noqa: BLE001 - reported as the job's failure
            conn.send((False, f"{type(err).__name__}: {err}"))


__all__ = ["DeadlinePool"]
