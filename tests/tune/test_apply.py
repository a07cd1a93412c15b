"""Options(tuning_db=...): a compile uses the tuner's confirmed choice for each workload on
this target, says so in the report, and never fails because of the database."""

from __future__ import annotations

import json
import time
from pathlib import Path

import pytest
import torch

import kiln
from kiln import models
from kiln.tune.db import Target, TuningDB, TuningRecord
from kiln.tune.search import space_workload
from kiln.tune.space import neighbours
from kiln.tune.workloads import model_workloads


def test_a_compile_uses_the_recorded_schedule(tmp_path: Path, options: kiln.Options) -> None:
    model, inputs = models.build("mlp", quick=True)
    workload = model_workloads(model, inputs, options)[0]
    space = workload.space
    point = list(neighbours(space, space.default()))[-1]  # not the heuristic's choice
    target = Target.here(options, torch.get_num_threads())
    db = TuningDB.open(tmp_path / "t.sqlite")
    db.add(TuningRecord.measured(space_workload(space), target, "gemm",
                                 space.plan(point).trace.to_json(), point, [1e-6],
                                 paired=0.5))  # (confirmed: timed beside the default)
    db.add(TuningRecord.measured(space_workload(space), target, "gemm", "[]",
                                 space.default(), [2e-6], paired=1.0))
    tuned = kiln.Options(**{**options.__dict__, "tuning_db": str(tmp_path / "t.sqlite")})
    with torch.no_grad():
        compiled = kiln.compile(model, inputs, options=tuned)
        torch.testing.assert_close(compiled(*inputs), model(*inputs), rtol=1e-4, atol=1e-5)
    kernels = [k for k in compiled.report.kernels if k.nodes and k.nodes[-1] in workload.nodes]
    assert kernels and all(k.decision.startswith("generated (tuned)") for k in kernels)
    recorded = [f"sch.sample_categorical({name!r}, " for name in point]
    assert all(line in kernels[0].trace for line in recorded)
    assert f"decision={json.dumps(point['mr'])})" in kernels[0].trace
    others = [k for k in compiled.report.kernels if k.kind == "generated" and k not in kernels]
    assert all("tuned" not in k.decision for k in others)  # no record: the heuristic


def _confirmed(tmp_path: Path, space, target: Target, point: dict, default_s: float,  # noqa: ANN001
               point_s: float, paired: float | None) -> TuningDB:
    """A database holding the default's record and ``point``'s, as a confirmation leaves
    them (``paired``: the point's ratio to the default; None: never confirmed)."""
    db = TuningDB.open(tmp_path / "t.sqlite")
    db.add(TuningRecord.measured(space_workload(space), target, "gemm", "[]",
                                 space.default(), [default_s], paired=1.0))
    db.add(TuningRecord.measured(space_workload(space), target, "gemm",
                                 space.plan(point).trace.to_json(), point, [point_s],
                                 paired=paired))
    return db


@pytest.mark.parametrize("faster, paired, tuned", [(0.99, 0.99, False), (0.96, 0.96, True),
                                                   (0.5, None, False), (0.5, 1.02, False)])
def test_a_record_replaces_the_default_only_where_it_was_confirmed_clearly_faster(
        tmp_path: Path, options: kiln.Options, faster: float, paired: float | None,
        tuned: bool) -> None:
    """Clearly: by the margin. Confirmed: timed side by side with the default (its paired
    ratio); a record timed alone (None) or slower beside the default (1.02) is not used,
    however fast its own time."""
    from kiln.tune.apply import MARGIN, tuned_schedule

    assert 1 - faster != MARGIN
    model, inputs = models.build("mlp", quick=True)
    space = model_workloads(model, inputs, options)[0].space
    point = list(neighbours(space, space.default()))[-1]
    target = Target.here(options, torch.get_num_threads())
    _confirmed(tmp_path, space, target, point, 100e-6, faster * 100e-6, paired)
    chosen = tuned_schedule(space, kiln.Options(**{**options.__dict__,
                                                   "tuning_db": str(tmp_path / "t.sqlite")}))
    assert (chosen is not None) is tuned
    if tuned:
        assert chosen == (point, pytest.approx(faster * 100e-6))


