"""Evolutionary search over a design space, guided by the learned cost model.

    result = tune_kernel(space, session, TuneSettings(trials=64))

Each round, as MetaSchedule's evolutionary search does: a population is seeded from the
best measured points of this workload, the best records of other workloads of the same kind
on this target (moved into this space: similar kernels tune alike), the heuristic default,
and random points; it evolves for a few generations by one-decision mutations, ranked by the
cost model; the best unmeasured points (and, with probability ε each, a random one instead)
are built in parallel, timed, stored in the database, and the model is trained again on every
record of this target. The rounds end after ``trials`` candidates, or (with ``patience``) once
that many in a row found nothing 1% faster than the best. The heuristic default is always
measured first, so the best found is never slower than it. The picks are random until the
model has learned from `MIN_KIND_RECORDS` records of the space's kind (GEMMs, row kernels,
...): what one kind's decisions do says nothing of another's.

At the end, the default and the fastest candidates are timed again side by side in one
process, round by round, and each one's median ratio to the default in the same round goes
into the database (`_confirm`): a compile picks only a candidate that beat the default there,
by `apply.MARGIN` at least.

A run can stop at any point and start again: what was measured is in the database, and a new
run skips every point already there.
"""

from __future__ import annotations

import dataclasses
import json
import math
import random
import statistics
import time
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from kiln.options import Options
from kiln.tune.apply import beats_default
from kiln.tune.db import Target, TuningDB, TuningRecord
from kiln.tune.features import features
from kiln.tune.measure import Builder, MeasureResult, Runner
from kiln.tune.model import MIN_RECORDS, CostModel, Measured
from kiln.tune.space import Decisions, Space, neighbours, random_point, repair

__all__ = ["MIN_KIND_RECORDS", "Session", "TuneResult", "TuneSettings", "space_workload",
           "tune_kernel"]

# records of a kind the model must have learned from before it picks that kind's candidates
# (as many as it needs to be trained at all): in a run that tuned BERT's layer norm first, a
# model trained on its 8 records chose the first bmm's candidates, and found 188 us where
# random picks found 165 in the same trials
MIN_KIND_RECORDS = MIN_RECORDS


@dataclass(frozen=True)
class TuneSettings:
    trials: int = 64  # candidates measured per kernel (the default included)
    batch: int = 8  # candidates built and timed between model updates
    population: int = 32
    generations: int = 2
    epsilon: float = 0.05  # chance that a pick is a random point instead of the model's
    use_model: bool = True  # False: random search (the baseline the model must beat)
    time_budget_s: float = math.inf  # per kernel
    seed: int = 0
    # stop once this many candidates in a row found no time `IMPROVES` faster than the best
    # so far (0: never; `kiln tune` stops after 16): most kernels' best comes early, or the
    # default is best (MobileNetV2, 32 kernels at 32 trials: 20 minutes)
    patience: int = 0
    # count the database's records of this workload (on this target) as trials done: a
    # stopped run goes on where it stopped, and a kernel another model shares (BERT's and
    # HF BERT's) is tuned once; False: measure ``trials`` more whatever is recorded
    trials_include_records: bool = False


IMPROVES = 0.99  # a new best below this fraction of the old one resets the patience


