"""Building and timing candidates for the tuner, where a bad candidate cannot hurt it.

    with Builder(options, jobs=2) as builder:             # worker processes live across calls
        built = builder.build(space, [point, ...])    # compiled into the kernel cache
    with Runner(options, timeout_s=20) as runner:
        results = runner.run(space, [point, ...])     # MeasureResult per point, in order

The builder renders and compiles candidates in worker processes (a C compiler run each; they
land in the shared kernel cache). The runner times each built candidate in one separate
worker process, on random operands, with an untimed call first, then interleaved timing
(`kiln.cost.measure`: repeats and medians). It checks each candidate's output against the
space's reference once, before timing. A candidate that crashes its process (a wild store
in generated code) or runs past the timeout comes back as a failed result, the worker is
replaced, and tuning goes on. ``runner.run_together`` times several built candidates side by
side in interleaved rounds: the tuner's last word between its best candidates and the
default.
"""

from __future__ import annotations

import concurrent.futures as futures
import multiprocessing
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import torch

from kiln.options import Options

__all__ = ["Builder", "MeasureResult", "Runner", "build_one", "features_of", "kernel_call",
           "laid_out_operands", "ready", "time_one", "time_together"]

CHECK_RTOL = 1e-4
# A spawned worker imports torch and kiln before it can time anything: about 4 s here, much
# more on a loaded machine. That wait is not the candidate's, so it has its own limit.
STARTUP_TIMEOUT_S = 300.0


@dataclass(frozen=True)
class MeasureResult:
    decisions: dict[str, Any]
    run_times: tuple[float, ...] = ()  # seconds per call
    error: str | None = None  # build, check, crash or timeout: what went wrong
    source: str = ""  # the generated C
    target: str | None = None  # Target.key() of where it ran, when not this machine's

    @property
    def ok(self) -> bool:
        return self.error is None and bool(self.run_times)


def build_one(space: Any, decisions: Mapping[str, Any], options: Options) -> tuple[str, str]:
    """Compile one candidate into the kernel cache; returns (source, error or "")."""
    from kiln.codegen.build import CompileError
    from kiln.codegen.kernel import compile_kernel

    try:
        func = space.plan(decisions).build()
        kernel = compile_kernel(func, options)
    except (CompileError, ValueError) as err:
        return "", f"build: {type(err).__name__}: {str(err).splitlines()[0] if str(err) else ''}"
    if not hasattr(kernel, "source"):
        return "", f"build: no C compiler ({kernel.reason})"
    return kernel.source, ""


def features_of(space: Any, points: Sequence[Mapping[str, Any]]) -> list[tuple[float, ...]]:
    """The cost model's features of each point's program (`kiln.tune.features`)."""
    from kiln.tune.features import features

    return [tuple(features(space.plan(dict(p)).build())) for p in points]


def time_one(space: Any, decisions: Mapping[str, Any], options: Options, threads: int,
             budget_s: float) -> MeasureResult:
    """In the runner's process: load (from the cache), check once, then time."""
    from kiln.codegen.kernel import compile_kernel
    from kiln.cost.measure import interleaved

    torch.set_num_threads(threads)
    point = dict(decisions)
    try:
        kernel = compile_kernel(space.plan(point).build(), options)
    except Exception as err:  # noqa: BLE001 - a candidate's failure is data, not a crash
        return MeasureResult(point, error=f"build: {type(err).__name__}: {err}")
    if not hasattr(kernel, "source"):
        return MeasureResult(point, error=f"build: no C compiler ({kernel.reason})")
    kernel.set_num_threads(threads)
    operands, expected = laid_out_operands(space, point)
    pointers = [t.data_ptr() for t in operands]
    kernel.run_unchecked(*pointers)
    for out, want in zip(operands[len(operands) - len(expected):], expected):
        out, want = out.reshape(-1), want.reshape(-1)  # row kernels see [rows, n]
        if not torch.allclose(out, want, rtol=CHECK_RTOL, atol=CHECK_RTOL * _scale(space),
                              equal_nan=True):
            worst = (out - want).abs().nan_to_num(nan=float("inf")).max().item()
            return MeasureResult(point, error=f"check: differs from the reference by "
                                 f"{worst:.3g}", source=kernel.source)
    (timing,) = interleaved([lambda: kernel.run_unchecked(*pointers)],
                            _budget(space, min_rounds=5, max_rounds=7, cap_s=budget_s),
                            before_sample=_before_sample(space))
    if timing.error is not None or not timing.samples:
        return MeasureResult(point, error=f"run: {timing.error}", source=kernel.source)
    return MeasureResult(point, tuple(timing.samples), None, kernel.source)


