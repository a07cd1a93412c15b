"""The design spaces of the channels-last window kernels (dense direct convolution, depthwise,
pooling): the heuristic is the default point, points replay from their traces and compute
what torch computes, candidates respect the registers and the guards, the runner measures
them on operands with the strides the kernel reads, and a compile uses a recorded point."""

from __future__ import annotations

import dataclasses
import random
from pathlib import Path

import pytest
import torch
from torch import nn

import kiln
from kiln.codegen.isa import Isa
from kiln.ir.ops import Op
from kiln.kernels.conv_config import ConvConfig, ConvShape
from kiln.kernels.conv_schedule import conv_plan
from kiln.kernels.depthwise_schedule import DepthwiseConfig, DepthwiseShape, depthwise_plan
from kiln.kernels.plan import Epilogue
from kiln.kernels.pool_schedule import PoolShape, pool_plan
from kiln.options import Options
from kiln.tir import interp
from kiln.tir.printer import print_func
from kiln.tune.apply import TUNED, tuned_or_default, tuned_schedule
from kiln.tune.db import Target, TuningDB, TuningRecord
from kiln.tune.space import neighbours, random_point
from kiln.tune.space_window import WindowSpace
from kiln.tune.workloads import model_workloads

RELU6 = Epilogue(Op.CLAMP, (0.0, 6.0))
CONV = ConvShape(1, 3, 17, 19, 40, (3, 3), (2, 2), (1, 1), bias=True)
DEPTHWISE = DepthwiseShape(1, 40, 11, 13, (3, 3), (1, 1), (1, 1), bias=True)
POOL = PoolShape(1, 24, 11, 13, (3, 3), (2, 2), (1, 1))


def _spaces(threads: int = 2) -> list[WindowSpace]:
    return [WindowSpace("conv", CONV, Isa.AVX512, threads, RELU6, "wconv"),
            WindowSpace("depthwise", DEPTHWISE, Isa.AVX512, threads, RELU6, "wdw"),
            WindowSpace("pool", POOL, Isa.AVX512, threads, None, "wpool")]


def test_the_heuristic_schedule_is_the_default_point() -> None:
    conv, depthwise, pool = _spaces()
    heuristic = [conv_plan(CONV, ConvConfig.default(CONV, 16, 32, 2), "wconv", RELU6),
                 depthwise_plan(DEPTHWISE, DepthwiseConfig.default(DEPTHWISE, 16), "wdw",
                                RELU6),
                 pool_plan(POOL, DepthwiseConfig.default(POOL, 16), "wpool")]  # type: ignore
    for space, plan in zip((conv, depthwise, pool), heuristic, strict=True):
        default = space.plan_config(space.config(space.default()))
        assert print_func(default.build()) == print_func(plan.build())


@pytest.mark.parametrize("kind", ["conv", "depthwise", "pool"])
def test_points_replay_from_their_trace_and_compute_what_torch_does(kind: str) -> None:
    space = next(s for s in _spaces() if s.kind == kind)
    rng = random.Random(7)
    for point in [space.default(), *(random_point(space, rng) for _ in range(3))]:
        plan = space.plan(point)
        assert plan.trace.decisions() == point
        operands, (expected,) = space.operands(point, torch.Generator().manual_seed(1))
        (got,) = interp.run_torch(plan.build(), operands[:-1])
        torch.testing.assert_close(got, expected, rtol=1e-4, atol=1e-4)
    assert all(n != space.default() for n in neighbours(space, space.default()))