@dataclass
class Session:
    """What one tuning run shares across kernels: the database, the target, the builder and
    runner, and the cost model (saved next to the database)."""

    db: TuningDB
    target: Target
    builder: Any  # Builder, or a RayRunner
    runner: Any  # Runner, or a RayRunner
    model: CostModel
    model_path: Path | None = None
    learned: dict[str, int] = field(default_factory=dict)  # the model's records, by kind

    @staticmethod
    def open(db_path: str | Path, options: Options, jobs: int = 2, timeout_s: float = 30.0,
             ray: str | None = None) -> Session:
        """``ray``: a Ray cluster's address ("auto": the one this machine belongs to;
        "local": a cluster of this machine's cores, started here) to build and measure on,
        instead of local worker processes."""
        db = TuningDB.open(db_path)
        model_path = Path(f"{db_path}.model.txt")
        target = Target.here(options)
        if ray:
            from kiln.tune.ray_runner import RayRunner

            remote = RayRunner(options, None if ray == "local" else ray, timeout_s,
                               threads=target.threads)
            return Session(db, target, remote, remote, CostModel.load_or_new(model_path),
                           model_path)
        return Session(db, target, Builder(options, jobs), Runner(options, timeout_s),
                       CostModel.load_or_new(model_path), model_path)

    def close(self) -> None:
        self.runner._stop()
        if self.builder is not self.runner:  # (a RayRunner is both)
            self.builder.close()

    def retrain(self) -> None:
        on_target = [r for r in self.db.on_target(self.target) if r.features]
        self.model.fit([Measured(r.workload, r.features, r.median_s) for r in on_target])
        self.learned = {}
        for r in on_target:
            self.learned[r.kind] = self.learned.get(r.kind, 0) + 1
        if self.model_path is not None:
            self.model.save(self.model_path)


@dataclass
class TuneResult:
    workload: str
    default_s: float  # median seconds of the heuristic schedule
    best_s: float
    best: Decisions
    measured: int  # candidates measured in this run
    failed: int
    history: list[tuple[int, float]] = field(default_factory=list)  # (trials, best so far)

    @property
    def speedup(self) -> float:
        return self.default_s / self.best_s if self.best_s > 0 else math.nan


def space_workload(space: Space) -> str:
    """The key a space's records are filed under (with the target)."""
    return space.workload()


def tune_kernel(space: Space, session: Session, settings: TuneSettings = TuneSettings(),
                progress: Callable[[TuneResult], None] | None = None) -> TuneResult:
    rng = random.Random(settings.seed)
    workload = space_workload(space)
    known = {_key(r.decisions): r for r in session.db.records(workload, session.target)}
    tried = set(known)  # measured anywhere (a Ray worker may be another machine)
    feature_cache: dict[str, tuple[float, ...]] = {}
    result = TuneResult(workload, math.inf, math.inf, space.default(), 0, 0)
    start = time.perf_counter()

    def measure(points: list[Decisions]) -> None:
        errors = session.builder.build(space, points)
        for point, error in zip(points, errors):
            outcome = MeasureResult(point, error=error) if error else \
                session.runner.run_one(space, point)
            where = session.target if outcome.target in (None, session.target.key()) \
                else Target.from_key(outcome.target)
            record = _record(space, workload, where, point, outcome,
                             _features(space, point, feature_cache))
            session.db.add(record)  # filed under the target it ran on: never mixed
            tried.add(_key(point))
            if where == session.target:
                known[_key(point)] = record
            result.measured += 1
            result.failed += not record.ok
            _update(result, known, space)
            if progress is not None:
                progress(result)

    if settings.use_model and not session.learned:
        session.retrain()  # records of other workloads guide this one's first picks
    trials = settings.trials - (len(known) if settings.trials_include_records else 0)
    if _key(space.default()) not in known:
        measure([space.default()])
    _update(result, known, space)
    # (the patience counts earlier runs' records too: a resumed run goes on where it was)
    while (result.measured < trials
           and time.perf_counter() - start < settings.time_budget_s
           and not (settings.patience and _stale(known.values()) >= settings.patience)):
        picks = _next_batch(space, session, settings, known, tried, feature_cache, rng)
        if not picks:  # every point drawn was measured already: a small space, exhausted
            break
        measure(picks[: trials - result.measured])
        if settings.use_model:
            session.retrain()
    # (a workload tuned to the full count and confirmed already: nothing new to time)
    if result.measured or not any(r.paired is not None for r in known.values()):
        _confirm(space, session, workload, known, result)
    return result


CONFIRMED = 4  # the default and the fastest candidates, timed again together at the end
CONFIRM_ROUNDS = 21  # rounds of each of the confirmation's two passes


