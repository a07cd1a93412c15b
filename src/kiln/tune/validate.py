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
keeps a schedule only where it is below 1. A kernel too small for the check to see
(`MIN_SHARE`) keeps its confirmed choice unchecked.
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
# a kernel whose uses take less of the model's time than this is not checked (its choice
# stands as confirmed): two compiled instances of one model differ by about 1.5% on this
# project's machine (resnet50, identical builds, 400 alternated calls: 1.014), so the check
# cannot see it. HF BERT's add + layer norm (24 uses, 0.4% of the model) read 1.006 and its
# one add + add + layer norm (0.02%) 1.046, both noise.
MIN_SHARE = 0.02


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
    (`apply.faster_alone`) and whose uses take `MIN_SHARE` of the model's time or more, in
    ``model``, and store the result; returns the checks."""
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
        call_s = _call_s(lambda: base(*inputs))
        pairs = int(min(max(CHECK_S / (2 * call_s), PAIRS[0]), PAIRS[1]))
        small = [(w, c) for w, c in todo if _share(w, db, target, call_s) < MIN_SHARE]
        for w, chosen in small:  # (an earlier check of it, if any, was noise)
            db.checked_in_model(w.space.workload(), target, chosen.decisions, None)
        todo = [(w, c) for w, c in todo if (w, c) not in small]
        for i, (w, chosen) in enumerate(todo):
            if progress is not None:
                progress(i, w.label)
            # this workload's records only, without an earlier check's verdict: a schedule
            # dropped once must be in the model again to be checked again
            alone = TuningDB.open(Path(tmp) / f"{i}.sqlite")
            alone.add_many([dataclasses.replace(r, in_model=None)
                            for r in db.records(w.space.workload(), target)])
            tuned = kiln.compile(model, inputs, options=dataclasses.replace(
                options, tuning_db=str(alone.path)))
            ratios = alternated(lambda: base(*inputs), lambda f=tuned: f(*inputs), pairs)
            check = InModel(w, statistics.median(ratios), pairs, sum(r < 1 for r in ratios))
            db.checked_in_model(w.space.workload(), target, chosen.decisions, check.ratio)
            checks.append(check)
    return checks


def _call_s(call: Callable[[], object]) -> float:
    """One call's seconds, after an untimed one."""
    call()
    start = time.perf_counter()
    call()
    return max(time.perf_counter() - start, 1e-6)


def _share(w: KernelWorkload, db: TuningDB, target: Target, call_s: float) -> float:
    """The share of a model call its uses of the kernel take, at the default's time."""
    default = db.record(w.space.workload(), target, w.space.default())
    return len(w.nodes) * default.median_s / call_s if default is not None else 0.0