def test_candidates_respect_registers_guards_and_threads() -> None:
    conv = _spaces()[0]
    assert conv.candidates("nr", {}) == (16, 32)  # 40 channels: one or two vectors
    guarded = conv.candidates("tile", {"nr": 32, "pad_copy": False, "rows": 1})
    assert max(guarded) == 8  # border versions of wider guarded tiles spill
    copied = conv.candidates("tile", {"nr": 32, "pad_copy": True, "rows": 1})
    assert max(copied) == 10  # the output row is 10 pixels: never wider
    unpadded = WindowSpace("conv", ConvShape(1, 3, 30, 30, 8, (3, 3), (1, 1), (0, 0)),
                           Isa.AVX512, 1)
    assert unpadded.candidates("nr", {}) == (16,)
    assert unpadded.candidates("pad_copy", {"nr": 16}) == (False,)
    assert unpadded.candidates("split_panels", {}) == (False,)  # one thread
    assert max(unpadded.candidates("tile", {"nr": 16, "pad_copy": False, "rows": 1})) == 28
    depthwise = _spaces()[1]
    assert max(depthwise.candidates("tile", {"lanes": 32})) <= 15  # 2 vectors a pixel
    # a narrower tile for the row's end only where whole ones of it end the row (10 pixels)
    assert conv.candidates("tail_tile", {"tile": 6}) == (0, 1, 2, 4)
    assert conv.candidates("tail_tile", {"tile": 5}) == (0,)
    avx2 = WindowSpace("conv", ConvShape(1, 64, 28, 28, 64, (3, 3), (1, 1), (1, 1)),
                       Isa.AVX2, 2)
    assert (avx2.default()["tile"], avx2.default()["tail_tile"]) == (6, 5)
    assert 5 in avx2.candidates("tail_tile", {"tile": 6})


def test_two_rows_a_tile_is_a_decision_and_the_full_rate_default() -> None:
    """Where 512-bit FMAs run at full rate the heuristic's two-row tile is the default point
    (its plan the heuristic's), one row a neighbour; two rows halve the widest tile."""
    shape = ConvShape(1, 64, 14, 14, 64, (3, 3), (1, 1), (1, 1))
    space = WindowSpace("conv", shape, Isa.AVX512, 2, RELU6, "wconv2", full_rate_512=True)
    point = space.default()
    assert point["rows"] == 2 and point["pad_copy"] and point["tile"] == 7
    heuristic = conv_plan(shape, ConvConfig.default(shape, 16, 32, 2, full_rate=True),
                          "wconv2", RELU6)
    assert print_func(space.plan_config(space.config(point)).build()) == \
        print_func(heuristic.build())
    assert space.candidates("rows", {"nr": 32, "pad_copy": True}) == (1, 2)
    assert max(space.candidates("tile", {"nr": 32, "pad_copy": True, "rows": 2})) == 7
    assert max(space.candidates("tile", {"nr": 32, "pad_copy": True, "rows": 1})) == 14
    assert any(n["rows"] == 1 for n in neighbours(space, point))
    one_row = WindowSpace("conv", ConvShape(1, 64, 1, 9, 64, (1, 3), (1, 1), (0, 1)),
                          Isa.AVX512, 2, full_rate_512=True)
    assert one_row.candidates("rows", {"nr": 32}) == (1,) and one_row.default()["rows"] == 1


def test_the_workload_is_the_program_kind_and_epilogue() -> None:
    conv, depthwise, pool = _spaces()
    assert len({conv.workload(), depthwise.workload(), pool.workload()}) == 3
    plain = WindowSpace("depthwise", DEPTHWISE, Isa.AVX512, 2, None, "other name")
    assert plain.workload() != depthwise.workload()
    assert WindowSpace("depthwise", DEPTHWISE, Isa.AVX512, 2, RELU6,
                       "other name").workload() == depthwise.workload()


def test_the_runner_measures_operands_with_the_kernels_strides(options: kiln.Options) -> None:
    from kiln.tune.measure import time_one

    # a network's first convolution reads the NCHW input in place (`conv.layout_prologue`)
    nchw = dataclasses.replace(CONV, x_strides=(3 * 17 * 19, 17 * 19, 19, 1))
    stem = WindowSpace("conv", nchw, Isa.AVX512, 2, RELU6, "wstem")
    # a basic block's second convolution adds the shortcut (a channels-last residual)
    shortcut = dataclasses.replace(CONV, residual=True)
    block = WindowSpace("conv", shortcut, Isa.AVX512, 2, RELU6, "wblock")
    for space in [*_spaces(), stem, block]:
        point = random_point(space, random.Random(2))
        result = time_one(space, point, options, threads=1, budget_s=0.05)
        assert result.error is None and result.run_times