def ready() -> int:
    """In a new worker: import what timing needs, so that no candidate's timeout counts it."""
    import kiln.codegen.kernel  # noqa: F401
    import kiln.cost.measure  # noqa: F401
    import kiln.tune.space  # noqa: F401

    return multiprocessing.current_process().pid or 0


def laid_out_operands(space: Any, point: Mapping[str, Any]
                      ) -> tuple[list[torch.Tensor], list[torch.Tensor]]:
    """``space.operands`` as the kernel reads them: dense, but for the operands the space
    lays out with the kernel's own strides (a bmm's views, a channels-last image)."""
    operands, expected = space.operands(dict(point), torch.Generator().manual_seed(0))
    strided = getattr(space, "strided_operands", ())
    return [t if i in strided else t.contiguous() for i, t in enumerate(operands)], expected


def kernel_call(space: Any, point: Mapping[str, Any], options: Options, threads: int
                ) -> Callable[[], object]:
    """A call of the point's kernel (built: from the cache) on its operands."""
    from kiln.codegen.kernel import compile_kernel

    kernel = compile_kernel(space.plan(dict(point)).build(), options)
    kernel.set_num_threads(threads)
    operands, _ = laid_out_operands(space, point)
    pointers = [t.data_ptr() for t in operands]
    return lambda keep=operands: kernel.run_unchecked(*pointers)  # (keep: the memory lives)


def time_together(space: Any, points: Sequence[Mapping[str, Any]], options: Options,
                  threads: int, rounds: int = 7) -> list[tuple[float, ...]]:
    """In the runner's process: the points (built and checked already) timed together, in
    interleaved rounds, so that a slow phase of the machine falls on all of them alike; an
    empty tuple for a point that no longer builds or runs. Each point's i-th time is from
    round i, where none raised (`interleaved` drops a point that raises)."""
    from kiln.cost.measure import interleaved

    torch.set_num_threads(threads)
    calls: list[Callable[[], object] | None] = []
    for point in points:
        try:
            calls.append(kernel_call(space, point, options, threads))
        except Exception:  # noqa: BLE001 - that point is left out, the others are timed
            calls.append(None)
    live = [c for c in calls if c is not None]
    timings = iter(interleaved(live, _budget(space, min_rounds=rounds, max_rounds=rounds),
                               before_sample=_before_sample(space)))
    out = []
    for call in calls:
        timing = next(timings) if call is not None else None
        ok = timing is not None and timing.error is None and timing.samples
        out.append(tuple(timing.samples) if ok else ())  # type: ignore[union-attr]
    return out


def _budget(space: Any, **rounds: Any) -> Any:
    """How a sample is timed: hot, a batch of at least 1 ms after a settle call; or, for a
    kernel whose weights stream from memory in its model (``space.streamed``,
    `kiln.kernels.streaming`), one call with the caches evicted before it (`_before_sample`),
    as the compile's decision times it (`Budget.kernel_cold`). resnet18's 512x7x7 3x3
    convolutions (9.4 MB of weights) took 1.3-1.4 ms alone and hot, 2.0-2.1 in the model."""
    from kiln.cost.measure import Budget

    if getattr(space, "streamed", False):
        return Budget(min_sample_s=0.0, settle_calls=0, collect_first=False, **rounds)
    return Budget(min_sample_s=1e-3, settle_calls=1, collect_first=False, **rounds)


def _before_sample(space: Any) -> Callable[[], object] | None:
    from kiln.cost.measure import evict_caches

    return evict_caches if getattr(space, "streamed", False) else None


def _scale(space: Any) -> float:
    return float(getattr(space, "k", 1)) ** 0.5


