"""kiln.cost.measure: interleaved rounds, untimed calls, batching, failing contenders."""

from __future__ import annotations

import os
import time

from kiln.cost.measure import Budget, Timing, interleaved


def test_contenders_run_in_interleaved_rounds_with_untimed_calls_first() -> None:
    calls: list[str] = []
    budget = Budget(min_rounds=3, max_rounds=3, warmup=1, settle_calls=1)
    a, b = interleaved([lambda: calls.append("a"), lambda: calls.append("b")], budget)
    assert len(a.samples) == len(b.samples) == 3
    # a warm-up call each, then per round: a settle call and the timed call, a then b
    assert calls == ["a", "b"] + ["a", "a", "b", "b"] * 3


def test_a_sample_is_a_batch_long_enough_to_time() -> None:
    count = [0]

    def tiny() -> None:
        count[0] += 1
    (t,) = interleaved([tiny], Budget(min_rounds=2, max_rounds=2, min_sample_s=1e-3, warmup=0))
    assert count[0] > 2 * 16  # batched: many calls per sample
    assert 0 < t.median_s < 1e-3


def test_the_slower_contender_has_the_larger_median() -> None:
    fast, slow = interleaved([lambda: time.sleep(1e-4), lambda: time.sleep(2e-3)],
                             Budget(min_rounds=3, max_rounds=3))
    assert slow.median_s > 3 * fast.median_s
    assert fast.min_s <= fast.median_s <= fast.max_s


def test_a_contender_that_raises_leaves_the_race_with_its_error() -> None:
    rounds = [0]

    def flaky() -> None:
        rounds[0] += 1
        if rounds[0] > 2:
            raise RuntimeError("boom")
    ok, bad = interleaved([lambda: None, flaky], Budget(min_rounds=4, max_rounds=4))
    assert len(ok.samples) == 4 and isinstance(bad.error, RuntimeError)
    assert len(bad.samples) == 1  # the warm-up and one timed call, then it raised


def test_settled_stops_after_the_least_rounds_and_not_before() -> None:
    asked: list[int] = []

    def settled(timings: list) -> bool:
        asked.append(len(timings[0].samples))
        return True
    a, b = interleaved([lambda: None, lambda: None], Budget(min_rounds=3, max_rounds=9),
                       settled=settled)
    assert len(a.samples) == len(b.samples) == 3 and asked == [3]
    (c,) = interleaved([lambda: None], Budget(min_rounds=2, max_rounds=6),
                       settled=lambda timings: False)
    assert len(c.samples) == 6  # never settled: every round


def test_the_first_batch_is_guessed_from_the_untimed_call(monkeypatch) -> None:  # noqa: ANN001
    """A call of 0.2 ms and 2 ms samples: the batch starts near 10 calls, where doubling from
    one call would run 1 + 2 + 4 + 8 + 16 of them before the first sample. On a clock each
    call moves by exactly 0.2 ms: a real sleep of 0.2 ms took up to 0.6 ms on a busy VM, and
    the guess (rightly) fell short (36 calls)."""
    from kiln.cost import measure

    clock, count = [0.0], [0]
    monkeypatch.setattr(measure.time, "perf_counter", lambda: clock[0])

    def call() -> None:
        count[0] += 1
        clock[0] += 2e-4
    interleaved([call], Budget(min_rounds=1, max_rounds=1, min_sample_s=2e-3, warmup=1))
    assert count[0] <= 1 + 2 * 10 + 10  # the warm-up, at most two sizing batches, the sample


def test_before_sample_runs_untimed_before_every_sample() -> None:
    calls: list[str] = []
    interleaved([lambda: calls.append("a"), lambda: calls.append("b")],
                Budget(min_rounds=2, max_rounds=2, warmup=1, settle_calls=1),
                before_sample=lambda: calls.append("flush"))
    # warm-ups, then per round and contender: its settle call, the flush, the timed call
    assert calls == ["a", "b"] + ["a", "flush", "a", "b", "flush", "b"] * 2


def test_the_quiet_pause_comes_before_each_contenders_settle_call(monkeypatch) -> None:  # noqa: ANN001
    """The pause lets the previous contender's spinning threads sleep before this one's
    untimed call wakes its own pool."""
    from kiln.cost import measure

    calls: list[str] = []
    monkeypatch.setattr(measure.time, "sleep", lambda s: calls.append(f"sleep {s}"))
    interleaved([lambda: calls.append("a"), lambda: calls.append("b")],
                Budget(min_rounds=2, max_rounds=2, warmup=1, settle_calls=1, quiet_s=0.02))
    assert calls == ["a", "b"] + ["sleep 0.02", "a", "a", "sleep 0.02", "b", "b"] * 2


def test_a_timing_is_steady_when_its_spread_is_small() -> None:

    assert Timing([1.0, 1.1, 1.2]).steady()
    assert not Timing([1.0, 1.1, 2.0]).steady()  # spread 1.0 > 0.5 x median 1.1
    assert Timing([1.0, 1.1, 2.0]).steady(1.0)
    assert not Timing().steady()


def test_a_timing_whose_threads_waited_for_a_cpu_is_not_steady() -> None:
    """Close samples under a steady load still say the machine was shared: not steady
    where the threads waited more than `WAITED_MAX` of the time; unknown waiting (no
    /proc) leaves the samples to decide."""
    assert Timing([1.0, 1.1, 1.2], waited=0.01).steady()
    assert not Timing([1.0, 1.1, 1.2], waited=0.3).steady()
    assert Timing([1.0, 1.1, 1.2], waited=None).steady()


def test_interleaved_records_how_long_its_threads_waited() -> None:
    timings = interleaved([lambda: sum(range(1000))], Budget(min_rounds=3))
    if not os.path.isdir("/proc/self/task"):
        assert timings[0].waited is None
    else:
        assert timings[0].waited is not None and timings[0].waited >= 0


def test_a_long_call_is_a_sample_alone_without_a_trial_batch_or_settle_call() -> None:
    """A call of 12 ms against 2 ms samples, settle calls only below 5 ms: the warm-up and
    one call a round; the short contender keeps its settle calls and its batches."""
    calls: list[str] = []

    def long() -> None:
        calls.append("long")
        time.sleep(12e-3)

    def short() -> None:
        calls.append("short")
    budget = Budget(min_rounds=2, max_rounds=2, min_sample_s=2e-3, warmup=1, settle_calls=1,
                    settle_below_s=5e-3)
    slow, fast = interleaved([long, short], budget)
    assert calls.count("long") == 1 + 2 and len(slow.samples) == 2
    assert slow.median_s >= 12e-3
    assert calls.count("short") > 1 + 2 * 2 * 16  # batched, with a settle call a round
    assert fast.median_s < 1e-3


def test_alternated_calls_take_turns_going_first_and_give_b_over_a() -> None:
    from kiln.cost.measure import alternated

    calls: list[str] = []

    def a() -> None:
        calls.append("a")
        time.sleep(0.001)

    def b() -> None:
        calls.append("b")
        time.sleep(0.003)
    ratios = alternated(a, b, 6)
    assert calls == ["a", "b"] + ["a", "b", "b", "a"] * 3  # an untimed call each first
    assert len(ratios) == 6 and all(r > 1.5 for r in ratios)  # b's time over a's, each pair