def test_a_compile_uses_the_recorded_window_schedule(tmp_path: Path, options: kiln.Options,
                                                     monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr("kiln.passes.layout._measured_faster", lambda *a, **k: True)
    torch.manual_seed(0)
    model = nn.Sequential(nn.Conv2d(3, 24, 3, 2, 1), nn.ReLU6(),
                          nn.Conv2d(24, 24, 3, 1, 1, groups=24), nn.ReLU6(),
                          nn.MaxPool2d(3, 2, 1)).eval()
    inputs = (torch.randn(1, 3, 29, 31),)
    workloads = {w.space.kind: w for w in model_workloads(model, inputs, options)
                 if isinstance(w.space, WindowSpace)}
    assert set(workloads) == {"conv", "depthwise", "pool"}
    target = Target.here(options, torch.get_num_threads())
    db = TuningDB.open(tmp_path / "t.sqlite")
    points = {}
    for kind, workload in workloads.items():
        space = workload.space
        points[kind] = list(neighbours(space, space.default()))[-1]  # not the heuristic's
        db.add(TuningRecord.measured(space.workload(), target, kind,
                                     space.plan(points[kind]).trace.to_json(), points[kind],
                                     [1e-6], paired=0.5))
    tuned = kiln.Options(**{**options.__dict__, "tuning_db": str(tmp_path / "t.sqlite")})
    with torch.no_grad():
        compiled = kiln.compile(model, inputs, options=tuned)
        torch.testing.assert_close(compiled(*inputs), model(*inputs), rtol=1e-4, atol=1e-5)
    for kind, workload in workloads.items():
        (kernel,) = [k for k in compiled.report.kernels if k.nodes[-1:] == workload.nodes]
        assert kernel.decision.startswith("generated (tuned)"), kernel.decision
        assert all(f"sch.sample_categorical({name!r}, " in kernel.trace
                   for name in points[kind])


def test_a_record_from_before_the_tail_tile_decision_is_not_used(tmp_path: Path) -> None:
    """A convolution's record without ``tail_tile`` (written before the decision existed)
    no longer fits the space: the compile takes the default, it does not fail."""
    space = WindowSpace("conv", ConvShape(1, 64, 28, 28, 64, (3, 3), (1, 1), (1, 1)),
                        Isa.AVX2, 2, name="old_record")
    options = Options(tuning_db=str(tmp_path / "t.sqlite"))
    old = {k: v for k, v in space.default().items() if k != "tail_tile"}
    db = TuningDB.open(tmp_path / "t.sqlite")
    db.add(TuningRecord.measured(space.workload(), Target.here(options, torch.get_num_threads()),
                                 "conv", "[]", old, [1e-6], paired=0.5))
    assert tuned_schedule(space, options) is None
    plan, decisions = tuned_or_default(space, options)
    assert decisions == space.default() and TUNED not in plan.notes


def test_a_model_whose_weights_overflow_the_cache_has_streamed_workloads(
        options: kiln.Options, monkeypatch) -> None:
    """The tuner times a kernel as the compile's decision does (`kiln.kernels.streaming`):
    where a model's weights overflow the last-level cache, every kernel with 1 MiB of
    weights or more is timed cold, under a workload key of its own."""
    from kiln.kernels import streaming
    from kiln.tune.space import STREAMED

    model = nn.Sequential(nn.Linear(512, 640), nn.ReLU(), nn.Linear(640, 64)).eval()
    inputs = (torch.randn(8, 512),)  # weights: 1.25 MiB, then 0.16 MiB

    def spaces() -> dict[str, object]:
        return {w.label: w.space for w in model_workloads(model, inputs, options)}
    before = spaces()
    assert len(before) == 2 and not any(s.streamed for s in before.values())
    monkeypatch.setattr(streaming, "last_level_cache_bytes", lambda: 1 << 20)
    after = spaces()
    streamed = [label for label, s in after.items() if s.streamed]
    assert streamed == ["gemm 8x640x512 +bias, relu, B packed"]  # the small one stays hot
    assert after[streamed[0]].workload() == before[streamed[0]].workload() + STREAMED