def test_a_damaged_database_is_one_warning_and_the_default_schedules(
        tmp_path: Path, options: kiln.Options) -> None:
    path = tmp_path / "t.sqlite"
    path.write_bytes(b"damaged" * 100)
    model, inputs = models.build("mlp", quick=True)
    tuned = kiln.Options(**{**options.__dict__, "tuning_db": str(path)})
    with pytest.warns(RuntimeWarning, match="default schedules"), torch.no_grad():
        compiled = kiln.compile(model, inputs, options=tuned)
        torch.testing.assert_close(compiled(*inputs), model(*inputs), rtol=1e-4, atol=1e-5)
    assert not any("tuned" in k.decision for k in compiled.report.kernels)
    assert path.read_bytes() == b"damaged" * 100


def test_row_kernels_share_one_workload_and_use_its_record(tmp_path: Path,
                                                          options: kiln.Options) -> None:
    from kiln.tune.measure import Runner
    from kiln.tune.space_groups import GroupSpace

    model, inputs = models.build("bert", quick=True)
    (rows,) = [w for w in model_workloads(model, inputs, options)
               if isinstance(w.space, GroupSpace) and w.space.kind == "rows"]
    assert len(rows.nodes) > 1  # every layer's residual add + layer norm: one workload
    space = rows.space
    point = {**space.default(), "lanes": 8, "parallel": not space.default()["parallel"]}
    with Runner(options, timeout_s=60, threads=1, budget_s=0.1) as runner:
        measured = runner.run_one(space, point)
    assert measured.ok, measured.error  # checked against the library calls, then timed
    target = Target.here(options, torch.get_num_threads())
    db = TuningDB.open(tmp_path / "t.sqlite")
    db.add(TuningRecord.measured(space.workload(), target, "rows",
                                 space.plan(point).trace.to_json(), point,
                                 measured.run_times, paired=0.9))
    tuned = kiln.Options(**{**options.__dict__, "tuning_db": str(tmp_path / "t.sqlite")})
    with torch.no_grad():
        compiled = kiln.compile(model, inputs, options=tuned)
        torch.testing.assert_close(compiled(*inputs), model(*inputs), rtol=1e-4, atol=1e-5)
    layer_norms = [k for k in compiled.report.kernels if k.ops[-1:] == ("layer_norm",)
                   and k.kind == "generated"]
    assert layer_norms and all("(tuned)" in k.decision for k in layer_norms)
    assert all("decision=8)" in k.trace for k in layer_norms)