def _stale(records: Iterable[TuningRecord]) -> int:
    """How many records (oldest first) came after the last one `IMPROVES` faster than all
    before it: the patience a run has used up. The first record (the default, in a run that
    started the workload) is where the search starts, not a candidate that failed it."""
    best, stale = math.inf, 0
    for record in records:
        if record.median_s < best * IMPROVES or best == math.inf:
            stale = 0
        else:
            stale += 1
        best = min(best, record.median_s)
    return stale


def _confirm(space: Space, session: Session, workload: str,
             known: dict[str, TuningRecord], result: TuneResult) -> None:
    """Time the default and the fastest other candidates again, side by side in one process
    (`Runner.run_together`, twice, in opposite orders), and store each one's paired ratio to
    the default: the median, over the rounds, of its time over the default's in the same
    round (`TuningDB.confirm`). A compile uses only that: each candidate was timed alone,
    minutes apart, and this machine's speed drifts by 10% and more within seconds, so the
    fastest of 32 lone timings is often one taken in a fast moment. Chosen by those lone
    timings, after a confirmation of 7 rounds that compared per-point medians, resnet18's
    tuned kernels ran 2.4% slower than the defaults in the model (400 alternated calls).
    (A runner without run_together confirms nothing: a compile keeps the default
    schedules.)"""
    together = getattr(session.runner, "run_together", None)
    default = known.get(_key(space.default()))
    ran = sorted((r for r in known.values() if r.ok and r is not default),
                 key=lambda r: r.median_s)[: CONFIRMED - 1]
    if together is None or default is None or not default.ok:
        return
    records = [default, *ran]
    points = [r.decisions for r in records]
    first = together(space, points, CONFIRM_ROUNDS)
    second = together(space, points[::-1], CONFIRM_ROUNDS)[::-1]
    if not first[0] or not second[0]:  # the default did not run: nothing to compare with
        return
    timed = []
    for record, a, b in zip(records, first, second):
        ratios = [x / d for x, d in zip(a, first[0])] + [x / d for x, d in zip(b, second[0])]
        if ratios:  # (a point that no longer runs keeps no place in the confirmation)
            timed.append((record.decisions, (*a, *b), statistics.median(ratios)))
    session.db.confirm(workload, session.target, timed)
    for decisions, times, paired in timed:
        record = known[_key(decisions)]
        known[_key(decisions)] = dataclasses.replace(record, run_times=tuple(times),
                                                     paired=paired)
    _update(result, known, space)


def refresh(result: TuneResult, space: Space, session: Session) -> None:
    """``result``'s best as the database now says (after `kiln.tune.validate`'s checks)."""
    records = session.db.records(result.workload, session.target)
    _update(result, {_key(r.decisions): r for r in records}, space)


def _update(result: TuneResult, known: Mapping[str, TuningRecord], space: Space) -> None:
    """The default's time, and the best: once confirmed, what a compile would choose
    (`apply.beats_default`), at the default's time times its paired ratio; before, the
    fastest record, as the search's progress."""
    default = known.get(_key(space.default()))
    if default is not None:
        result.default_s = default.median_s
    confirmed = [r for r in known.values() if r.ok and r.paired is not None]
    if confirmed and default is not None:
        best = min(confirmed, key=lambda r: r.paired or 1.0)
        chosen = best if beats_default(best, space.default()) else default
        result.best_s, result.best = default.median_s * (chosen.paired or 1.0), \
            dict(chosen.decisions)
    else:
        best = min(known.values(), key=lambda r: r.median_s, default=None)
        if best is not None and best.ok:
            result.best_s, result.best = best.median_s, dict(best.decisions)
    result.history.append((result.measured, result.best_s))