class Builder:
    """Compiles candidates in ``jobs`` worker processes, which live across calls (use as a
    context manager, or `close`): a spawned worker imports torch and kiln first, about 4 s
    on this project's 2-core machines, and a fresh pool per batch of 8 once took 188 s of a
    217 s run."""

    def __init__(self, options: Options, jobs: int = 2) -> None:
        self.options = options
        self.jobs = max(jobs, 1)
        self._pool: futures.ProcessPoolExecutor | None = None

    def __enter__(self) -> Builder:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def build(self, space: Any, points: Sequence[Mapping[str, Any]]) -> list[str]:
        """The build error of each point, "" where it built."""
        if self.jobs == 1 or len(points) == 1:
            return [build_one(space, p, self.options)[1] for p in points]
        pool = self._workers()
        jobs = [pool.submit(build_one, space, dict(p), self.options) for p in points]
        errors = []
        for job in jobs:
            try:
                errors.append(job.result()[1])
            except Exception as err:  # noqa: BLE001 - the compiler process died
                errors.append(f"build: {type(err).__name__}: {err}")
        if any(e.startswith("build: BrokenProcessPool") for e in errors):
            self.close()  # a new pool for the next batch
        return errors

    def features(self, space: Any, points: Sequence[Mapping[str, Any]]
                 ) -> list[tuple[float, ...]]:
        """The cost model's features of each point's program, extracted in the worker
        processes, a share of the points each."""
        shares = [list(points[i::self.jobs]) for i in range(self.jobs)]
        if self.jobs == 1 or len(points) < 2:
            return features_of(space, list(points))
        pool = self._workers()
        jobs = [pool.submit(features_of, space, share) for share in shares if share]
        try:
            done = [job.result() for job in jobs]
        except Exception:  # noqa: BLE001 - a worker died: here, then, in this process
            self.close()
            return features_of(space, list(points))
        out: list[tuple[float, ...]] = [()] * len(points)
        for i, share in enumerate(done):
            out[i::self.jobs] = share
        return out

    def _workers(self) -> futures.ProcessPoolExecutor:
        if self._pool is None:
            ctx = multiprocessing.get_context("spawn")  # no forked torch thread pools
            self._pool = futures.ProcessPoolExecutor(self.jobs, mp_context=ctx)
        return self._pool

    def close(self) -> None:
        pool, self._pool = self._pool, None
        if pool is not None:
            pool.shutdown(wait=True, cancel_futures=True)


class Runner:
    """Times candidates in one worker process at a time, replaced after a crash or a
    timeout. Use as a context manager (the worker lives across calls)."""

    def __init__(self, options: Options, timeout_s: float = 30.0, threads: int | None = None,
                 budget_s: float = 0.5) -> None:
        self.options = options
        self.timeout_s = timeout_s
        self.threads = threads or torch.get_num_threads()
        self.budget_s = budget_s
        self._pool: futures.ProcessPoolExecutor | None = None

    def __enter__(self) -> Runner:
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop()

    def run(self, space: Any, points: Sequence[Mapping[str, Any]]) -> list[MeasureResult]:
        return [self.run_one(space, p) for p in points]

    def run_one(self, space: Any, point: Mapping[str, Any]) -> MeasureResult:
        pool = self._worker()
        if pool is None:
            return MeasureResult(dict(point), error="runner: its worker process did not start")
        job = pool.submit(time_one, space, dict(point), self.options, self.threads,
                          self.budget_s)
        try:
            return job.result(timeout=self.timeout_s)
        except futures.TimeoutError:
            self._stop(kill=True)
            return MeasureResult(dict(point), error=f"timeout: over {self.timeout_s:g} s")
        except futures.process.BrokenProcessPool:
            self._stop(kill=True)
            return MeasureResult(dict(point), error="crash: the kernel killed its process")

    def run_together(self, space: Any, points: Sequence[Mapping[str, Any]], rounds: int = 7
                     ) -> list[tuple[float, ...]]:
        """`time_together` in the worker; empty tuples where it crashed or timed out."""
        pool = self._worker()
        if pool is None:
            return [() for _ in points]
        job = pool.submit(time_together, space, [dict(p) for p in points], self.options,
                          self.threads, rounds)
        try:
            return job.result(timeout=self.timeout_s * max(len(points), 1))
        except (futures.TimeoutError, futures.process.BrokenProcessPool):
            self._stop(kill=True)
            return [() for _ in points]

    def _worker(self) -> futures.ProcessPoolExecutor | None:
        """The worker, started and warmed up (`ready`) before a candidate's clock starts;
        None when it does not come up within STARTUP_TIMEOUT_S."""
        if self._pool is None:
            ctx = multiprocessing.get_context("spawn")
            self._pool = futures.ProcessPoolExecutor(1, mp_context=ctx)
            try:
                self._pool.submit(ready).result(timeout=max(STARTUP_TIMEOUT_S, self.timeout_s))
            except (futures.TimeoutError, futures.process.BrokenProcessPool):
                self._stop(kill=True)
        return self._pool

    def _stop(self, kill: bool = False) -> None:
        pool, self._pool = self._pool, None
        if pool is None:
            return
        if kill:  # a hung kernel never returns: end its process, not just the pool
            for process in list(getattr(pool, "_processes", {}).values()):
                process.kill()
        pool.shutdown(wait=not kill, cancel_futures=True)
