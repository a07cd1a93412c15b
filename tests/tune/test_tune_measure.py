"""The tuner's builder and runner: real candidates are checked and timed; a candidate that
crashes or hangs comes back as a failure and the runner goes on."""

from __future__ import annotations

import os
import signal
import time
from dataclasses import dataclass

import pytest

from kiln.codegen.build import CompilerUnavailable, toolchain
from kiln.options import Options
from kiln.tune.measure import Builder, Runner
from kiln.tune.space import GemmSpace, neighbours


@pytest.fixture
def options(tmp_path) -> Options:
    opts = Options(kernel_cache_dir=str(tmp_path / "kernels"))
    if isinstance(toolchain(opts), CompilerUnavailable):
        pytest.skip("no C compiler")
    return opts


@dataclass(frozen=True)
class Misbehaving:
    """A space whose candidates crash their process or hang, as a bad kernel would."""

    how: str
    kind: str = "test"

    def plan(self, decisions):  # noqa: ANN001, ANN201
        if self.how == "crash":
            os.kill(os.getpid(), signal.SIGSEGV)
        time.sleep(60)


def test_candidates_build_in_parallel_and_are_checked_and_timed(options: Options) -> None:
    space = GemmSpace.for_shape(33, 70, 129, b_prepacked=True, bias=True)
    points = [space.default(), *list(neighbours(space, space.default()))[:2]]
    assert Builder(options, jobs=2).build(space, points) == ["", "", ""]
    with Runner(options, timeout_s=60, threads=1, budget_s=0.2) as runner:
        results = runner.run(space, points)
    for point, result in zip(points, results):
        assert result.ok, result.error
        assert result.decisions == point and len(result.run_times) >= 5
        assert all(t > 0 for t in result.run_times) and "kiln_" in result.source


def _worker_pids(builder: Builder) -> set[int]:
    return set(builder._pool._processes) if builder._pool is not None else set()


def test_the_builders_processes_serve_every_batch_and_a_crash_replaces_them(
        options: Options) -> None:
    space = GemmSpace.for_shape(16, 32, 8)
    points = [space.default(), *list(neighbours(space, space.default()))[:3]]
    with Builder(options, jobs=2) as builder:
        assert builder.build(space, points[:2]) == ["", ""]
        first = _worker_pids(builder)
        assert builder.build(space, points[2:]) == ["", ""]
        assert _worker_pids(builder) == first and len(first) == 2  # not spawned again
        crashed = builder.build(Misbehaving("crash"), [{}, {}])
        assert all(e.startswith("build: BrokenProcessPool") for e in crashed), crashed
        assert builder.build(space, points[:2]) == ["", ""]  # a new pool
        assert _worker_pids(builder).isdisjoint(first)
    assert builder._pool is None


def test_the_builders_processes_extract_the_same_features_as_this_one(options: Options) -> None:
    from kiln.tune.features import features

    space = GemmSpace.for_shape(33, 70, 129, b_prepacked=True, bias=True)
    points = [space.default(), *list(neighbours(space, space.default()))[:4]]
    here = [tuple(features(space.plan(p).build())) for p in points]
    with Builder(options, jobs=2) as builder:
        assert builder.features(space, points) == here
        assert len(_worker_pids(builder)) == 2


def test_built_candidates_are_timed_again_side_by_side(options: Options) -> None:
    space = GemmSpace.for_shape(33, 70, 129, b_prepacked=True, bias=True)
    points = [space.default(), *list(neighbours(space, space.default()))[:2]]
    Builder(options, jobs=2).build(space, points)
    with Runner(options, timeout_s=60, threads=1) as runner:
        times = runner.run_together(space, points)
    assert [len(t) for t in times] == [7, 7, 7] and all(x > 0 for t in times for x in t)
    with Runner(options, timeout_s=5, threads=1) as runner:  # a hang: nothing comes back
        assert runner.run_together(Misbehaving("hang"), [{}]) == [()]


def test_a_crash_or_a_hang_is_a_failed_result_and_the_runner_goes_on(options: Options) -> None:
    good = GemmSpace.for_shape(16, 32, 8)
    with Runner(options, timeout_s=5, threads=1, budget_s=0.1) as runner:
        crashed = runner.run_one(Misbehaving("crash"), {})
        hung = runner.run_one(Misbehaving("hang"), {})
        after = runner.run_one(good, good.default())
    assert crashed.error is not None and crashed.error.startswith("crash")
    assert hung.error is not None and hung.error.startswith("timeout")
    assert after.ok, after.error


def test_the_timeout_counts_the_candidate_not_the_workers_start(options: Options) -> None:
    # a spawned worker imports torch and kiln first (seconds): a short timeout still serves
    good = GemmSpace.for_shape(16, 32, 8)
    assert Builder(options, jobs=1).build(good, [good.default()]) == [""]
    with Runner(options, timeout_s=2, threads=1, budget_s=0.05) as runner:
        result = runner.run_one(good, good.default())
    assert result.ok, result.error


def test_a_kernel_whose_weights_stream_is_timed_cold_and_filed_apart(options: Options,
                                                                     monkeypatch) -> None:
    """`GemmSpace.streamed` (`kiln.kernels.streaming`): one call per sample, the caches
    evicted before each, as the compile's decision times it; its records get a key of their
    own, so hot and cold times of one kernel never mix."""
    import dataclasses

    from kiln.cost import measure as cost_measure
    from kiln.tune.measure import time_one, time_together
    from kiln.tune.space import STREAMED

    hot = GemmSpace.for_shape(33, 70, 129, b_prepacked=True, bias=True)
    cold = dataclasses.replace(hot, streamed=True)
    assert cold.workload() == hot.workload() + STREAMED
    evictions: list[int] = []
    monkeypatch.setattr(cost_measure, "evict_caches", lambda: evictions.append(1))
    warm = time_one(hot, hot.default(), options, 1, 0.2)
    assert warm.ok and not evictions
    result = time_one(cold, cold.default(), options, 1, 0.2)
    assert result.ok and len(evictions) == len(result.run_times) >= 5  # one per sample
    evictions.clear()
    times = time_together(cold, [cold.default(), cold.default()], options, 1, rounds=3)
    assert [len(t) for t in times] == [3, 3] and len(evictions) == 6