def _next_batch(space: Space, session: Session, settings: TuneSettings,
                known: Mapping[str, TuningRecord], tried: set[str],
                cache: dict[str, tuple[float, ...]], rng: random.Random) -> list[Decisions]:
    if not (settings.use_model and session.model.trained
            and session.learned.get(getattr(space, "kind", ""), 0) >= MIN_KIND_RECORDS):
        return _fresh([random_point(space, rng) for _ in range(4 * settings.batch)], tried,
                      settings.batch)
    population = _seeds(space, session, known, settings, rng)
    for _ in range(settings.generations):
        scores = _scores(space, session, population, cache)
        ranked = [p for _, p in sorted(zip(scores, range(len(population))), reverse=True)]
        parents = [population[i] for i in ranked[: max(len(population) // 2, 1)]]
        children = [_mutate(space, rng.choice(parents), rng) for _ in range(len(parents))]
        population = _unique(parents + children)
    scores = _scores(space, session, population, cache)
    ranked = [population[i] for _, i in sorted(zip(scores, range(len(population))),
                                               reverse=True)]
    picks: list[Decisions] = []
    for point in _fresh(ranked, tried, len(ranked)):
        if rng.random() < settings.epsilon:
            point = random_point(space, rng)
        if _key(point) not in tried and point not in picks:
            picks.append(point)
        if len(picks) == settings.batch:
            break
    return picks


def _seeds(space: Space, session: Session, known: Mapping[str, TuningRecord],
           settings: TuneSettings, rng: random.Random) -> list[Decisions]:
    ran = sorted((r for r in known.values() if r.ok), key=lambda r: r.median_s)
    seeds = [dict(r.decisions) for r in ran[: settings.population // 4]]
    seeds += [repair(space, r.decisions) for r in
              session.db.top(session.target, getattr(space, "kind", ""),
                             settings.population // 4)]
    seeds.append(space.default())
    while len(seeds) < settings.population:
        seeds.append(random_point(space, rng))
    return _unique(seeds)


def _mutate(space: Space, point: Decisions, rng: random.Random) -> Decisions:
    options = list(neighbours(space, point))
    return rng.choice(options) if options else dict(point)


def _scores(space: Space, session: Session, points: list[Decisions],
            cache: dict[str, tuple[float, ...]]) -> list[float]:
    """The cost model's scores; the features not cached yet are extracted by the builder's
    processes where it has them (`Builder.features`: each needs the point's program built,
    which took half of a ResNet-50 run in this process alone)."""
    extract = getattr(session.builder, "features", None)
    missing = list({_key(p): p for p in points if _key(p) not in cache}.values())
    if extract is not None and len(missing) > 1:
        for point, feats in zip(missing, extract(space, missing)):
            cache[_key(point)] = feats
    return session.model.predict([_features(space, p, cache) for p in points])


def _features(space: Space, point: Decisions, cache: dict[str, tuple[float, ...]]
              ) -> tuple[float, ...]:
    key = _key(point)
    if key not in cache:
        cache[key] = tuple(features(space.plan(point).build()))
    return cache[key]


def _record(space: Space, workload: str, target: Target, point: Decisions,
            outcome: MeasureResult, feats: tuple[float, ...]) -> TuningRecord:
    trace = space.plan(point).trace.to_json()
    kind = getattr(space, "kind", "kernel")
    if outcome.ok:
        return TuningRecord.measured(workload, target, kind, trace, point, outcome.run_times,
                                     feats)
    return TuningRecord.failed(workload, target, kind, trace, point,
                               outcome.error or "no times", feats)


def _fresh(points: list[Decisions], tried: set[str], count: int) -> list[Decisions]:
    out: list[Decisions] = []
    seen = set(tried)
    for p in points:
        if _key(p) not in seen:
            seen.add(_key(p))
            out.append(p)
        if len(out) == count:
            break
    return out


def _unique(points: list[Decisions]) -> list[Decisions]:
    seen: dict[str, Decisions] = {}
    for p in points:
        seen.setdefault(_key(p), p)
    return list(seen.values())


def _key(point: Mapping[str, Any]) -> str:
    return json.dumps(dict(point), sort_keys=True)
