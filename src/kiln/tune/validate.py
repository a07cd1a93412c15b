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
import json
import math
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
from kiln.tune.db import Target, TuningDB, TuningRecord
from kiln.tune.workloads import KernelWorkload

__all__ = ["InModel", "ModelCheck", "check_in_model"]

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


class ModelCheck:
    """A model's untuned build, which each tuned schedule's build is timed against, and what
    one check costs here: `kiln tune` keeps that time for the checks inside its budget.

        check = ModelCheck(model, inputs, options)
        check.cost_s()                      # a compile plus the calls of one check
        check.wanted(w, db, target)         # whether w's chosen schedule needs a check
        check.run(workloads, db, target, deadline=time.perf_counter() + 60)

    The check compiles the untuned build anew, beside the tuned ones: one compiled before
    the tuning ran 1.14x slower than one compiled after it (the zoo's BERT, 60 alternated
    calls; why is not known: 20 forks of this process between two builds changed nothing,
    1.002), and the checks against it read 0.51-0.56 for three schedules with which, all
    together, the model ran 0.965 of its untuned time (200 alternated calls, both built
    anew). The costs come from a first untuned build, made on first use and not kept (a
    model none of whose schedules needs a check costs no compile)."""

    def __init__(self, model: torch.nn.Module, inputs: tuple[torch.Tensor, ...],
                 options: Options) -> None:
        self.model, self.inputs, self.options = model, inputs, options
        # a compile of the model: the last untuned build's, or the last check's (which finds
        # the other kernels in the kernel cache, where the first build may not have)
        self.compile_s = 0.0
        self.call_s = 0.0  # one call of the untuned build

    def untuned(self) -> Callable[..., object]:
        """A new untuned build; its compile and one call set `compile_s` and `call_s`."""
        start = time.perf_counter()
        with torch.no_grad():
            build = _compile(self.model, self.inputs,
                             dataclasses.replace(self.options, tuning_db=""))
            self.compile_s = time.perf_counter() - start
            self.call_s = _call_s(lambda: build(*self.inputs))
        return build

    def _timed(self) -> None:
        if not self.call_s:
            self.untuned()

    def pairs(self, seconds: float = CHECK_S) -> int:
        """Pairs of calls that take about ``seconds``, within `PAIRS`."""
        self._timed()
        return int(min(max(seconds / (2 * self.call_s), PAIRS[0]), PAIRS[1]))

    def cost_s(self) -> float:
        """One check at its full size: the tuned build's compile and `CHECK_S` of calls (or
        `PAIRS`' bounds on them)."""
        return self.compile_s + 2 * self.pairs() * self.call_s

    def share(self, w: KernelWorkload, db: TuningDB, target: Target) -> float:
        """The share of a model call its uses of the kernel take, at the default's time."""
        self._timed()
        default = db.record(w.space.workload(), target, w.space.default())
        return len(w.nodes) * default.median_s / self.call_s if default is not None else 0.0

    def wanted(self, w: KernelWorkload, db: TuningDB, target: Target) -> bool:
        """Whether ``w``'s chosen schedule beat its default on its own (`apply.faster_alone`)
        and its uses take `MIN_SHARE` of the model's time or more."""
        return _faster_alone(w, db, target) is not None \
            and self.share(w, db, target) >= MIN_SHARE

    def run(self, workloads: Sequence[KernelWorkload], db: TuningDB, target: Target,
            deadline: float = math.inf,
            progress: Callable[[int, str], None] | None = None,
            worst: dict[tuple[str, str], float] | None = None) -> list[InModel]:
        """Check each workload that is `wanted`, store the results and return them. The
        checks share what is left until ``deadline`` (`time.perf_counter`) evenly, each
        within `PAIRS`: a check never takes fewer than `PAIRS`[0] pairs, so a deadline too
        near for that is passed. ``worst``: each schedule's highest ratio in the models
        checked before (by workload and decisions), updated here; the database gets the
        higher of that and this model's, so that a kernel two models share (BERT's and HF
        BERT's) keeps a schedule only where it slowed neither."""
        todo = [(w, chosen) for w in workloads
                if (chosen := _faster_alone(w, db, target)) is not None]
        if not todo:
            return []
        base = self.untuned()
        small = [(w, c) for w, c in todo if self.share(w, db, target) < MIN_SHARE]
        for w, chosen in small:  # too small to see: an earlier check of it, if any, was noise
            db.checked_in_model(w.space.workload(), target, chosen.decisions, None)
        todo = [wc for wc in todo if wc not in small]
        checks = []
        with torch.no_grad(), tempfile.TemporaryDirectory() as tmp:
            for i, (w, chosen) in enumerate(todo):
                if progress is not None:
                    progress(i, w.label)
                each_s = (deadline - time.perf_counter()) / (len(todo) - i) - self.compile_s
                # this workload's records only, without an earlier check's verdict: a
                # schedule dropped once must be in the model again to be checked again
                alone = TuningDB.open(Path(tmp) / f"{i}.sqlite")
                alone.add_many([dataclasses.replace(r, in_model=None)
                                for r in db.records(w.space.workload(), target)])
                start = time.perf_counter()
                tuned = _compile(self.model, self.inputs, dataclasses.replace(
                    self.options, tuning_db=str(alone.path)))
                self.compile_s = time.perf_counter() - start
                pairs = self.pairs(min(CHECK_S, each_s))
                ratios = alternated(lambda: base(*self.inputs),
                                    lambda f=tuned: f(*self.inputs), pairs)
                check = InModel(w, statistics.median(ratios), pairs, sum(r < 1 for r in ratios))
                ratio = check.ratio
                if worst is not None:  # (the schedule, whichever model checked it)
                    key = (w.space.workload(), json.dumps(chosen.decisions, sort_keys=True))
                    ratio = worst[key] = max(worst.get(key, 0.0), check.ratio)
                db.checked_in_model(w.space.workload(), target, chosen.decisions, ratio)
                checks.append(check)
        return checks


def check_in_model(model: torch.nn.Module, inputs: tuple[torch.Tensor, ...],
                   workloads: Sequence[KernelWorkload], db: TuningDB, target: Target,
                   options: Options, progress: Callable[[int, str], None] | None = None
                   ) -> list[InModel]:
    """`ModelCheck.run` without a deadline."""
    return ModelCheck(model, inputs, options).run(workloads, db, target, progress=progress)


def _compile(model: torch.nn.Module, inputs: tuple[torch.Tensor, ...],
             options: Options) -> Callable[..., object]:
    import kiln

    return kiln.compile(model, inputs, options=options)


def _faster_alone(w: KernelWorkload, db: TuningDB, target: Target) -> TuningRecord | None:
    """``w``'s chosen record where it beat the default on its own (`apply.faster_alone`)."""
    chosen = db.chosen(w.space.workload(), target)
    return chosen if chosen is not None and faster_alone(chosen, w.space.default()) else None


def _call_s(call: Callable[[], object]) -> float:
    """One call's seconds, after an untimed one."""
    call()
    start = time.perf_counter()
    call()
    return max(time.perf_counter() - start, 1e-6)
