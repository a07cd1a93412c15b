"""One way to time code: callables run side by side in interleaved rounds, medians reported.

    a, b = interleaved([library_call, generated_call], Budget.kernel())
    a.median_s, b.median_s            # seconds per call

Every timing decision in kiln goes through here: the channels-last decision of
`kiln.passes.layout`, generated-versus-library choices in `kiln.kernels`, and `kiln bench`.
Why interleaved: machine noise (another process, a frequency change, a runtime's idle threads
still spinning after its last call) then hits every contender alike instead of whichever ran
during the bad second. Each contender gets one untimed call first, so its one-time costs
(page faults, lazy initialization, the first call of a thread pool) are not timed.
A sample is the mean of a batch of calls sized so that one sample lasts at least
``Budget.min_sample_s`` (timer resolution and call overhead stay small against it).
"""

from __future__ import annotations

import gc
import math
import os
import statistics
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

from kiln.cost.contention import waited_s, waited_share

# a timing during which this process's threads waited for a CPU more than this share of
# the wall time ran beside other work (`kiln.cost.contention`): HF LeViT's kernel timings
# on this project's 2 cores waited 0-0.011 quiet, a median 0.5 beside one spinning process
WAITED_MAX = 0.05
# an untimed call this many times a sample's minimum length: one call a sample, no trial
# batch (one-time costs may have lengthened the untimed call, but not fivefold)
ONE_CALL_ENOUGH = 5

__all__ = ["Budget", "Timing", "alternated", "evict_caches", "interleaved",
           "last_level_cache_bytes"]


@dataclass(frozen=True)
class Budget:
    """How long to measure: at least ``min_rounds`` rounds, then until every contender has
    run ``target_s`` seconds, stopping at ``max_rounds`` or after ``cap_s`` seconds."""

    min_rounds: int = 5
    target_s: float = 0.0
    cap_s: float = math.inf
    max_rounds: int = 10_000
    min_sample_s: float = 0.0  # 0: one call per sample
    warmup: int = 1  # untimed calls per contender before the first round
    # untimed calls of a contender right before each of its samples: the previous contender's
    # threads (ORT's pool, an OpenMP team) spin for a while after its call and would slow this
    # one's first call; this also wakes this contender's own pool
    settle_calls: int = 0
    # settle calls only for a contender whose untimed call took less: a spinning pool costs a
    # call at most a fraction of a millisecond, nothing against a long one, whose settle call
    # only doubles the time spent (a 512x512 image's convolutions at compile time)
    settle_below_s: float = math.inf
    # a pause before each contender's settle calls, long enough for the previous contender's
    # idle threads to stop spinning and sleep: ORT's pool and an OpenMP team spin after a
    # call, and a settle call does not outlast that (`kiln bench` on the MLP: kiln 7.8 ms
    # after ORT's call, 3.9 ms alone)
    quiet_s: float = 0.0
    # a full garbage collection first (then none while timing): a clean heap for a benchmark;
    # at compile time, with the compiler's own objects alive, it costs more than the timing
    collect_first: bool = True

    @staticmethod
    def kernel_cold() -> Budget:
        """For a kernel that streams its weights once per model call (a matrix-vector
        product): one call per sample, no settle call, the caches evicted before each sample
        (`interleaved`'s ``before_sample``), as a model call finds them."""
        return Budget(min_rounds=3, target_s=0.0, cap_s=2.0, max_rounds=7, min_sample_s=0.0,
                      settle_calls=0, collect_first=False)

    @staticmethod
    def kernel() -> Budget:
        """For one kernel against its library call at compile time: short and robust (3
        rounds where the caller's ``settled`` says the ranking is already clear, else 5)."""
        return Budget(min_rounds=3, target_s=0.0, cap_s=2.0, max_rounds=5, min_sample_s=2e-3,
                      settle_calls=1, settle_below_s=5e-3, collect_first=False)


@dataclass
class Timing:
    """Per-call seconds of one contender, one entry per round; ``error`` if it raised."""

    samples: list[float] = field(default_factory=list)
    error: BaseException | None = None
    # seconds this process's threads waited for a CPU per second of the rounds' wall time
    # (`kiln.cost.contention`); None where unknown
    waited: float | None = None

    @property
    def median_s(self) -> float:
        return statistics.median(self.samples) if self.samples else math.inf

    @property
    def min_s(self) -> float:
        return min(self.samples) if self.samples else math.inf

    @property
    def max_s(self) -> float:
        return max(self.samples) if self.samples else math.inf

    def steady(self, spread: float = 0.5) -> bool:
        """Whether the samples span at most ``spread`` of their median and the threads
        hardly waited for a CPU (`WAITED_MAX`): on a busy machine, time slices taken by
        other processes show as outliers, or as waiting under a steady load that slows the
        contenders unequally; such a timing is used once but not kept."""
        if self.waited is not None and self.waited > WAITED_MAX:
            return False
        return bool(self.samples) and self.max_s - self.min_s <= spread * self.median_s


