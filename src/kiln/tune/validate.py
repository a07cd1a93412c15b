"""Tuned kernels checked in their model: a schedule faster on its own must make the model
faster, or a compile does not use it.

    checks = check_in_model(model, inputs, workloads, db, target, options)
    [(c.workload.label, c.ratio) for c in checks]   # model time with it / without

The tuner times each kernel on its own, over and over, so that its weights and inputs sit in
the caches. In the model they do not: resnet18's 512x7x7 3x3 convolutions read 9.4 MB of
weights each, and their confirmed 1.06x schedule ran 1.22-1.29x slower there; a producer's
new thread partition slowed the two library convolutions that read its output. So, after
tuning a model, each kernel's chosen schedule is compiled into the model alone (the other
kernels on their defaults), and the two builds' calls are alternated (`alternated`); the
median ratio goes into the database (`TuningDB.checked_in_model`), and `apply.beats_default`
keeps a schedule only where it is below 1.
"""

from __future__ import annotations

import dataclasses
import statistics
import tempfile
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

import torch

from kiln.cost.measure import alternated
from kiln.options import Options
from kiln.tune.apply import faster_alone
from kiln.tune.db import Target, TuningDB
from kiln.tune.workloads import KernelWorkload

__all__ = ["InModel", "check_in_model"]

CHECK_S = 8.0  # the alternated calls' time per kernel checked, at most
PAIRS = (40, 300)  # the fewest and the most pairs of calls per kernel checked


@dataclass(frozen=True)
class InModel:
    workload: KernelWorkload
    ratio: float  # the model's median time with the tuned schedule over without
    pairs: int
    faster_in: int  # pairs in which the model with it ran faster


def check_in_model(model: torch.nn.Module, inputs: tuple[torch.Tensor, ...],
                   workloads: Sequence[KernelWorkload], db: TuningDB, target: Target,
                   options: Options, progress: Callable[[int, str], None] | None = None
                   ) -> list[InModel]:
    """Check each workload whose chosen schedule beat its default on its own
    (`apply.faster_alone`) in ``model``, and store the result; returns the checks."""
    import kiln

    todo = []
    for w in workloads:
        chosen = db.chosen(w.space.workload(), target)
        if chosen is not None and faster_alone(chosen, w.space.default()):
            todo.append((w, chosen))
    if not todo:
        return []
    untuned = dataclasses.replace(options, tuning_db="")
    checks = []
    with torch.no_grad(), tempfile.TemporaryDirectory() as tmp:
        base = kiln.compile(model, inputs, options=untuned)
        pairs = _pairs(lambda: base(*inputs))
        for i, (w, chosen) in enumerate(todo):
            if progress is not None:
                progress(i, w.label)
            alone = TuningDB.open(Path(tmp) / f"{i}.sqlite")  # this workload's records only
            alone.add_many(db.records(w.space.workload(), target))
            tuned = kiln.compile(model, inputs, options=dataclasses.replace(
                options, tuning_db=str(alone.path)))
            ratios = alternated(lambda: base(*inputs), lambda f=tuned: f(*inputs), pairs)
            check = InModel(w, statistics.median(ratios), pairs, sum(r < 1 for r in ratios))
            db.checked_in_model(w.space.workload(), target, chosen.decisions, check.ratio)
            checks.append(check)
    return checks


def _pairs(call: Callable[[], object]) -> int:
    """As many pairs as fit in `CHECK_S`, within `PAIRS`."""
    call()
    start = time.perf_counter()
    call()
    each = max(time.perf_counter() - start, 1e-6)
    return int(min(max(CHECK_S / (2 * each), PAIRS[0]), PAIRS[1]))
