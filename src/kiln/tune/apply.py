"""Tuned schedules at compile time: ``Options(tuning_db=PATH)`` makes each generated kernel use
the schedule the tuner chose for its workload on this target: the fastest point of the
tuner's last confirmation (`kiln.tune.search`), where it ran `MARGIN` faster than the default
schedule timed beside it. Records never confirmed (a run stopped before its end) are not used.

    tuned = tuned_schedule(space, options)    # (decisions, record's median s) or None

Compiling never tunes and never fails because of the database: one that cannot be read is
one warning per process, and every kernel keeps its heuristic schedule.
"""

from __future__ import annotations

import dataclasses
import functools
import warnings
from typing import Any

from kiln.kernels.plan import KernelPlan
from kiln.kernels.plan_store import stored_plan
from kiln.options import Options
from kiln.tune.db import Target, TuningDB, TuningDBError, TuningRecord
from kiln.tune.space import Space, repair

__all__ = ["MARGIN", "TUNED", "Tuned", "beats_default", "faster_alone", "tuned_or_default",
           "tuned_schedule"]

TUNED = "tuned: the tuner's confirmed choice for this workload"  # in plan notes
# the fastest record replaces the default schedule only where it is this much faster than
# the default's record: timed again beside the default outside the tuner (benchmarks/tune.py
# --from-db: 9 interleaved rounds in one process; 8 models, Zen 3, 2 threads), 31 of the 104
# kernels whose best was not the default came out 0.2-10% slower than it: 14 of the 34 whose
# record was less than 3% faster, 17 of the 70 recorded faster by more
MARGIN = 0.03

Tuned = tuple[dict[str, Any], float]  # the decisions, and their measured median seconds


def tuned_schedule(space: Space, options: Options) -> Tuned | None:
    """The decisions the tuner chose for ``space``'s workload on this target, or None: no
    database, a workload never tuned to the end here, a choice that no longer fits the space,
    or a default that nothing beat (`beats_default`)."""
    if not options.tuning_db:
        return None
    db = _open(options.tuning_db)
    if db is None:
        return None
    try:
        chosen = db.chosen(space.workload(), _target(options))
    except TuningDBError as err:
        _warn_once(str(err))
        return None
    if chosen is None or repair(space, chosen.decisions) != chosen.decisions \
            or not beats_default(chosen, space.default()):
        return None
    return dict(chosen.decisions), chosen.median_s


def beats_default(record: TuningRecord, default: dict[str, Any]) -> bool:
    """Whether ``record`` replaces the default schedule (decisions ``default``): it is
    another point, the tuner's confirmation timed it `MARGIN` faster than the default, side
    by side (its paired ratio), and where it was checked in a model, the model ran faster
    with it (`kiln.tune.validate`)."""
    return faster_alone(record, default) and (record.in_model is None or record.in_model < 1)


def faster_alone(record: TuningRecord, default: dict[str, Any]) -> bool:
    """Whether the tuner's confirmation timed ``record`` `MARGIN` faster than the default
    schedule (decisions ``default``), side by side, each kernel on its own."""
    return record.decisions != default and record.paired is not None \
        and record.paired < 1 - MARGIN


def tuned_or_default(space: Any, options: Options) -> tuple[KernelPlan, dict[str, Any]]:
    """The plan of ``space``'s best recorded decisions where the database has them (its
    notes say so), else of its default point without recorded decisions (the untuned
    compile); and the decisions."""
    tuned = tuned_schedule(space, options)
    if tuned is None:
        decisions = space.default()
        return stored_plan(space, space.config(decisions), options), decisions
    plan = space.plan(tuned[0])
    notes = plan.notes + f"\n# {TUNED} (recorded median {tuned[1] * 1e6:.1f} us)"
    return dataclasses.replace(plan, notes=notes), tuned[0]


@functools.lru_cache(maxsize=8)
def _open(path: str) -> TuningDB | None:
    try:
        return TuningDB.open(path)
    except TuningDBError as err:
        _warn_once(str(err))
        return None


def _target(options: Options) -> Target:
    import torch

    return _target_for(options.c_compiler, options.c_flags, torch.get_num_threads())


@functools.lru_cache(maxsize=8)
def _target_for(compiler: str, flags: tuple[str, ...], threads: int) -> Target:
    return Target.here(Options(c_compiler=compiler, c_flags=flags), threads)


@functools.lru_cache(maxsize=32)
def _warn_once(message: str) -> None:
    warnings.warn(f"kiln: {message}; kernels keep their default schedules", RuntimeWarning,
                  stacklevel=4)