def interleaved(fns: Sequence[Callable[[], object]], budget: Budget = Budget(),
                settled: Callable[[list[Timing]], bool] | None = None,
                before_sample: Callable[[], object] | None = None) -> list[Timing]:
    """Time each of ``fns`` in interleaved rounds (see the module docstring). A contender that
    raises is dropped from later rounds; its Timing carries the error. ``settled``: after
    ``budget.min_rounds``, stop once it says the timings so far answer the caller's question
    (a ranking no further round would change), else go on to ``budget.max_rounds``;
    ``budget.target_s`` is then unused. ``before_sample`` runs, untimed, before each sample
    (after its settle calls): `evict_caches`, for a cold-cache timing."""
    timings = [Timing() for _ in fns]
    live = list(range(len(fns)))
    untimed_s: dict[int, float] = {}
    for i in list(live):
        start = time.perf_counter()
        if not _untimed(fns[i], budget.warmup, timings[i]):
            live.remove(i)
        untimed_s[i] = (time.perf_counter() - start) / budget.warmup if budget.warmup else 0.0
    batches = {i: _batch(fns[i], budget.min_sample_s, untimed_s[i]) for i in live}
    settles = {i: budget.settle_calls if untimed_s.get(i, 0.0) < budget.settle_below_s else 0
               for i in live}
    started = time.perf_counter()
    waited_before = waited_s()
    rounds = 0
    if budget.collect_first:
        gc.collect()
    gc.disable()  # a collection in one contender's call would be noise only it pays for
    try:
        while live and rounds < budget.max_rounds:
            for i in list(live):
                n = batches[i]
                try:
                    if budget.quiet_s:
                        time.sleep(budget.quiet_s)
                    for _ in range(settles[i]):
                        fns[i]()
                    if before_sample is not None:
                        before_sample()
                    t0 = time.perf_counter()
                    for _ in range(n):
                        fns[i]()
                    timings[i].samples.append((time.perf_counter() - t0) / n)
                except Exception as err:  # noqa: BLE001 - a failing contender leaves the race
                    timings[i].error = err
                    live.remove(i)
            rounds += 1
            if rounds < budget.min_rounds:
                continue
            if time.perf_counter() - started >= budget.cap_s:
                break
            if settled is not None:  # (it stands in for target_s)
                if settled(timings):
                    break
                continue
            spent = min((sum(timings[i].samples) * batches[i] for i in live), default=math.inf)
            if spent >= budget.target_s:
                break
    finally:
        gc.enable()
    waited = waited_share(waited_before, time.perf_counter() - started)
    for timing in timings:
        timing.waited = waited
    return timings


def alternated(a: Callable[[], object], b: Callable[[], object], pairs: int) -> list[float]:
    """``b``'s time over ``a``'s, one ratio per pair of single calls, the order alternating
    (a b, b a, ...) so that neither always runs second: for two whole models whose difference
    is a percent or two, where this machine's speed drifts by 10% within seconds. Each
    contender gets one untimed call first. Identical builds of HF LeViT read a median of
    1.007 over 400 pairs, and builds 3.6% apart told apart in 337 of 400."""
    a()
    b()
    ratios = []
    gc.disable()  # (a collection inside one call would be noise only that call pays for)
    try:
        for i in range(pairs):
            first, second = (a, b) if i % 2 == 0 else (b, a)
            t0 = time.perf_counter()
            first()
            t1 = time.perf_counter()
            second()
            t2 = time.perf_counter()
            ta, tb = (t1 - t0, t2 - t1) if i % 2 == 0 else (t2 - t1, t1 - t0)
            ratios.append(tb / ta)
    finally:
        gc.enable()
    return ratios


def _untimed(fn: Callable[[], object], count: int, timing: Timing) -> bool:
    try:
        for _ in range(count):
            fn()
    except Exception as err:  # noqa: BLE001
        timing.error = err
        return False
    return True


def _batch(fn: Callable[[], object], min_sample_s: float, call_s: float = 0.0) -> int:
    """Calls per sample so that a sample lasts at least ``min_sample_s``: a first guess from
    ``call_s`` (an untimed call's seconds, which its one-time costs can only lengthen: the
    guess errs short), then doubled until a timed batch lasts long enough. A call that took
    `ONE_CALL_ENOUGH` times the sample's length is a sample alone, without a trial batch."""
    if min_sample_s > 0 and call_s >= ONE_CALL_ENOUGH * min_sample_s:
        return 1
    n = max(int(min_sample_s / call_s), 1) if call_s > 0 else 1
    while min_sample_s > 0:
        start = time.perf_counter()
        for _ in range(n):
            fn()
        if time.perf_counter() - start >= min_sample_s:
            break
        n *= 2
    return n


def evict_caches() -> None:
    """Pass over a buffer twice the last-level cache (64 MiB where the size is unknown), so
    that what a timed call reads next comes from memory, as weights read once per model call
    do."""
    global _EVICTION
    if _EVICTION is None:
        import torch  # (the timing loop itself needs no torch)

        _EVICTION = torch.zeros(last_level_cache_bytes() // 2, dtype=torch.float32)
    _EVICTION.add_(1.0)


_EVICTION = None


def last_level_cache_bytes() -> int:
    """The last-level cache's size in bytes, as the OS reports it (16-128 MiB; 32 MiB where
    it does not say)."""
    try:
        size = os.sysconf("SC_LEVEL3_CACHE_SIZE")
    except (ValueError, OSError, AttributeError):
        size = 0
    return min(max(size, 16 << 20), 128 << 20) if size > 0 else 32 << 20