def test_a_schedule_that_slows_its_model_down_is_dropped(tmp_path: Path,
                                                        options: kiln.Options,
                                                        monkeypatch) -> None:
    """`kiln.tune.validate`: a schedule faster alone is compiled into the model alone and
    the two builds' calls are alternated; the ratio is stored, and a compile keeps the
    schedule only where the model ran faster with it."""
    from kiln.tune.apply import tuned_schedule
    from kiln.tune.validate import check_in_model

    model, inputs = models.build("mlp", quick=True)
    workloads = model_workloads(model, inputs, options)
    space = workloads[0].space
    point = list(neighbours(space, space.default()))[-1]
    target = Target.here(options, torch.get_num_threads())
    db = _confirmed(tmp_path, space, target, point, 1.0, 0.5, 0.5)  # (most of the model)
    tuned = kiln.Options(**{**options.__dict__, "tuning_db": str(tmp_path / "t.sqlite")})
    (check,) = check_in_model(model, inputs, workloads, db, target, tuned)  # the others:
    assert check.workload is workloads[0] and 0 < check.ratio < 10  # no record, unchecked
    assert 40 <= check.pairs <= 300 and 0 <= check.faster_in <= check.pairs
    assert db.record(space_workload(space), target, point).in_model == check.ratio
    db.checked_in_model(space_workload(space), target, point, 1.02)  # slower with it
    assert tuned_schedule(space, tuned) is None
    compiled = []  # checked again, the schedule is in the model again, not left out
    compile_ = kiln.compile
    monkeypatch.setattr(kiln, "compile", lambda *a, **k: compiled.append(compile_(*a, **k))
                        or compiled[-1])
    check_in_model(model, inputs, workloads, db, target, tuned)
    assert any("(tuned)" in k.decision for k in compiled[-1].report.kernels)
    monkeypatch.undo()
    db.checked_in_model(space_workload(space), target, point, 1.02)
    db.checked_in_model(space_workload(space), target, point, 0.98)  # faster with it
    assert tuned_schedule(space, tuned) == (point, pytest.approx(0.5))
    small = _confirmed(tmp_path / "small", space, target, point, 1e-9, 0.5e-9, 0.5)
    small.checked_in_model(space_workload(space), target, point, 1.05)  # an earlier check
    assert check_in_model(model, inputs, workloads, small, target, tuned) == []  # too small
    assert small.record(space_workload(space), target, point).in_model is None
    assert tuned_schedule(space, kiln.Options(**{**options.__dict__, "tuning_db": str(
        tmp_path / "small" / "t.sqlite")})) == (point, pytest.approx(0.5e-9))


def test_the_checks_share_the_time_left_before_a_deadline(tmp_path: Path,
                                                         options: kiln.Options,
                                                         monkeypatch) -> None:
    """`ModelCheck.run`: each check takes about `CHECK_S` of calls where time allows, fewer
    where the deadline is near, and never fewer than `PAIRS`[0] pairs (a deadline passed
    gets those); `wanted` and `cost_s` are what `kiln tune` keeps time for."""
    from kiln.tune import validate
    from kiln.tune.validate import PAIRS, ModelCheck

    model, inputs = models.build("mlp", quick=True)
    workloads = model_workloads(model, inputs, options)
    space = workloads[0].space
    point = list(neighbours(space, space.default()))[-1]
    target = Target.here(options, torch.get_num_threads())
    db = _confirmed(tmp_path, space, target, point, 1.0, 0.5, 0.5)
    tuned = kiln.Options(**{**options.__dict__, "tuning_db": str(tmp_path / "t.sqlite")})
    check = ModelCheck(model, inputs, tuned)
    assert [check.wanted(w, db, target) for w in workloads] == [True, False, False]
    assert check.cost_s() > check.compile_s > 0
    compiled = []  # the untuned build the costs came from is not the one checked against:
    compile_ = validate._compile  # the check builds it anew, beside the tuned one
    monkeypatch.setattr(validate, "_compile", lambda *a: compiled.append(a[2].tuning_db)
                        or compile_(*a))
    (late,) = check.run(workloads, db, target, deadline=time.perf_counter())
    assert late.pairs == PAIRS[0]
    assert len(compiled) == 2 and compiled[0] == "" and compiled[1] != ""  # untuned, tuned
    monkeypatch.undo()
    (timely,) = check.run(workloads, db, target)  # (a call of the quick mlp: microseconds)
    assert timely.pairs == PAIRS[1] == check.pairs()
    # a schedule another model (checked before, in the same run) ran slower with: the
    # database keeps that model's verdict, and a compile drops the schedule for both
    worst = {(space_workload(space), json.dumps(point, sort_keys=True)): 1.5}
    (shared,) = check.run(workloads, db, target, worst=worst)
    assert shared.ratio < 1.5 and db.record(space_workload(space), target, point).in_model == 1.5
    assert list(worst.values()) == [1.5]
    worst.clear()
    (alone,) = check.run(workloads, db, target, worst=worst)
    assert db.record(space_workload(space), target, point).in_model == alone.ratio
    assert list(worst.values()) == [alone.ratio]
