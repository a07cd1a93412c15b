"""Builds and measurements spread over a Ray cluster (`kiln tune ... --ray auto|ADDRESS`).

    with RayRunner(options, address="auto") as runner:   # or None: a local cluster
        errors = runner.build(space, points)              # compiled on the workers, in parallel
        result = runner.run_one(space, point)             # built (cached) and timed on a worker
        times = runner.run_together(space, points)        # side by side, on one worker

Each task runs `kiln.tune.measure.time_one` in a Ray worker process: a candidate that
crashes its worker or runs past the timeout is a failed result, as with the local runner.
As there, a worker's start (a new worker imports torch and kiln: 2.7 s for the first task on
a new local cluster here) is not the candidate's: before the first task, and after a task
that cost its worker, one warm-up task per worker slot of the cluster
(`kiln.tune.measure.ready`) runs under its own limit, ``STARTUP_TIMEOUT_S``.
Every result carries the target it was measured on (the worker's CPU, ISA, compiler and
threads), and the tuner files it under that target, so times from different machines never
mix: on a cluster of unlike machines, only the records of this machine's target guide this
machine's search.

Ray is optional (the tune extra's `ray` package); `RayUnavailable` says how to get it.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from kiln.options import Options
from kiln.tune.measure import (
    STARTUP_TIMEOUT_S,
    MeasureResult,
    build_one,
    ready,
    time_one,
    time_together,
)

__all__ = ["RayRunner", "RayUnavailable"]


class RayUnavailable(RuntimeError):
    pass


def _measure_remote(space: Any, point: dict[str, Any], options: Options, threads: int,
                    budget_s: float) -> tuple[MeasureResult, str]:
    from kiln.tune.db import Target

    result = time_one(space, point, options, threads, budget_s)
    return result, Target.here(options, threads).key()


def _together_remote(space: Any, points: list[dict[str, Any]], options: Options, threads: int,
                     rounds: int) -> tuple[list[tuple[float, ...]], str]:
    from kiln.tune.db import Target

    return time_together(space, points, options, threads, rounds), \
        Target.here(options, threads).key()


def _build_remote(space: Any, point: dict[str, Any], options: Options) -> str:
    return build_one(space, point, options)[1]


class RayRunner:
    """The Builder and Runner of `kiln.tune.measure`, on Ray workers."""

    def __init__(self, options: Options, address: str | None = "auto", timeout_s: float = 30.0,
                 threads: int = 1, budget_s: float = 0.5, num_cpus: int | None = None) -> None:
        try:
            import ray
        except ImportError as err:
            raise RayUnavailable(f"--ray needs Ray ({err}): pip install 'kiln[tune]'") from None
        self.ray = ray
        self.options = options
        self.timeout_s = timeout_s
        self.threads = threads
        self.budget_s = budget_s
        self.started_here = not ray.is_initialized()
        if self.started_here:
            if address is None:  # a cluster of this machine's cores, for this process only
                ray.init(num_cpus=num_cpus, include_dashboard=False, log_to_driver=False)
            else:
                ray.init(address=address, log_to_driver=False)
        # one CPU per task: a measurement must not share its cores with another
        self._measure = ray.remote(num_cpus=max(threads, 1), max_retries=0)(_measure_remote)
        self._together = ray.remote(num_cpus=max(threads, 1), max_retries=0)(_together_remote)
        self._build = ray.remote(num_cpus=1, max_retries=0)(_build_remote)
        self._ready = {n: ray.remote(num_cpus=n, max_retries=0)(ready) for n in {1, threads}}
        self._warm = False
        self.last_target: str | None = None

    def __enter__(self) -> RayRunner:
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop()

    def _stop(self) -> None:
        if self.started_here and self.ray.is_initialized():
            self.ray.shutdown()

    def _warm_up(self) -> None:
        """Every worker slot of the cluster started, with timing's imports done; a cluster
        that does not come up within STARTUP_TIMEOUT_S is left to the tasks' own limits."""
        if self._warm:
            return
        cpus = int(self.ray.cluster_resources().get("CPU", 1))
        refs = [self._ready[n].remote() for n in self._ready for _ in range(max(cpus // n, 1))]
        try:
            self.ray.get(refs, timeout=max(STARTUP_TIMEOUT_S, self.timeout_s))
        except Exception:  # noqa: BLE001 - (a timeout, a worker that died): the tasks report
            for ref in refs:
                self.ray.cancel(ref, force=True)
        self._warm = True

    def build(self, space: Any, points: Sequence[Mapping[str, Any]]) -> list[str]:
        self._warm_up()
        refs = [self._build.remote(space, dict(p), self.options) for p in points]
        errors = []
        for ref in refs:
            try:
                errors.append(self.ray.get(ref, timeout=self.timeout_s * 4))
            except Exception as err:  # noqa: BLE001 - a build that died is a failed build
                errors.append(f"build: {type(err).__name__}: {_first_line(err)}")
        return errors

    def run_one(self, space: Any, point: Mapping[str, Any]) -> MeasureResult:
        self._warm_up()
        ref = self._measure.remote(space, dict(point), self.options, self.threads,
                                   self.budget_s)
        done, _ = self.ray.wait([ref], timeout=self.timeout_s)
        if not done:
            self.ray.cancel(ref, force=True)  # ends the worker running the hung kernel
            self._warm = False  # (its replacement starts before the next candidate's clock)
            return MeasureResult(dict(point), error=f"timeout: over {self.timeout_s:g} s")
        try:
            result, target = self.ray.get(ref)
        except self.ray.exceptions.WorkerCrashedError:
            self._warm = False
            return MeasureResult(dict(point), error="crash: the kernel killed its worker")
        except Exception as err:  # noqa: BLE001 - a task error is a failed candidate
            return MeasureResult(dict(point), error=f"run: {type(err).__name__}: "
                                 f"{_first_line(err)}")
        self.last_target = target
        return MeasureResult(result.decisions, result.run_times, result.error, result.source,
                             target)


    def run_together(self, space: Any, points: Sequence[Mapping[str, Any]], rounds: int = 7
                     ) -> list[tuple[float, ...]]:
        """`kiln.tune.measure.time_together` on one worker; empty tuples where it failed, or
        where that worker is another kind of machine than this one (the confirmation is filed
        under this machine's target)."""
        self._warm_up()
        ref = self._together.remote(space, [dict(p) for p in points], self.options,
                                    self.threads, rounds)
        done, _ = self.ray.wait([ref], timeout=self.timeout_s * max(len(points), 1))
        if not done:
            self.ray.cancel(ref, force=True)
            self._warm = False
            return [() for _ in points]
        try:
            times, target = self.ray.get(ref)
        except Exception:  # noqa: BLE001 - (a crashed worker): nothing confirmed
            self._warm = False
            return [() for _ in points]
        if target != _here(self.options, self.threads):
            return [() for _ in points]
        return times


def _here(options: Options, threads: int) -> str:
    from kiln.tune.db import Target

    return Target.here(options, threads).key()


def _first_line(err: BaseException) -> str:
    text = str(err).strip()
    return text.splitlines()[0] if text else type(err).__name__
